"""The KV store's storage: per layer a BF16 pool and a packed-INT4 pool (codes + FP16 scales),
carved once from one preallocated byte buffer.

Rows are addressed by slot; which token owns which slot is the slot maps' business
(``runtime/memory/slots.py``), and when a token moves is the store's. Layers of one layer group
share slot numbers (one allocator per group), so every operation here takes a group and touches each
of its layers. A low row holds the App. B.5 quantization of the token's BF16 row, whether it
was written straight into INT4 or demoted later: both quantize the same BF16 values.

Memory (issue 11, item 2): the buffer is allocated once, at the capacity's size, and never
grows. How its bytes divide into rows (``PoolRows``: high and low rows per layer group) is a
*split*; re-splitting re-views the same buffer (no allocation, no copy) and is only allowed
while no token is stored, so no held row can move. ``torch.empty``: nothing reads a row before
it is written (attention gathers held slots only), and on CPU the OS backs pages on first
touch, so resident memory follows the rows ever used while the address range is reserved.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pask_agent.errors import KVStoreError
from pask_agent.kernels.attention import (
    KeyScores,
    MixedKV,
    PoolView,
    QueryChunk,
    mixed_attention,
)
from pask_agent.kernels.int4 import quantize_int4
from pask_agent.policy.actions import LayerGroups
from pask_agent.runtime.memory.kv_layout import GroupWrite, KVLayout
from pask_agent.runtime.memory.slots import SlotAllocator

_SCALE = torch.float16


@dataclass(frozen=True, slots=True)
class PoolRows:
    """Rows per layer group in the high (BF16) and low (INT4) pools: one split of the buffer."""

    high: tuple[int, int, int]
    low: tuple[int, int, int]

    def __post_init__(self) -> None:
        if len(self.high) != 3 or len(self.low) != 3 or min(*self.high, *self.low) < 0:
            raise KVStoreError(f"need 3 non-negative row counts per pool, got {self}")

    @classmethod
    def even(cls, rows: int) -> PoolRows:
        """``rows`` rows in every pool (a store used without an engine: tests, tools)."""
        return cls((rows,) * 3, (rows,) * 3)

    def nbytes(self, layout: KVLayout, high_dtype: torch.dtype = torch.bfloat16) -> int:
        """Bytes these rows take in every layer (high rows at ``high_dtype``)."""
        hb = 2 * layout.num_kv_heads * layout.head_dim * torch.empty(0, dtype=high_dtype).itemsize
        lb = layout.low_row_bytes + layout.scale_row_bytes
        n = [len(layout.groups.layers_of(g)) for g in range(3)]
        return sum(n[g] * (self.high[g] * hb + self.low[g] * lb) for g in range(3))


def split_rows(
    capacity_bytes: int,
    layout: KVLayout,
    high_weight: tuple[int, int, int],
    low_weight: tuple[int, int, int],
) -> PoolRows:
    """The largest rows in proportion to ``high_weight``/``low_weight`` (rows, e.g. the summed
    demands of the requests being admitted) that fit ``capacity_bytes``.

    Scaling one request's demand ``d`` by ``capacity / bytes(d)`` makes a capacity of exactly
    ``k`` demands hold exactly ``k`` such requests (every pool scales by ``k``).
    """
    weight = PoolRows(tuple(high_weight), tuple(low_weight))  # type: ignore[arg-type]
    total = weight.nbytes(layout)
    if total <= 0:
        raise KVStoreError("a pool split needs a positive weight in at least one pool")
    high = tuple(w * capacity_bytes // total for w in weight.high)
    low = tuple(w * capacity_bytes // total for w in weight.low)
    return PoolRows(high, low)  # type: ignore[arg-type]


class KVPools:
    """Per-layer pool tensors, views of one ``[capacity_bytes]`` uint8 buffer:
    ``high_k/high_v [N_g, Hkv, D]`` at ``high_dtype``; ``low_k/low_v [M_g, Hkv, ceil(D/2)]``
    uint8 codes and ``low_ks/low_vs [M_g, Hkv, 1]`` FP16 scales (``N_g``/``M_g``: the split's
    high/low rows of the layer's group), and per group a free list of each pool's rows."""

    def __init__(
        self,
        layout: KVLayout,
        high_dtype: torch.dtype,
        capacity_bytes: int | None,
        rows: PoolRows,
        device: torch.device,
        *,
        backend: str = "auto",
    ) -> None:
        self.layout = layout
        self.backend = backend
        self.groups: LayerGroups = layout.groups
        self.high_dtype = high_dtype
        capacity_bytes = capacity_bytes or rows.nbytes(layout, high_dtype)
        self.buffer = torch.empty(capacity_bytes, dtype=torch.uint8, device=device)
        self.high_alloc = [SlotAllocator(0) for _ in range(3)]
        self.low_alloc = [SlotAllocator(0) for _ in range(3)]
        self.split(rows)

    def split(self, rows: PoolRows) -> None:
        """Carve the buffer into ``rows``, every row free; every view is contiguous. The
        caller (``KVStore.resplit``) makes sure no row is held.

        Two-byte tensors (high rows, scales) come first and codes last, so every view starts
        at an offset its dtype divides and nothing is lost to padding.

        Raises
        ------
        KVStoreError
            ``rows`` need more bytes than the buffer holds.
        """
        need = rows.nbytes(self.layout, self.high_dtype)
        if need > self.buffer.numel():
            raise KVStoreError(
                f"pool rows {rows} need {need} bytes, more than the {self.buffer.numel()} "
                "preallocated (kv_capacity_bytes)"
            )
        lay = self.layout
        h, d, dp = lay.num_kv_heads, lay.head_dim, (lay.head_dim + 1) // 2
        offset = 0

        def take(n: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            nonlocal offset
            size = torch.empty(0, dtype=dtype).itemsize
            count = n
            for s in shape:
                count *= s
            view = self.buffer[offset : offset + count * size].view(dtype).view(n, *shape)
            offset += count * size
            return view

        layers = range(lay.num_layers)
        group = [self.groups.group_of(i) for i in layers]
        hi, lo = [rows.high[group[i]] for i in layers], [rows.low[group[i]] for i in layers]
        self.high_k = [take(hi[i], (h, d), self.high_dtype) for i in layers]
        self.high_v = [take(hi[i], (h, d), self.high_dtype) for i in layers]
        self.low_ks = [take(lo[i], (h, 1), _SCALE) for i in layers]
        self.low_vs = [take(lo[i], (h, 1), _SCALE) for i in layers]
        self.low_k = [take(lo[i], (h, dp), torch.uint8) for i in layers]
        self.low_v = [take(lo[i], (h, dp), torch.uint8) for i in layers]
        self.rows = rows
        for g in range(3):
            self.high_alloc[g].reset(rows.high[g])
            self.low_alloc[g].reset(rows.low[g])

    def free_rows(self) -> np.ndarray:
        """``[2, 3]`` free rows: the high pools, then the low pools, per layer group."""
        pools = (self.high_alloc, self.low_alloc)
        return np.array([[a.capacity - a.used for a in p] for p in pools], dtype=np.int64)

    def write(self, layer: int, put: GroupWrite, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store one layer's new rows ``[T, Hkv, D]``: high rows at ``high_dtype``, rows that
        settle at once straight into INT4 (from their ``high_dtype`` values), others nowhere."""
        k, v = k.to(self.high_dtype), v.to(self.high_dtype)
        for x, pool in ((k, self.high_k), (v, self.high_v)):
            rows = x if put.high_rows is None else x.index_select(0, put.high_rows)
            pool[layer].index_copy_(0, put.high_slots, rows)
        if put.low_rows.numel():
            for x, codes, scales in ((k, self.low_k, self.low_ks), (v, self.low_v, self.low_vs)):
                c, sc = quantize_int4(x.index_select(0, put.low_rows))
                codes[layer].index_copy_(0, put.low_slots, c)
                scales[layer].index_copy_(0, put.low_slots, sc)

    def quantize_rows(
        self, g: int, high_slots: torch.Tensor
    ) -> list[tuple[int, tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]]:
        """INT4 codes and scales of high rows ``high_slots`` in every layer of group ``g``,
        taken before those slots are freed (the caller may reuse them at once)."""
        return [
            (
                layer,
                quantize_int4(self.high_k[layer].index_select(0, high_slots)),
                quantize_int4(self.high_v[layer].index_select(0, high_slots)),
            )
            for layer in self.groups.layers_of(g)
        ]

    def put_low(
        self,
        coded: list[
            tuple[int, tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
        ],
        low_slots: torch.Tensor,
    ) -> None:
        """Write ``quantize_rows``' output into low rows ``low_slots``."""
        for layer, (kc, ks), (vc, vs) in coded:
            self.low_k[layer].index_copy_(0, low_slots, kc)
            self.low_ks[layer].index_copy_(0, low_slots, ks)
            self.low_v[layer].index_copy_(0, low_slots, vc)
            self.low_vs[layer].index_copy_(0, low_slots, vs)

    def copy_rows(self, g: int, src: np.ndarray, dst: list[int], *, high: bool) -> None:
        """Copy rows ``src`` to rows ``dst`` of one pool in every layer of group ``g`` (a
        sequence that starts as a copy of another one's prompt, ``KVStore.copy_sequence``)."""
        s = torch.from_numpy(np.asarray(src, np.int64)).to(self.buffer.device)
        d = torch.tensor(dst, dtype=torch.int64, device=self.buffer.device)
        tensors = (
            (self.high_k, self.high_v)
            if high
            else (self.low_k, self.low_v, self.low_ks, self.low_vs)
        )
        for layer in self.groups.layers_of(g):
            for pool in tensors:
                pool[layer].index_copy_(0, d, pool[layer].index_select(0, s))

    def attend(
        self,
        layer: int,
        chunk: QueryChunk,
        high: PoolView,
        low: PoolView,
        *,
        scale: float,
        return_key_scores: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, KeyScores]:
        """Mixed-precision attention of ``chunk``'s queries over one layer's rows that
        ``high``/``low`` select, plus the chunk's own keys (``kernels/attention.py``): the one
        place a layer's pools become the backends' ``MixedKV`` view."""
        kv = MixedKV(
            self.high_k[layer], self.high_v[layer], high,
            self.low_k[layer], self.low_v[layer], self.low_ks[layer], self.low_vs[layer], low,
        )  # fmt: skip
        return mixed_attention(
            chunk, kv, scale=scale, return_key_scores=return_key_scores, backend=self.backend
        )

    def allocated_bytes(self) -> int:
        """Bytes of the preallocated buffer (the capacity, free rows included)."""
        return self.buffer.numel()
