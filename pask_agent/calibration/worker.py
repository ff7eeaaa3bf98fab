"""The unit of calibration work: one trace, replayed under a batch of interventions.

A ``ReplayWorker`` holds one model copy. The calibrator runs one in process, several in local
processes (``--workers``), or one per Ray actor (``--ray``); each task names a trace by its
file and line, so only small values cross process boundaries and every way of running gives
the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pask_agent.calibration.buckets import DecodeKeys
from pask_agent.calibration.measure import (
    evaluate_candidates,
    measure_trace,
    probe_verdict,
    trace_counts,
)
from pask_agent.calibration.model_parts import ModelParts
from pask_agent.calibration.replay import TraceReplayer
from pask_agent.calibration.teacher import TraceContext
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.planner import PrefillPlanner
from pask_agent.record.traces import Trace

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass(frozen=True)
class WorkerSpec:
    """What every worker needs to build the same replay: model, dtype, store protection."""

    model: str
    dtype: str
    sinks: int
    window: int
    continue_calls_at: float | None
    threads: int = 0  # torch threads; 0 leaves torch's default


@dataclass(frozen=True)
class PrefillCandidates:
    """Prompt-side candidates: each one's floors and upgrade priorities, and the prompt
    budgets ``B_P`` to plan each at (a list per trace: one per candidate row)."""

    floors: tuple[np.ndarray, ...]  # int8 [labels, 3] per candidate
    priorities: tuple[np.ndarray, ...]  # [labels, 3, 2] per candidate
    budgets: tuple[float, ...]  # one per level
    rows: tuple[tuple[int, int], ...]  # (candidate index, level index) per candidate row


class ReplayWorker:
    """Loads the model once and answers measurement and evaluation requests for traces."""

    def __init__(self, spec: WorkerSpec) -> None:
        from pask_agent.runtime.logit_masks import LogitMasks
        from pask_agent.runtime.models.loading import load_model

        if spec.threads:
            torch.set_num_threads(spec.threads)
        loaded = load_model(spec.model, dtype=DTYPES[spec.dtype])
        self.spec = spec
        self.tokenizer = loaded.tokenizer
        self.parts = ModelParts.of(loaded.model, key_offsets=loaded.key_offsets)
        vocab = int(loaded.model.config.vocab_size)
        self.replayer = TraceReplayer(loaded.tokenizer, vocab)
        # the server's own token-id facts: stop tokens and the parallel-call separators
        masks = LogitMasks(loaded.tokenizer, vocab, spec.continue_calls_at)
        self._next_ids, self._close_ids = masks.separator_ids
        self._stop = masks.stop_ids
        cfg = loaded.model.config
        self.costs = PayloadCosts.from_dims(
            cfg.num_hidden_layers, cfg.num_key_value_heads, self.parts.head_dim
        )
        self._texts: dict[int, str] = {}
        self._contexts: dict[str, TraceContext] = {}

    def _text(self, token: int) -> str:
        if token not in self._texts:
            self._texts[token] = self.tokenizer.decode([token])
        return self._texts[token]

    def context(self, trace: Trace, where: str, *, keep: bool = False) -> TraceContext:
        if where in self._contexts:
            return self._contexts[where]
        replayed = self.replayer.replay(trace, where=where)
        ctx = TraceContext(
            self.parts,
            replayed,
            sinks=self.spec.sinks,
            window=self.spec.window,
            continue_calls_at=self.spec.continue_calls_at,
            next_call_ids=self._next_ids,
            close_ids=self._close_ids,
            token_text=self._text,
            stop_ids=self._stop,
        ).build()
        if keep:
            self._contexts[where] = ctx
        return ctx

    def measure(self, trace: Trace, where: str, keys: DecodeKeys) -> dict[str, Any]:
        """Runtime-V/D of one calibration trace (a checkpoint line's payload)."""
        if not trace.ok:  # nothing to break: counts only, no forward pass
            replayed = self.replayer.replay(trace, where=where)
            counts = trace_counts(
                replayed, keys.of_trace(replayed), keys.size,
                sinks=self.spec.sinks, window=self.spec.window,
            )  # fmt: skip
            return counts.to_json()
        ctx = self.context(trace, where)
        result = measure_trace(ctx, keys.of_trace(ctx.trace), keys.size)
        return result.to_json()

    def probe(self, trace: Trace, where: str, keys: DecodeKeys, name: str) -> tuple[bool, float]:
        """Runtime-V's verdict for one probe (``stage:bucket:group:L|R``) on one trace, and
        its margin in logits (``measure.probe_verdict``)."""
        stage, bucket, group, action = name.split(":")
        ctx = self.context(trace, where, keep=True)
        return probe_verdict(ctx, keys.of_trace(ctx.trace), stage, int(bucket), int(group), action)

    def evaluate(
        self,
        trace: Trace,
        where: str,
        keys: DecodeKeys,
        decode_maps: list[np.ndarray],
        prefill: PrefillCandidates | None,
        prompt_budgets: list[float] | None = None,
    ) -> dict[str, Any]:
        """Which candidates break one development trace.

        ``prompt_budgets`` overrides ``prefill.budgets`` with this trace's own ``B_P`` per
        level (the runtime solves ``B_P`` per request from the total budget).
        """
        if not trace.ok:
            return {"decode": [False] * len(decode_maps),
                    "prefill": [False] * (len(prefill.rows) if prefill else 0)}  # fmt: skip
        ctx = self.context(trace, where, keep=True)
        plans = []
        if prefill is not None:
            budgets = prompt_budgets or list(prefill.budgets)
            for cand, level in prefill.rows:
                planner = PrefillPlanner.from_arrays(
                    prefill.floors[cand], prefill.floors[cand], prefill.priorities[cand],
                    self.costs,
                    budget=min(1.0, max(0.0, budgets[level])), sinks=self.spec.sinks,
                    window=self.spec.window,
                )  # fmt: skip
                plans.append(planner.plan_indices(ctx.trace.prompt_labels).actions)
        dec, pre = evaluate_candidates(ctx, keys.of_trace(ctx.trace), decode_maps, plans)
        return {"decode": dec, "prefill": pre}
