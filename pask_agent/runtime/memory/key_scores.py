"""Attention mass per stored position, for the score-ranked baselines (H2O, SnapKV, MiKV).

The attention kernel reports, for a step, the mass each key received (``KeyScores``); this book
adds it up per sequence, layer group and absolute position: over all steps (``scores``) and
for the latest step alone (``step_scores``, SnapKV's observation window). Kept apart from the
store's pools and slot maps: only policies that declare ``needs_scores`` pay for it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pask_agent.kernels.attention import KeyScores, PoolView


class KeyScoreBook:
    """Per sequence and layer group: ``[capacity]`` float32 mass by absolute position."""

    def __init__(self) -> None:
        self._total: dict[str, list[torch.Tensor]] = {}
        self._step: dict[str, list[torch.Tensor]] = {}

    def begin_step(self, lengths: dict[str, int]) -> None:
        """Zero the latest-step mass of these sequences; room for ``length`` positions."""
        for seq_id, length in lengths.items():
            total = self._total.setdefault(seq_id, [torch.zeros(0) for _ in range(3)])
            for g in range(3):
                if total[g].numel() < length:
                    extra = max(length, 2 * total[g].numel()) - total[g].numel()
                    total[g] = torch.cat([total[g], torch.zeros(extra)])
            self._step[seq_id] = [torch.zeros(t.numel()) for t in total]

    def add(
        self,
        g: int,
        seq_ids: Sequence[str],
        high: PoolView,
        low: PoolView,
        q_offsets: torch.Tensor,
        positions: torch.Tensor,
        scores: KeyScores,
    ) -> None:
        """Add one layer's mass per key (summed over KV heads) to each sequence's step."""
        parts = (
            (scores.high.sum(-1), high.positions, high.offsets.tolist()),
            (scores.low.sum(-1), low.positions, low.offsets.tolist()),
            (scores.cur.sum(-1), positions, q_offsets.tolist()),
        )
        for b, seq_id in enumerate(seq_ids):
            acc = self._step[seq_id][g]
            for mass, pos, offsets in parts:
                lo, hi = offsets[b], offsets[b + 1]
                if hi > lo:
                    acc.index_add_(0, pos[lo:hi], mass[lo:hi].to(acc.device))

    def end_step(self, seq_ids: Sequence[str]) -> None:
        for seq_id in seq_ids:
            for total, step in zip(self._total[seq_id], self._step[seq_id], strict=True):
                total += step

    def scores(self, seq_id: str, group: int, length: int, *, latest_step: bool) -> torch.Tensor:
        """``[length]`` mass each position received (all steps, or the latest one)."""
        book = self._step if latest_step else self._total
        if seq_id not in book:
            return torch.zeros(length)
        return book[seq_id][group][:length]

    def drop(self, seq_id: str) -> None:
        self._total.pop(seq_id, None)
        self._step.pop(seq_id, None)
