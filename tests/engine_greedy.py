"""Greedy decoding through ``Engine.step`` (the loop users run) for the store and parity tests.

Prompts of different lengths are queued together, so they prefill in one packed step and then
decode one token each per step, exactly as the runtime serves them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pask_agent.policy.actions import Action
from pask_agent.policy.uniform import UniformPolicy
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.engine import Engine
from pask_agent.runtime.models.loading import LoadedModel
from pask_agent.runtime.requests import Failed, Request, SamplingParams
from pask_agent.runtime.turns.outputs import TEXT
from pask_agent.runtime.turns.results import Finished


def tiny_loaded(model: Any, tokenizer: Any) -> LoadedModel:
    """A bare transformers model (the tiny random Qwen2) with a tokenizer, as the engine takes."""
    return LoadedModel("tiny-qwen2", Path("."), model, tokenizer)


def greedy(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    action: Action = Action.H,
    keep_logits: bool = False,
) -> list[Finished]:
    """Greedy-decode every prompt, batched; every token gets ``action`` in all groups."""
    policy = UniformPolicy(action)
    params = SamplingParams(max_new_tokens=max_new_tokens)
    requests = [
        Request(list(p), None, TEXT, params, engine.new_sequence(policy.start()), policy)
        for p in prompts
    ]
    for r in requests:
        r.keep_logits = keep_logits
    ends = engine.run(requests)
    for end in ends:
        if isinstance(end, Failed):
            raise end.error
    return ends  # type: ignore[return-value]


def engine_for(
    loaded: LoadedModel,
    *,
    sinks: int = 4,
    window: int = 16,
    prefill_chunk_tokens: int = 256,
    attention_backend: str = "auto",
    center_keys: bool = True,
) -> Engine:
    return Engine(
        loaded,
        RuntimeConfig(
            sinks=sinks,
            window=window,
            prefill_chunk_tokens=prefill_chunk_tokens,
            attention_backend=attention_backend,
            center_keys=center_keys,
        ),
    )
