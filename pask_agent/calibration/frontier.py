"""From measurements to candidate policies: floors per threshold pair and the greedy upgrade
path (paper §3.4, App. A.4, E.2).

* ``Sensitivity`` holds Runtime-V (with the monotone envelope of Eq. 5) and Runtime-D per
  bucket × layer group × action, aggregated over the calibration traces.
* A threshold pair ``(τ_high, τ_low)`` gives the floors: ``H`` where degrading to ``L`` costs
  more than ``τ_high`` of the traces, else ``L`` where releasing costs more than ``τ_low``,
  else ``R``.
* From the floors, ``greedy_path`` applies one adjacent upgrade (R→L or L→H) at a time, the
  one with the largest distortion reduction per byte of reference payload, ties in the
  serialized bucket/action order, until everything is ``H``. Each prefix is a candidate; its
  nominal cost on fixed reference trajectories never decreases along the path (App. E.2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pask_agent.calibration.measure import TraceMeasurement, probe_name
from pask_agent.calibration.teacher import H, L, R
from pask_agent.policy.costs import PayloadCosts

THRESHOLD_PAIRS: tuple[tuple[float, float], ...] = (
    (0.0, 0.0),
    (0.0, 0.01),
    (0.01, 0.01),
    (0.01, 0.02),
    (0.02, 0.02),
    (0.02, 0.05),
    (0.05, 0.05),
)


@dataclass(frozen=True)
class Sensitivity:
    """V̄ and D for one stage: arrays ``[buckets, 3 groups, 3 actions]`` indexed by Action
    (``H`` entries are 0), the calibration token count per bucket, and the trace count."""

    v: np.ndarray
    d: np.ndarray
    tokens: np.ndarray
    traces: int

    @classmethod
    def aggregate(
        cls, measurements: Sequence[TraceMeasurement], stage: str, buckets: int
    ) -> Sensitivity:
        flips = np.zeros((buckets, 3, 3))
        dist = np.zeros((buckets, 3, 3))
        tokens = np.zeros(buckets)
        for m in measurements:
            counts = m.decode_tokens if stage == "decode" else m.prefill_tokens
            tokens[: len(counts)] += counts
            for b in range(buckets):
                for c in range(3):
                    for name, a in (("L", L), ("R", R)):
                        key = probe_name(stage, b, c, name)
                        flips[b, c, a] += m.flipped.get(key, False)
                        dist[b, c, a] += m.distortion.get(key, 0.0)
        n = max(1, len(measurements))
        raw = flips / n
        v = np.zeros_like(raw)
        v[..., L] = np.maximum(0.0, raw[..., L])  # Eq. 5: the monotone envelope
        v[..., R] = np.maximum(v[..., L], raw[..., R])
        return cls(v, dist / n, tokens, len(measurements))

    @property
    def buckets(self) -> int:
        return int(self.v.shape[0])

    def floors(self, tau_high: float, tau_low: float) -> np.ndarray:
        """``int8 [buckets, 3]`` protection floors for one threshold pair."""
        floor = np.full(self.v.shape[:2], R, np.int8)
        floor[self.v[..., R] > tau_low] = L
        floor[self.v[..., L] > tau_high] = H
        return floor

    def upgrade_scores(self, costs: PayloadCosts) -> np.ndarray:
        """``[buckets, 3, 2]``: distortion reduction per byte of R→L and of L→H.

        Bytes are the bucket's calibration tokens times the move's payload per token, so a
        frequent bucket must buy back more distortion to be promoted first.
        """
        m = np.asarray(costs.bytes_by_group, dtype=np.float64)  # [3, 3] by Action
        scores = np.zeros((self.buckets, 3, 2))
        tokens = np.maximum(self.tokens, 1.0)[:, None]
        scores[..., 0] = (self.d[..., R] - self.d[..., L]) / (tokens * (m[:, L] - m[:, R]))
        scores[..., 1] = self.d[..., L] / (tokens * (m[:, H] - m[:, L]))
        return scores


def breadth_first(scores: np.ndarray) -> np.ndarray:
    """The same upgrade order within each move, but every R→L before any L→H.

    Distortion per byte can rank a whole layer group's R→L last (INT4 of low layers' outlier
    keys distorts attention more than dropping the key does), so a tight prompt budget drops
    that group entirely while others are raised to BF16. This order keeps every token at
    least INT4 before anything is held in BF16, and drops first what distortion ranks last;
    development traces decide between it and :meth:`Sensitivity.upgrade_scores`.
    """
    out = np.zeros_like(scores, dtype=np.float64)
    for move, offset in ((0, 1.0), (1, 0.0)):
        s = scores[..., move]
        top = float(np.abs(s).max()) if s.size else 0.0
        out[..., move] = offset + (s / (2 * top) if top > 0 else 0.0)
    return out


@dataclass(frozen=True)
class Candidate:
    """One controller: its floors (which τ pair) and base action map, with nominal cost."""

    pair: tuple[float, float]
    step: int
    floors: np.ndarray  # int8 [buckets, 3]
    actions: np.ndarray  # int8 [buckets, 3]
    cost: float  # nominal C_KV on the development reference trajectories

    @property
    def name(self) -> str:
        return f"tau={self.pair[0]:g}/{self.pair[1]:g}@{self.step}"


def nominal_cost(actions: np.ndarray, tokens: np.ndarray, costs: PayloadCosts) -> float:
    """App. E.2: reference payload of an action map over Full-KV payload, same tokens."""
    m = np.asarray(costs.bytes_by_group, dtype=np.float64)
    per_token = m[np.arange(3)[None, :], actions].sum(axis=1)  # [buckets]
    total = float(tokens.sum())
    if total == 0:
        return 1.0
    return float((per_token * tokens).sum() / (total * costs.full_bytes_per_token))


def greedy_path(floors: np.ndarray, scores: np.ndarray) -> list[tuple[int, int]]:
    """The order of adjacent upgrades ``(bucket, group)`` from ``floors`` to all-H.

    At each step the eligible upgrade with the largest score wins; ties go to the serialized
    order (bucket, then group). Zero-score upgrades stay eligible until the end (App. A.4).
    """
    acts = floors.astype(np.int64).copy()
    moves: list[tuple[int, int]] = []
    while True:
        live = acts < H
        if not live.any():
            return moves
        s = np.where(live, np.take_along_axis(scores, np.minimum(acts, 1)[..., None], -1)[..., 0],
                     -np.inf)  # fmt: skip
        flat = int(np.argmax(s))  # first maximum: serialized tie order
        b, c = divmod(flat, 3)
        acts[b, c] += 1
        moves.append((b, c))


def path_candidates(
    pair: tuple[float, float],
    floors: np.ndarray,
    moves: Sequence[tuple[int, int]],
    dev_tokens: np.ndarray,
    costs: PayloadCosts,
) -> list[Candidate]:
    """Every prefix of the path as a candidate (step 0 = the floors themselves)."""
    acts = floors.copy()
    out = [Candidate(pair, 0, floors, acts.copy(), nominal_cost(acts, dev_tokens, costs))]
    for i, (b, c) in enumerate(moves, 1):
        acts[b, c] += 1
        out.append(Candidate(pair, i, floors, acts.copy(), nominal_cost(acts, dev_tokens, costs)))
    return out


def spread(candidates: Sequence[Candidate], count: int) -> list[Candidate]:
    """``count`` candidates spread evenly over the path's nominal cost range."""
    if len(candidates) <= count:
        return list(candidates)
    lo, hi = candidates[0].cost, candidates[-1].cost
    picked: dict[int, Candidate] = {}
    for level in np.linspace(lo, hi, count):
        best = min(candidates, key=lambda k: (abs(k.cost - level), k.step))
        picked[best.step] = best
    return [picked[s] for s in sorted(picked)]
