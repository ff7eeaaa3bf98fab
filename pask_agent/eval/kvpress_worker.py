"""The side-venv half of ``eval/kvpress_peer.py``: NVIDIA kvpress's presses on our BFCL turns.

Runs only in ``.peers/kvpress/venv`` (``make peer-kvpress``: kvpress 0.5.5, transformers<5.3,
this repo without its dependencies), as ``python -m pask_agent.eval.kvpress_worker JOB.json``.
The job names the model folder, the cases and the (press, budget) runs; one JSON line per run
and case goes to stdout as it finishes, and the driver in the main venv scores it.

Per case, what our runtime does for the same turn, except where the KV cache lives:

1. the prompt and the output grammar come from ``runtime/turns/prompting.prepare_turn`` (the
   same chat template rendering, tool grammar, ``tool_choice="required"`` and parallel calls only
   in the parallel categories as ``BfclCase.request()`` asks);
2. the whole prompt is prefilled in one forward of the transformers model, inside the press's
   context manager (``with press(model)``), into a ``DynamicCache`` whose layers store K/V
   rounded to BF16 values (our store's high pool is BF16; the model computes in fp32 as ours
   does); kvpress's forward hooks compress the prompt's cache as each layer finishes
   (``KVzipPress`` scores by replaying the context when its block exits and masks what it drops);
3. greedy decoding over that cache, one token per forward at the logical position
   ``prompt_len + i`` (as kvpress's own pipeline does after compressing), each step's logits
   masked by ``runtime/logit_masks.LogitMasks`` (xgrammar's token mask, the control-token ban,
   the parallel-call continuation rule at ``RuntimeConfig().continue_calls_at``) and every
   token fed to the same ``Constraint`` (matcher + tagger) the engine uses.

This is a second decode loop beside ``Engine.step`` on purpose: kvpress works on transformers'
cache and hooks, not on our store, so its presses can only run here.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from pask_agent.eval.splits import cases_in
from pask_agent.grammars.token_text import TokenTextStream
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.logit_masks import LogitMasks
from pask_agent.runtime.models.loading import load_model
from pask_agent.runtime.requests import SamplingParams
from pask_agent.runtime.turns.constraint import Constraint
from pask_agent.runtime.turns.outputs import OutputCompiler
from pask_agent.runtime.turns.prompting import PreparedTurn, prepare_turn
from pask_agent.runtime.turns.sampling import sample


def prompt_digest(ids: list[int]) -> str:
    """SHA-256 of a prompt's token ids, so the driver can check both venvs built one prompt."""
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()


class Bf16Layer(DynamicLayer):
    """A ``DynamicLayer`` that keeps K/V rounded to BF16 values (stored as the model's dtype).

    The step's own K/V are attended unrounded, as our store attends the chunk it is writing;
    what stays for later steps is what a BF16 pool would hold.
    """

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys = torch.cat([self.keys, key_states], dim=-2)
        values = torch.cat([self.values, value_states], dim=-2)
        self.keys = torch.cat([self.keys, _bf16(key_states)], dim=-2)
        self.values = torch.cat([self.values, _bf16(value_states)], dim=-2)
        return keys, values


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(x.dtype)


class Bf16Cache(DynamicCache):
    """A ``DynamicCache`` of ``Bf16Layer``s (kvpress reads and rewrites ``layers[i].keys``)."""

    def __init__(self) -> None:
        Cache.__init__(self, layer_class_to_replicate=Bf16Layer)


@dataclass(frozen=True, slots=True)
class _Sampling:
    """What ``LogitMasks.apply`` reads of a request: its constraint and sampling settings."""

    constraint: Constraint
    params: SamplingParams


@dataclass(frozen=True, slots=True)
class Model:
    """The loaded model, its tokenizer, our output compiler and logit masks for it."""

    model: Any
    tokenizer: Any
    outputs: OutputCompiler
    masks: LogitMasks

    @classmethod
    def load(cls, folder: str) -> Model:
        loaded = load_model(folder)  # a model folder: no bundled-package fingerprinting here
        vocab = int(loaded.model.config.vocab_size)
        masks = LogitMasks(loaded.tokenizer, vocab, RuntimeConfig().continue_calls_at)
        return cls(loaded.model, loaded.tokenizer, OutputCompiler(loaded.tokenizer, vocab), masks)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(layers, KV heads, head dim)."""
        cfg = self.model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim


def make_press(press_class: str | None, compression_ratio: float) -> Any:
    """``kvpress.<press_class>(compression_ratio=...)`` with its other settings at kvpress's
    defaults; None (Full KV, no press) for no class."""
    if press_class is None:
        return None
    import kvpress

    return getattr(kvpress, press_class)(compression_ratio=compression_ratio)


def kept_prompt_entries(m: Model, cache: Cache) -> int:
    """(token, KV head) entries the cache holds across layers, less those KVzip masks (its
    compression keeps them in memory and hides them from attention; a real one drops them)."""
    total = 0
    for i, layer in enumerate(cache.layers):
        total += int(layer.keys.shape[1] * layer.keys.shape[2])  # [1, H, T, D]
        masked = getattr(m.model.model.layers[i].self_attn, "masked_key_indices", None)
        if masked is not None:
            total -= len(masked[0])
    return total


@torch.inference_mode()
def answer(m: Model, turn: PreparedTurn, press: Any, max_new_tokens: int) -> dict[str, Any]:
    """Prefill ``turn``'s prompt under ``press`` and decode greedily under its grammar."""
    for layer in m.model.model.layers:
        layer.self_attn.masked_key_indices = None  # left by a KVzip run on an earlier case
    n = len(turn.prompt_ids)
    cache = Bf16Cache()
    start = time.perf_counter()
    with press(m.model) if press is not None else nullcontext():
        out = m.model(
            input_ids=torch.tensor([turn.prompt_ids]), past_key_values=cache, use_cache=True,
            logits_to_keep=1,
        )  # fmt: skip
    kept = kept_prompt_entries(m, cache)
    row = _Sampling(turn.spec.start(), SamplingParams(max_new_tokens))
    stream = TokenTextStream(m.tokenizer)
    logits = out.logits[:, -1].float()  # [1, V]
    generated: list[int] = []
    text, reason, first = "", "length", 0.0
    while True:
        m.masks.apply(logits, [(0, row)])
        token = sample(logits[0], temperature=0.0, top_p=1.0, generator=None)
        first = first or time.perf_counter()
        if token in m.masks.stop_ids:
            reason = "stop"
            break
        if not row.constraint.accept(token):
            raise RuntimeError(f"grammar rejected token {token} that its own mask allowed")
        piece = stream.push(token)
        row.constraint.tag(piece)  # the tagger drives the parallel-call continuation rule
        generated.append(token)
        text += piece
        if row.constraint.is_terminated():
            reason = "stop"
            break
        if len(generated) >= max_new_tokens:
            break
        position = torch.tensor([[n + len(generated) - 1]])  # logical, not the kept length
        out = m.model(
            input_ids=torch.tensor([[token]]), past_key_values=cache, position_ids=position,
            use_cache=True,
        )  # fmt: skip
        logits = out.logits[:, -1].float()
    end = time.perf_counter()
    layers, heads, head_dim = m.shape
    return {
        "prompt_tokens": n,
        "prompt_sha256": prompt_digest(turn.prompt_ids),
        "token_ids": generated,
        "text": text,
        "reason": reason,
        "kept_prompt_entries": kept,
        "layers": layers,
        "kv_heads": heads,
        "head_dim": head_dim,
        "ttft_s": round(first - start, 4),
        "tpot_s": round((end - first) / max(1, len(generated) - 1), 4),
        "seconds": round(end - start, 3),
    }


def job_cases(job: dict[str, Any]) -> dict[str, Any]:
    """The job's cases by id: the same selection (split, first n per category after the
    skipped ones) the main venv scored from."""
    return {c.id: c for c in cases_in(
        job["split"], per_category=job["per_category"], categories=job["categories"],
        skip_per_category=job.get("skip_per_category", 0),
    )}  # fmt: skip


def run_job(job: dict[str, Any], emit: Any) -> None:
    """Every run of the job over its cases; ``emit(record)`` for each as it finishes."""
    m = Model.load(job["model_dir"])
    cases = job_cases(job)
    for run in job["runs"]:
        press = make_press(run["press_class"], run["compression_ratio"])
        for case_id in run["case_ids"]:
            request = cases[case_id].request()
            turn = prepare_turn(
                m.tokenizer, m.outputs, request["messages"], request["tools"],
                request["tool_choice"], request["parallel_tool_calls"], labels=False,
            )  # fmt: skip
            record = {"press": run["press"], "budget": run["budget"], "id": case_id}
            try:
                record |= answer(m, turn, press, job["max_new_tokens"])
            except (AssertionError, RuntimeError, ValueError, IndexError) as exc:
                # kvpress checks its inputs with assert; the row records why it failed
                record |= {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            emit(record)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m pask_agent.eval.kvpress_worker JOB.json", file=sys.stderr)
        return 2
    job = json.loads(Path(args[0]).read_text(encoding="utf-8"))

    def emit(record: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()

    run_job(job, emit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
