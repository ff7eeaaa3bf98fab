"""The KV store's storage: per layer a BF16 pool and a packed-INT4 pool (codes + FP16 scales).

Rows are addressed by slot; which token owns which slot is the slot maps' business
(``runtime/slots.py``), and when a token moves is the store's. Layers of one layer group share
slot numbers (one allocator per group), so every operation here takes a group and touches each
of its layers. A low row holds the App. B.5 quantization of the token's BF16 row, whether it
was written straight into INT4 or demoted later: both quantize the same BF16 values.
"""

from __future__ import annotations

import torch

from pask_agent.kernels.attention import KeyScores, PoolView, mixed_attention
from pask_agent.kernels.int4 import quantize_int4
from pask_agent.policy.actions import LayerGroups
from pask_agent.runtime.kv_layout import GroupWrite, KVLayout


class KVPools:
    """Per-layer pool tensors: ``high_k/high_v [N, Hkv, D]`` at ``high_dtype``; ``low_k/low_v
    [N, Hkv, ceil(D/2)]`` uint8 codes and ``low_ks/low_vs [N, Hkv, 1]`` FP16 scales."""

    def __init__(
        self, layout: KVLayout, high_dtype: torch.dtype, capacity: int, device: torch.device
    ) -> None:
        self.groups: LayerGroups = layout.groups
        self.high_dtype = high_dtype
        n, h, d, dp = (
            layout.num_layers,
            layout.num_kv_heads,
            layout.head_dim,
            (layout.head_dim + 1) // 2,
        )
        kw = {"device": device}
        self.high_k = [torch.zeros(capacity, h, d, dtype=high_dtype, **kw) for _ in range(n)]
        self.high_v = [torch.zeros_like(t) for t in self.high_k]
        self.low_k = [torch.zeros(capacity, h, dp, dtype=torch.uint8, **kw) for _ in range(n)]
        self.low_v = [torch.zeros_like(t) for t in self.low_k]
        self.low_ks = [torch.ones(capacity, h, 1, dtype=torch.float16, **kw) for _ in range(n)]
        self.low_vs = [torch.ones_like(t) for t in self.low_ks]

    def grow_high(self, g: int, capacity: int) -> None:
        """Make the high pools of group ``g``'s layers hold at least ``capacity`` rows."""
        for layer in self.groups.layers_of(g):
            for pools in (self.high_k, self.high_v):
                pools[layer] = _grow(pools[layer], capacity, 0.0)

    def grow_low(self, g: int, capacity: int) -> None:
        fills = ((self.low_k, 0.0), (self.low_v, 0.0), (self.low_ks, 1.0), (self.low_vs, 1.0))
        for layer in self.groups.layers_of(g):
            for pools, fill in fills:
                pools[layer] = _grow(pools[layer], capacity, fill)

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

    def attend(
        self,
        layer: int,
        q_offsets: torch.Tensor,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        high: PoolView,
        low: PoolView,
        *,
        scale: float,
        return_key_scores: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, KeyScores]:
        """Mixed-precision attention of queries ``[T, Hq, D]`` over one layer's rows that
        ``high``/``low`` select, plus the chunk's own ``k``/``v`` (``kernels/attention.py``)."""
        return mixed_attention(
            q, q_offsets, positions, k, v,
            self.high_k[layer], self.high_v[layer], high,
            self.low_k[layer], self.low_v[layer], self.low_ks[layer], self.low_vs[layer], low,
            scale=scale, return_key_scores=return_key_scores,
        )  # fmt: skip

    def allocated_bytes(self) -> int:
        """Bytes of the pool tensors themselves (capacity, including free slots)."""
        pools = (self.high_k, self.high_v, self.low_k, self.low_v, self.low_ks, self.low_vs)
        return sum(t.numel() * t.element_size() for layers in pools for t in layers)


def _grow(t: torch.Tensor, capacity: int, fill: float) -> torch.Tensor:
    if t.shape[0] >= capacity:
        return t
    extra = torch.full((capacity - t.shape[0], *t.shape[1:]), fill, dtype=t.dtype, device=t.device)
    return torch.cat([t, extra])
