"""Slot bookkeeping for the KV pools: per-sequence slot maps and a free-list allocator."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pask_agent.errors import KVStoreError


class SlotMap:
    """One sequence's slots in one group's pool: unordered rows with O(1) insert and remove.

    Attention is order-free over keys (positions ride along), so removal swaps in the last row.
    """

    __slots__ = ("slots", "positions", "index")

    def __init__(self) -> None:
        self.slots: list[int] = []
        self.positions: list[int] = []
        self.index: dict[int, int] = {}

    def add(self, position: int, slot: int) -> None:
        self.index[position] = len(self.slots)
        self.slots.append(slot)
        self.positions.append(position)

    def remove(self, position: int) -> int:
        i = self.index.pop(position)
        slot = self.slots[i]
        last_slot, last_pos = self.slots.pop(), self.positions.pop()
        if i < len(self.slots):
            self.slots[i], self.positions[i] = last_slot, last_pos
            self.index[last_pos] = i
        return slot


class SlotAllocator:
    """A free list over ``capacity`` slots; grows by doubling (the caller grows the tensors)."""

    __slots__ = ("capacity", "free", "used")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.free = list(range(capacity - 1, -1, -1))
        self.used = 0

    def take(self, n: int) -> tuple[list[int], int]:
        """Return ``n`` slots and the capacity needed to hold them (maybe larger than now)."""
        while len(self.free) < n:
            old, self.capacity = self.capacity, self.capacity * 2
            self.free[:0] = range(self.capacity - 1, old - 1, -1)
        taken = [self.free.pop() for _ in range(n)]
        self.used += n
        return taken, self.capacity

    def give(self, slots: Sequence[int]) -> None:
        self.free.extend(slots)
        self.used -= len(slots)


def audit_slots(name: str, alloc: SlotAllocator, held: Sequence[int]) -> None:
    """Every slot of ``alloc`` is free exactly once or ``held`` by exactly one token.

    Raises
    ------
    KVStoreError
        Names the slots that are lost, shared or out of range.
    """
    seen = sorted([*held, *alloc.free])
    if seen != list(range(alloc.capacity)) or alloc.used != len(held):
        counts = Counter(seen)
        lost = sorted(set(range(alloc.capacity)) - set(counts))
        shared = sorted(s for s, n in counts.items() if n > 1 or not 0 <= s < alloc.capacity)
        raise KVStoreError(
            f"{name}: {alloc.used} slots counted used, {len(held)} held; lost {lost[:8]}, "
            f"shared or out of range {shared[:8]}"
        )
