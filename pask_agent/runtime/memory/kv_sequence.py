"""One stored sequence: its logical length, settled mark, per-group slot maps, scheduled actions
and peak, with the questions admission and the store ask of it (``runtime/memory/kv_store.py``
owns the token's life; this is what it keeps per sequence)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pask_agent.policy.actions import Action
from pask_agent.runtime.memory.kv_schedule import ActionSchedule
from pask_agent.runtime.memory.slots import SlotAllocator, SlotMap


@dataclass
class StoredSequence:
    length: int = 0  # logical length: tokens written so far (absolute position of the next one)
    settled: int = 0  # tokens below this position have had their scheduled action executed
    high: list[SlotMap] = field(default_factory=lambda: [SlotMap() for _ in range(3)])
    low: list[SlotMap] = field(default_factory=lambda: [SlotMap() for _ in range(3)])
    pending: ActionSchedule = field(default_factory=ActionSchedule)
    peak_bytes: int = 0
    centered: bool = False  # keys stored minus the store's key offsets (key_offsets.py)

    def held_rows(self) -> np.ndarray:
        """``[2, 3]`` rows held: high pools, then low pools, per layer group."""
        return np.array([[m.size for m in self.high], [m.size for m in self.low]], np.int64)

    def rows_after_step(self, n: int, sinks: int, window: int) -> np.ndarray:
        """``[2, 3]`` rows this sequence may hold after a step that writes ``n`` tokens inside
        the window (a decode step): a high row per new token, and a low row per older token
        that leaves the window in that step with ``L`` scheduled (looked up, not guessed)."""
        rows = self.held_rows()
        rows[0] += n
        start, stop = max(self.settled, sinks), min(self.length + n - window, self.length)
        for p in range(start, stop):
            acts = self.pending.peek(p)
            rows[1] += [a == Action.L for a in acts]
        return rows

    def free(self, high: list[SlotAllocator], low: list[SlotAllocator]) -> None:
        """Give every slot back (the sequence is removed)."""
        for g in range(3):
            high[g].give(self.high[g].slots)
            low[g].give(self.low[g].slots)

    def truncate(self, length: int, high: list[SlotAllocator], low: list[SlotAllocator]) -> None:
        """Free every token at position >= ``length`` and forget their actions."""
        for g in range(3):
            for maps, alloc in ((self.high, high), (self.low, low)):
                gone = [p for p in range(length, self.length) if p in maps[g].index]
                alloc[g].give([maps[g].remove(p) for p in gone])
        self.pending.drop_from(length)
        self.length = length
        self.settled = min(self.settled, length)

    def copy_of(
        self, other: StoredSequence, high_slots: list[list[int]], low_slots: list[list[int]]
    ) -> None:
        """Become ``other`` (positions, settled mark, scheduled actions) over rows of its own:
        ``high_slots[g]``/``low_slots[g]`` hold copies of ``other``'s rows, in its map order."""
        for g in range(3):
            self.high[g].add_many(other.high[g].positions.tolist(), high_slots[g])
            self.low[g].add_many(other.low[g].positions.tolist(), low_slots[g])
        self.length, self.settled = other.length, other.settled
        self.pending = other.pending.copy()
