"""The mixed-precision attention kernels' inputs and outputs: ``PoolView`` (which pool rows
each sequence reads), ``KeyScores`` (attention mass per key) and the one validation both the
torch reference and the Triton kernel run, so a bad call fails the same way on either.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pask_agent.kernels.int4 import packed_dim


@dataclass(frozen=True, slots=True)
class PoolView:
    """One pool's slots for B sequences; sequence b owns ``slots[offsets[b]:offsets[b+1]]``.

    Attributes
    ----------
    slots : torch.Tensor
        ``[M]`` int64 slot ids (rows of the pool storage) of all sequences, concatenated.
    offsets : torch.Tensor
        ``[B + 1]`` int64 on the CPU, non-decreasing, ``offsets[0] == 0``, ``offsets[B] == M``.
    positions : torch.Tensor
        ``[M]`` int64 absolute token positions of those keys (they decide causal visibility).
    """

    slots: torch.Tensor
    offsets: torch.Tensor
    positions: torch.Tensor


@dataclass(frozen=True, slots=True)
class KeyScores:
    """Attention mass each key received, for H2O-style accumulators.

    Each entry is the softmax probability summed over all queries of the key's sequence and over
    the query heads of the KV group, so per sequence and KV head the entries sum to
    ``n_queries * (Hq // Hkv)``.

    Attributes
    ----------
    high : torch.Tensor
        ``[Mh, Hkv]`` float32, aligned with ``PoolView.slots`` of the high pool.
    low : torch.Tensor
        ``[Ml, Hkv]`` float32, aligned with the low pool's slots.
    cur : torch.Tensor
        ``[T, Hkv]`` float32, aligned with the current chunk's tokens.
    """

    high: torch.Tensor
    low: torch.Tensor
    cur: torch.Tensor


def _offsets(name: str, offsets: torch.Tensor, total: int) -> list[int]:
    if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1 or offsets.numel() < 2:
        raise ValueError(f"{name} must be a 1-D tensor of B + 1 >= 2 offsets")
    if offsets.is_floating_point() or offsets.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {offsets.dtype}")
    values = offsets.tolist()
    if values[0] != 0 or values[-1] != total:
        raise ValueError(
            f"{name} must start at 0 and end at {total}, got {values[0]}..{values[-1]}"
        )
    if any(b < a for a, b in zip(values, values[1:], strict=False)):
        raise ValueError(f"{name} must be non-decreasing, got {values}")
    return values


def _check_index(name: str, index: torch.Tensor, length: int | None = None) -> None:
    if not isinstance(index, torch.Tensor) or index.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor")
    if index.is_floating_point() or index.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer (int64) tensor, got {index.dtype}")
    if length is not None and index.shape[0] != length:
        raise ValueError(f"{name} has {index.shape[0]} entries, expected {length}")


def _check_shape(name: str, t: torch.Tensor, shape: tuple[int | None, ...]) -> None:
    ok = t.dim() == len(shape) and all(
        s is None or s == n for s, n in zip(shape, t.shape, strict=True)
    )
    if not ok:
        want = tuple("N" if s is None else s for s in shape)
        raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")


def check_attention_inputs(
    q: torch.Tensor,
    q_offsets: torch.Tensor,
    q_pos: torch.Tensor,
    cur_k: torch.Tensor,
    cur_v: torch.Tensor,
    high_k: torch.Tensor,
    high_v: torch.Tensor,
    high: PoolView,
    low_k_codes: torch.Tensor,
    low_v_codes: torch.Tensor,
    low_k_scales: torch.Tensor,
    low_v_scales: torch.Tensor,
    low: PoolView,
) -> tuple[list[int], list[int], list[int]]:
    """Validate shapes/dtypes; return the query, high and low offsets as Python lists."""
    if not isinstance(q, torch.Tensor) or q.dim() != 3 or not q.is_floating_point():
        raise ValueError("q must be a floating-point tensor of shape [T, Hq, D]")
    n_tok, n_qh, dim = q.shape
    if cur_k.dim() != 3 or cur_k.shape[0] != n_tok or cur_k.shape[2] != dim:
        raise ValueError(
            f"cur_k must have shape [T={n_tok}, Hkv, D={dim}], got {tuple(cur_k.shape)}"
        )
    n_kvh = cur_k.shape[1]
    if n_kvh == 0 or n_qh % n_kvh:
        raise ValueError(f"query heads ({n_qh}) must be a multiple of KV heads ({n_kvh}) for GQA")
    _check_shape("cur_v", cur_v, (n_tok, n_kvh, dim))
    _check_shape("high_k", high_k, (None, n_kvh, dim))
    _check_shape("high_v", high_v, (high_k.shape[0], n_kvh, dim))
    nbytes = packed_dim(dim)
    _check_shape("low_k_codes", low_k_codes, (None, n_kvh, nbytes))
    n_low = low_k_codes.shape[0]
    _check_shape("low_v_codes", low_v_codes, (n_low, n_kvh, nbytes))
    _check_shape("low_k_scales", low_k_scales, (n_low, n_kvh, 1))
    _check_shape("low_v_scales", low_v_scales, (n_low, n_kvh, 1))
    for name, t in (("cur_k", cur_k), ("cur_v", cur_v), ("high_k", high_k), ("high_v", high_v)):
        if not t.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {t.dtype}")
    for name, t in (("low_k_codes", low_k_codes), ("low_v_codes", low_v_codes)):
        if t.dtype != torch.uint8:
            raise TypeError(f"{name} must be uint8 packed INT4 codes, got {t.dtype}")
    _check_index("q_pos", q_pos, n_tok)
    q_off = _offsets("q_offsets", q_offsets, n_tok)
    pools = []
    for name, view in (("high", high), ("low", low)):
        if not isinstance(view, PoolView):
            raise TypeError(f"{name} must be a PoolView, got {type(view).__name__}")
        _check_index(f"{name}.slots", view.slots)
        _check_index(f"{name}.positions", view.positions, view.slots.shape[0])
        pools.append(_offsets(f"{name}.offsets", view.offsets, view.slots.shape[0]))
        if len(pools[-1]) != len(q_off):
            raise ValueError(
                f"{name}.offsets describes {len(pools[-1]) - 1} sequences but q_offsets "
                f"describes {len(q_off) - 1}"
            )
    return q_off, pools[0], pools[1]
