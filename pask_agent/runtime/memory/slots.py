"""Slot bookkeeping for the KV pools: per-sequence slot maps, a free-list allocator, and the
per-step view of B sequences' slots that attention reads."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from pask_agent.errors import KVStoreError
from pask_agent.kernels.attention import PoolView
from pask_agent.runtime.memory.kv_layout import GroupWrite


class SlotMap:
    """One sequence's slots in one group's pool: unordered rows with O(1) insert and remove.

    Attention is order-free over keys (positions ride along), so removal swaps in the last row.
    Slots and positions live in int64 arrays that change by one entry per token, so a step
    reads them (``slots``, ``positions``: views, valid until the next change) without
    rebuilding anything from Python lists: the host work of a decode step does not grow with
    the history (issue 11, item 3).
    """

    __slots__ = ("_slots", "_positions", "size", "index")

    def __init__(self, capacity: int = 16) -> None:
        self._slots = np.empty(capacity, np.int64)
        self._positions = np.empty(capacity, np.int64)
        self.size = 0
        self.index: dict[int, int] = {}  # position -> row

    @property
    def slots(self) -> np.ndarray:
        return self._slots[: self.size]

    @property
    def positions(self) -> np.ndarray:
        return self._positions[: self.size]

    def __len__(self) -> int:
        return self.size

    def _reserve(self, extra: int) -> None:
        need = self.size + extra
        if need > len(self._slots):
            cap = max(need, 2 * len(self._slots))
            for name in ("_slots", "_positions"):
                grown = np.empty(cap, np.int64)
                grown[: self.size] = getattr(self, name)[: self.size]
                setattr(self, name, grown)

    def add(self, position: int, slot: int) -> None:
        self._reserve(1)
        i = self.size
        self._slots[i], self._positions[i] = slot, position
        self.index[position] = i
        self.size = i + 1

    def add_many(self, positions: Sequence[int], slots: Sequence[int]) -> None:
        n = len(positions)
        self._reserve(n)
        i = self.size
        self._slots[i : i + n] = slots
        self._positions[i : i + n] = positions
        self.index.update(zip(positions, range(i, i + n), strict=True))
        self.size = i + n

    def remove(self, position: int) -> int:
        i = self.index.pop(position)
        slot = int(self._slots[i])
        last = self.size - 1
        if i < last:
            last_pos = int(self._positions[last])
            self._slots[i], self._positions[i] = self._slots[last], last_pos
            self.index[last_pos] = i
        self.size = last
        return slot


class SlotAllocator:
    """A free list over a fixed ``capacity`` of slots (the pool's rows; it never grows)."""

    __slots__ = ("capacity", "free", "used")

    def __init__(self, capacity: int) -> None:
        self.reset(capacity)

    def reset(self, capacity: int) -> None:
        """Every slot free, ``capacity`` of them (a re-split of an empty store)."""
        self.capacity = capacity
        self.free = list(range(capacity - 1, -1, -1))
        self.used = 0

    def take(self, n: int) -> list[int]:
        """``n`` free slots.

        Raises
        ------
        KVStoreError
            Fewer than ``n`` are free: admission (``runtime/memory/admission.py``) should have kept
            the pool from running out, so this is a bug or a store driven without an engine.
        """
        if len(self.free) < n:
            raise KVStoreError(
                f"KV pool full: {n} rows wanted, {len(self.free)} of {self.capacity} free; "
                "raise kv_capacity_bytes or admit fewer requests"
            )
        taken = self.free[len(self.free) - n :][::-1]
        del self.free[len(self.free) - n :]
        self.used += n
        return taken

    def give(self, slots: Sequence[int] | np.ndarray) -> None:
        self.free.extend(slots.tolist() if isinstance(slots, np.ndarray) else slots)
        self.used -= len(slots)


def audit_slots(name: str, alloc: SlotAllocator, held: Sequence[int]) -> None:
    """Every slot of ``alloc`` is free exactly once or ``held`` by exactly one token.

    Why: after a soak or a fuzz run, ``live_bytes() == 0`` alone would miss a slot that fell
    out of both the free list and every slot map (capacity lost for good), or one handed to
    two tokens at once (silent corruption).

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


def pool_view(maps: Sequence[SlotMap], device: torch.device) -> PoolView:
    """B sequences' slot maps of one pool as the kernel's ``PoolView`` (sequence b's keys at
    ``offsets[b]:offsets[b+1]``): B array copies, no per-token Python."""
    sizes = np.fromiter((m.size for m in maps), np.int64, len(maps))
    offsets = np.zeros(len(maps) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    slots = np.concatenate([m.slots for m in maps]) if maps else np.zeros(0, np.int64)
    positions = np.concatenate([m.positions for m in maps]) if maps else np.zeros(0, np.int64)
    return PoolView(
        slots=torch.from_numpy(slots).to(device),
        offsets=torch.from_numpy(offsets),
        positions=torch.from_numpy(positions).to(device),
    )


def place_group(
    allocs: tuple[SlotAllocator, SlotAllocator],
    maps: tuple[list[SlotMap], list[SlotMap]],
    offsets: list[int],
    positions: list[int],
    low_rows: list[int],
    gone_rows: list[int],
    device: torch.device,
) -> GroupWrite:
    """Take one group's slots for a step's new rows and enter them in the sequences' slot maps.

    ``allocs``/``maps``: the group's (high, low) allocators and each sequence's (high, low)
    maps; rows of the packed token axis in ``low_rows`` go low, in ``gone_rows`` nowhere, the
    rest high (``KVStore.begin_step``).
    """
    every = not low_rows and not gone_rows
    keep = np.ones(len(positions), dtype=bool)
    keep[low_rows + gone_rows] = False
    high_rows = np.flatnonzero(keep)
    pos = np.asarray(positions, dtype=np.int64)
    out = []
    for rows, alloc, seq_maps in (
        (high_rows, allocs[0], maps[0]),
        (np.asarray(low_rows, dtype=np.int64), allocs[1], maps[1]),
    ):
        slots = alloc.take(len(rows))
        # rows are sorted and each sequence's rows contiguous: one slice per sequence
        cuts = np.searchsorted(rows, offsets).tolist()
        for b, m in enumerate(seq_maps):
            i, j = cuts[b], cuts[b + 1]
            if j > i:
                m.add_many(pos[rows[i:j]].tolist(), slots[i:j])
        out.append(torch.tensor(slots, dtype=torch.int64, device=device))
    return GroupWrite(
        None if every else torch.from_numpy(high_rows).to(device),
        out[0],
        torch.tensor(low_rows, dtype=torch.int64, device=device),
        out[1],
    )


def audit_store(high_alloc: list, low_alloc: list, seqs: list) -> None:
    """``audit_slots`` for every pool of a store: its allocators per layer group and the slots
    its sequences hold (``KVStore.audit``)."""
    for kind, allocs in (("high", high_alloc), ("low", low_alloc)):
        for g, alloc in enumerate(allocs):
            held = [s for q in seqs for s in (q.high if kind == "high" else q.low)[g].slots]
            audit_slots(f"{kind} pool, group {g}", alloc, held)
