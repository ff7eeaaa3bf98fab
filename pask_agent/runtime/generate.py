"""A batched greedy generation loop over the KV store (the Foundation's reference loop).

Prompts of different lengths prefill together in one packed step; then every live sequence
decodes one token per step. Each token gets a uniform per-group action, executed by the store
when the token leaves the recent window. The async engine builds on the same three calls
(``begin_step`` → ``forward_step`` → ``end_step``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pask_agent.policy.actions import Action
from pask_agent.runtime.kv_store import KVReport, KVStore
from pask_agent.runtime.seam import PaskCache, forward_step, use_pask_attention


@dataclass(frozen=True, slots=True)
class Generation:
    """One sequence's new tokens, and its KV bytes at the end of generation."""

    token_ids: tuple[int, ...]
    kv: KVReport
    step_logits: tuple[torch.Tensor, ...] | None  # [V] per step, when asked (parity checks)


def stop_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    eos = getattr(model.generation_config, "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else ([eos] if eos is not None else []))
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


@torch.inference_mode()
def greedy_generate(
    model: Any,
    store: KVStore,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    stop_ids: frozenset[int] = frozenset(),
    action: Action = Action.H,
    keep_logits: bool = False,
) -> list[Generation]:
    """Greedy-decode every prompt, batched, through ``store``; all tokens get ``action``."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    use_pask_attention(model)
    cache = PaskCache(store)
    device = next(model.parameters()).device
    ids = [f"gen-{id(store)}-{i}" for i in range(len(prompts))]
    acts = (action,) * 3
    for sid, prompt in zip(ids, prompts, strict=True):
        store.add_sequence(sid)
        store.schedule_many(sid, 0, [acts] * len(prompt))
    out: list[list[int]] = [[] for _ in prompts]
    logs: list[list[torch.Tensor]] = [[] for _ in prompts]
    live = list(range(len(prompts)))
    chunks = [(ids[i], len(prompts[i])) for i in live]
    tokens = torch.tensor([t for p in prompts for t in p], dtype=torch.int64, device=device)
    try:
        for _ in range(max_new_tokens):
            step = store.begin_step(chunks)
            logits = forward_step(model, cache, step, tokens)
            store.end_step(step)
            picks = logits.argmax(dim=-1).tolist()
            next_live = []
            for row, i in enumerate(live):
                if keep_logits:
                    logs[i].append(logits[row].clone())
                if picks[row] in stop_ids:
                    continue
                out[i].append(picks[row])
                store.schedule(ids[i], store.length(ids[i]), acts)
                next_live.append(i)
            live = next_live
            if not live:
                break
            chunks = [(ids[i], 1) for i in live]
            tokens = torch.tensor([out[i][-1] for i in live], dtype=torch.int64, device=device)
        return [
            Generation(tuple(out[i]), store.report(ids[i]), tuple(logs[i]) if keep_logits else None)
            for i in range(len(prompts))
        ]
    finally:
        for sid in ids:
            if store.has_sequence(sid):
                store.remove_sequence(sid)
