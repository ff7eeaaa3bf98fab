"""Exact KV byte accounting (App. B.3): what a sequence holds, what all of them hold, peaks.

Bytes follow from slot counts alone: a high slot of group g costs one BF16 K+V row in each of
g's layers, a low slot one packed INT4 row plus its FP16 scales. Counting from the slot maps
(never from tensor sizes) is what makes the reported B the bytes a server actually keeps.
"""

from __future__ import annotations

from collections.abc import Sequence

from pask_agent.runtime.memory.kv_layout import KVLayout, KVReport
from pask_agent.runtime.memory.slots import SlotAllocator, SlotMap


class KVBytes:
    """Payload bytes from slot counts, per layer group (its layer count times the row sizes)."""

    def __init__(self, layout: KVLayout) -> None:
        self.layout = layout
        self._layers = [len(layout.groups.layers_of(g)) for g in range(3)]

    def held(self, high: Sequence[SlotMap], low: Sequence[SlotMap]) -> tuple[int, int, int]:
        """One sequence's (high, low codes, scales) bytes from its per-group slot maps."""
        lay = self.layout
        rows_high = sum(len(m.slots) * n for m, n in zip(high, self._layers, strict=True))
        rows_low = sum(len(m.slots) * n for m, n in zip(low, self._layers, strict=True))
        return (
            rows_high * lay.high_row_bytes,
            rows_low * lay.low_row_bytes,
            rows_low * lay.scale_row_bytes,
        )

    def held_before(self, high: Sequence[SlotMap], low: Sequence[SlotMap], position: int) -> int:
        """One sequence's payload bytes for its positions before ``position`` (the prompt of
        a turn, so a report can split B into the prompt's and the answer's share)."""
        lay = self.layout
        low_row = lay.low_row_bytes + lay.scale_row_bytes
        total = 0
        for h, lo, n in zip(high, low, self._layers, strict=True):
            total += n * int((h.positions < position).sum()) * lay.high_row_bytes
            total += n * int((lo.positions < position).sum()) * low_row
        return total

    def live(self, high: Sequence[SlotAllocator], low: Sequence[SlotAllocator]) -> int:
        """Bytes held by every sequence: slots in use in each group's pools."""
        lay = self.layout
        low_row = lay.low_row_bytes + lay.scale_row_bytes
        return sum(
            n * (h.used * lay.high_row_bytes + lo.used * low_row)
            for h, lo, n in zip(high, low, self._layers, strict=True)
        )

    def full(self, tokens: int) -> int:
        """Bytes ``tokens`` tokens take at Full KV (BF16 in every layer)."""
        return tokens * self.layout.num_layers * self.layout.high_row_bytes

    def report(
        self,
        high: Sequence[SlotMap],
        low: Sequence[SlotMap],
        length: int,
        peak_bytes: int,
        sinks: int,
        window: int,
        prompt_tokens: int = 0,
    ) -> KVReport:
        """One sequence's ``KVReport``; with ``prompt_tokens``, the prompt's share too."""
        high_b, low_b, scales = self.held(high, low)
        prompt = self.held_before(high, low, prompt_tokens) if prompt_tokens else 0
        return KVReport(
            length, high_b, low_b, scales, self.full(length), peak_bytes, sinks, window,
            prompt_tokens, prompt, self.full(prompt_tokens),
        )  # fmt: skip
