"""Runtime-V and Runtime-D on one trace, and candidate policies on one development trace.

Runtime-V (paper §3.4, Eq. 5) asks, for each bucket ``q`` (decode tag key × layer group, or
prompt span label × layer group) and action ``a ∈ {L, R}``: does degrading only ``q`` to ``a``
break this trace? Runtime-D asks how far it moves the attention outputs of ``q``'s layer group:
``Σ_u Σ_{ℓ∈c} max_h ‖o_ref − o_a‖²`` over the answer's query positions. Both come out of the
same teacher-forced batch (``teacher.py``): one row per probe plus the control row.

A trace whose recorded answer was wrong cannot be broken further; its probes are not run (the
task-error change is counted as zero), which is also what makes V cheap.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pask_agent.calibration.interventions import Interventions
from pask_agent.calibration.replay import ReplayedTrace
from pask_agent.calibration.teacher import H, L, R, TraceContext
from pask_agent.grammars.tags import SPAN_LABELS

STAGES = ("decode", "prefill")
ACTIONS = {"L": L, "R": R}


def probe_name(stage: str, bucket: int, group: int, action: str) -> str:
    return f"{stage}:{bucket}:{group}:{action}"


@dataclass
class TraceMeasurement:
    """Runtime-V/D of one calibration trace, in a form a checkpoint line can hold.

    ``flipped`` and ``distortion`` are keyed by :func:`probe_name`; probes that cannot change
    anything (the bucket has no token that ever leaves the recent window) are absent and count
    as zero. ``margin`` holds, for each probe that was replayed, how far its verdict is from
    the other one in logits (``ReplayOutcome.margin``: positive for a flip); an L probe that
    was counted harmless without a replay has none. ``decode_tokens`` / ``prefill_tokens``
    count the trace's tokens per bucket.
    """

    trace_id: str
    ok: bool
    decode_tokens: list[int]
    prefill_tokens: list[int]
    flipped: dict[str, bool] = field(default_factory=dict)
    distortion: dict[str, float] = field(default_factory=dict)
    margin: dict[str, float] = field(default_factory=dict)
    stable_fraction: float = 1.0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "trace_id": self.trace_id,
            "ok": self.ok,
            "decode_tokens": self.decode_tokens,
            "prefill_tokens": self.prefill_tokens,
            "flipped": [k for k, v in self.flipped.items() if v],
            "distortion": {k: round(v, 6) for k, v in self.distortion.items()},
            "margin": {k: round(v, 4) for k, v in self.margin.items()},
            "stable_fraction": round(self.stable_fraction, 4),
            "seconds": round(self.seconds, 3),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TraceMeasurement:
        return cls(
            trace_id=data["trace_id"],
            ok=data["ok"],
            decode_tokens=list(data["decode_tokens"]),
            prefill_tokens=list(data["prefill_tokens"]),
            flipped=dict.fromkeys(data["flipped"], True),
            distortion=dict(data["distortion"]),
            margin=dict(data.get("margin", {})),  # absent from checkpoints before issue 34
            stable_fraction=data["stable_fraction"],
            seconds=data["seconds"],
        )


def trace_counts(
    tr: ReplayedTrace, decode_bucket: np.ndarray, num_decode: int, *, sinks: int, window: int
) -> TraceMeasurement:
    """The trace's tokens per decode bucket and per (unshielded) prompt label; no probes."""
    free = unshielded_prompt(tr.prompt_len, sinks, window)
    return TraceMeasurement(
        tr.trace_id,
        tr.ok,
        np.bincount(decode_bucket, minlength=num_decode).tolist(),
        np.bincount(tr.prompt_labels[free], minlength=len(SPAN_LABELS)).tolist(),
    )


def measure_trace(
    ctx: TraceContext,
    decode_bucket: np.ndarray,
    num_decode: int,
    *,
    only: tuple[str, int] | None = None,
) -> TraceMeasurement:
    """Run every single-bucket probe of one (correct) trace; counts only for a wrong one.

    ``only``: the one ``(stage, layer group)`` whose probes to run (a check of one batch);
    None runs them all.
    """
    started = time.perf_counter()
    tr = ctx.trace
    n_p, n_t, w = tr.prompt_len, tr.output_len, ctx.window
    out = trace_counts(tr, decode_bucket, num_decode, sinks=ctx.sinks, window=w)
    free = unshielded_prompt(n_p, ctx.sinks, w)
    if not tr.ok:
        out.seconds = time.perf_counter() - started
        return out
    # Decode probes: a token can only matter once a later query sees it outside the window.
    reach = np.arange(n_t) + w + 1  # first query position that sees token j degraded
    visible = reach <= n_t - 1
    present = sorted({int(b) for b in decode_bucket[visible]})
    decode_rows = {b: decode_bucket == b for b in present}
    first = int(reach[visible].min()) if visible.any() else n_t
    prompt_rows = {
        lab: free & (tr.prompt_labels == lab)
        for lab in sorted({int(x) for x in tr.prompt_labels[free]})
    }
    for stage, masks, width in (("decode", decode_rows, n_t), ("prefill", prompt_rows, n_p)):
        for c in range(3):
            if masks and only in (None, (stage, c)):
                _probe_group(ctx, out, stage, c, masks, width, first if stage == "decode" else 0)
    out.stable_fraction = ctx.stable_fraction
    out.seconds = time.perf_counter() - started
    return out


def _probe_group(
    ctx: TraceContext,
    out: TraceMeasurement,
    stage: str,
    group: int,
    masks: dict[int, np.ndarray],
    width: int,
    first: int,
) -> None:
    """All probes of one stage in one layer group.

    Runtime-D for every probe comes from the fixed reference trajectory (attention only).
    Runtime-V replays R for every bucket; L is replayed only where it could break what R did
    not: where R broke the trace, or where INT4 distorts this group more than releasing does
    (low layers with outlier keys). Elsewhere L, a milder change than R, is counted as
    harmless too.
    """

    def modes(action: int, buckets: list[int]) -> np.ndarray:
        rows = np.full((len(buckets) + 1, 3, width), H, np.int8)
        for i, b in enumerate(buckets, 1):
            rows[i, group, masks[b]] = action
        return rows

    def batch(rows: np.ndarray) -> Interventions:
        start = ctx.parts.groups.layers_of(group)[0]
        if stage == "decode":
            return Interventions(None, rows, start, first)
        return Interventions(rows, None, start, 0)

    buckets = sorted(masks)
    for a_name, a in ACTIONS.items():
        rows = modes(a, buckets)
        pm, om = (None, rows) if stage == "decode" else (rows, None)
        for b, d in zip(buckets, ctx.local_distortion(group, pm, om)[1:], strict=True):
            out.distortion[probe_name(stage, b, group, a_name)] = float(d)
    outcome = ctx.run(batch(modes(R, buckets)))
    released = outcome.flipped[1:]
    for b, f, m in zip(buckets, released, outcome.margin[1:], strict=True):
        out.flipped[probe_name(stage, b, group, "R")] = bool(f)
        out.margin[probe_name(stage, b, group, "R")] = float(m)
    suspect = [
        b
        for b, f in zip(buckets, released, strict=True)
        if f
        or out.distortion[probe_name(stage, b, group, "L")]
        > out.distortion[probe_name(stage, b, group, "R")]
    ]
    for b in buckets:
        out.flipped[probe_name(stage, b, group, "L")] = False
    if suspect:
        outcome = ctx.run(batch(modes(L, suspect)))
        for b, f, m in zip(suspect, outcome.flipped[1:], outcome.margin[1:], strict=True):
            out.flipped[probe_name(stage, b, group, "L")] = bool(f)
            out.margin[probe_name(stage, b, group, "L")] = float(m)


def probe_verdict(
    ctx: TraceContext, decode_bucket: np.ndarray, stage: str, bucket: int, group: int, action: str
) -> tuple[bool, float]:
    """Runtime-V's verdict for one probe on one trace and its margin (what
    :func:`measure_trace` records for it), replayed alone: used to re-score stored pairs when
    the flip rule changes. Alone and batched, the verdicts agree up to rounding: where the
    margin is a near-tie, the batch's shape may decide it (``ReplayOutcome.margin``)."""
    tr = ctx.trace
    n_t, w = tr.output_len, ctx.window
    a = ACTIONS[action]
    start = ctx.parts.groups.layers_of(group)[0]
    if stage == "decode":
        rows = np.full((2, 3, n_t), H, np.int8)
        hit = decode_bucket == bucket
        rows[1, group, hit] = a
        reach = np.arange(n_t) + w + 1
        first = int(reach[hit].min()) if hit.any() else n_t
        batch = Interventions(None, rows, start, min(first, n_t))
    else:
        free = unshielded_prompt(tr.prompt_len, ctx.sinks, w)
        rows = np.full((2, 3, tr.prompt_len), H, np.int8)
        rows[1, group, free & (tr.prompt_labels == bucket)] = a
        batch = Interventions(rows, None, start, 0)
    outcome = ctx.run(batch)
    return bool(outcome.flipped[1]), float(outcome.margin[1])


def unshielded_prompt(n_p: int, sinks: int, window: int) -> np.ndarray:
    free = np.ones(n_p, dtype=bool)
    free[:sinks] = False
    free[max(0, n_p - window) :] = False
    return free


def evaluate_candidates(
    ctx: TraceContext,
    decode_bucket: np.ndarray,
    decode_maps: Sequence[np.ndarray] = (),
    prompt_plans: Sequence[np.ndarray] = (),
    *,
    chunk: int = 32,
) -> tuple[list[bool], list[bool]]:
    """Which candidate policies break this development trace.

    ``decode_maps[i]``: ``int8 [buckets, 3]`` action per decode bucket and group (prompt all
    H); ``prompt_plans[i]``: ``uint8 [P, 3]`` planned prompt actions (answer all H).
    """
    tr = ctx.trace
    n_t, w = tr.output_len, ctx.window
    if not tr.ok:
        return [False] * len(decode_maps), [False] * len(prompt_plans)
    decode_flips: list[bool] = []
    for start in range(0, len(decode_maps), chunk):
        maps = decode_maps[start : start + chunk]
        rows = [np.full((3, n_t), H, np.int8)] + [m[decode_bucket].T.astype(np.int8) for m in maps]
        modes = np.stack(rows)
        degraded = (modes < H).any(axis=(0, 1))
        if not degraded.any():
            decode_flips += [False] * len(maps)
            continue
        first = int(np.argmax(degraded)) + w + 1
        low_group = int(np.argmax((modes < H).any(axis=(0, 2))))
        batch = Interventions(None, modes, ctx.parts.groups.layers_of(low_group)[0], first)
        decode_flips += ctx.run(batch).flipped[1:].tolist()
    prompt_flips: list[bool] = []
    for start in range(0, len(prompt_plans), chunk):
        plans = prompt_plans[start : start + chunk]
        rows = [np.full((3, tr.prompt_len), H, np.int8)] + [p.T.astype(np.int8) for p in plans]
        modes = np.stack(rows)
        low_group = int(np.argmax((modes < H).any(axis=(0, 2))))
        batch = Interventions(modes, None, ctx.parts.groups.layers_of(low_group)[0], 0)
        prompt_flips += ctx.run(batch).flipped[1:].tolist()
    return decode_flips, prompt_flips
