"""What the mixed-precision attention backends take and give back: ``QueryChunk`` (this step's
new tokens), ``MixedKV`` (one layer's stored keys and values, each pool read through a ``PoolView``)
and ``KeyScores`` (attention mass per key).

Each value checks itself when it is built, so a bad call fails the same way on every backend
(torch reference, compiled C, Triton) and the KV store's views are checked once per layer and
step; ``check_attention_inputs`` then only checks that a chunk and a view belong together.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

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
    _bounds: tuple[int, ...] | None = field(default=None, init=False, repr=False, compare=False)

    def to(self, device: torch.device | str) -> PoolView:
        """The same view with its slots and positions on ``device`` (offsets stay on the CPU)."""
        return replace(self, slots=self.slots.to(device), positions=self.positions.to(device))

    def checked_bounds(self, name: str) -> tuple[int, ...]:
        """``offsets`` as Python ints, the view checked (errors say ``name``) on first use only:
        the KV store builds one view per layer group and step, and each layer of the group
        reads it."""
        if self._bounds is None:
            _check_index(f"{name}.slots", self.slots)
            _check_index(f"{name}.positions", self.positions, self.slots.shape[0])
            bounds = _offsets(f"{name}.offsets", self.offsets, self.slots.shape[0])
            object.__setattr__(self, "_bounds", bounds)
        return self._bounds  # type: ignore[return-value]


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


def _offsets(name: str, offsets: torch.Tensor, total: int) -> tuple[int, ...]:
    if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1 or offsets.numel() < 2:
        raise ValueError(f"{name} must be a 1-D tensor of B + 1 >= 2 offsets")
    if offsets.is_floating_point() or offsets.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {offsets.dtype}")
    values = tuple(offsets.tolist())
    if values[0] != 0 or values[-1] != total:
        raise ValueError(
            f"{name} must start at 0 and end at {total}, got {values[0]}..{values[-1]}"
        )
    if any(b < a for a, b in zip(values, values[1:], strict=False)):
        raise ValueError(f"{name} must be non-decreasing, got {list(values)}")
    return values


def _check_index(name: str, index: torch.Tensor, length: int | None = None) -> None:
    if not isinstance(index, torch.Tensor) or index.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor")
    if index.is_floating_point() or index.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer (int64) tensor, got {index.dtype}")
    if length is not None and index.shape[0] != length:
        raise ValueError(f"{name} has {index.shape[0]} entries, expected {length}")


def _check_shape(name: str, t: torch.Tensor, shape: tuple[int | None, ...]) -> None:
    # a plain loop: these run for every layer of every step
    if isinstance(t, torch.Tensor) and t.dim() == len(shape):
        for want_n, n in zip(shape, t.shape, strict=True):
            if want_n is not None and want_n != n:
                break
        else:
            return
    want = tuple("N" if s is None else s for s in shape)
    got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
    raise ValueError(f"{name} must have shape {want}, got {got}")


def _check_dtypes(pairs: tuple[tuple[str, torch.Tensor], ...], *, packed: bool) -> None:
    for name, t in pairs:
        if packed and t.dtype != torch.uint8:
            raise TypeError(f"{name} must be uint8 packed INT4 codes, got {t.dtype}")
        if not packed and not t.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {t.dtype}")


@dataclass(frozen=True, slots=True)
class QueryChunk:
    """This step's new tokens of B sequences, packed on one token axis: their queries and
    their own keys and values, which each query attends to causally besides the stored ones.

    Attributes
    ----------
    q : torch.Tensor
        ``[T, Hq, D]`` queries of the B sequences concatenated (any float dtype).
    q_offsets : torch.Tensor
        ``[B + 1]`` int64 on the CPU: sequence b owns tokens ``q_offsets[b]:q_offsets[b+1]``.
    q_pos : torch.Tensor
        ``[T]`` int64 absolute positions of the queries (and of the current keys).
    cur_k, cur_v : torch.Tensor
        ``[T, Hkv, D]`` the chunk's keys/values (after RoPE), same token layout as ``q``;
        ``Hq`` must be a multiple of ``Hkv`` (GQA).
    bounds : tuple[int, ...]
        ``q_offsets`` as Python ints, read once when the chunk is built.

    Raises
    ------
    ValueError, TypeError
        Inconsistent shapes, offsets or dtypes (the message names the field).
    """

    q: torch.Tensor
    q_offsets: torch.Tensor
    q_pos: torch.Tensor
    cur_k: torch.Tensor
    cur_v: torch.Tensor
    bounds: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        q, cur_k = self.q, self.cur_k
        if not isinstance(q, torch.Tensor) or q.dim() != 3 or not q.is_floating_point():
            raise ValueError("q must be a floating-point tensor of shape [T, Hq, D]")
        n_tok, n_qh, dim = q.shape
        if not isinstance(cur_k, torch.Tensor) or cur_k.dim() != 3:
            raise ValueError(f"cur_k must have shape [T={n_tok}, Hkv, D={dim}]")
        if cur_k.shape[0] != n_tok or cur_k.shape[2] != dim:
            raise ValueError(
                f"cur_k must have shape [T={n_tok}, Hkv, D={dim}], got {tuple(cur_k.shape)}"
            )
        n_kvh = cur_k.shape[1]
        if n_kvh == 0 or n_qh % n_kvh:
            raise ValueError(
                f"query heads ({n_qh}) must be a multiple of KV heads ({n_kvh}) for GQA"
            )
        _check_shape("cur_v", self.cur_v, (n_tok, n_kvh, dim))
        _check_dtypes((("cur_k", cur_k), ("cur_v", self.cur_v)), packed=False)
        _check_index("q_pos", self.q_pos, n_tok)
        object.__setattr__(self, "bounds", _offsets("q_offsets", self.q_offsets, n_tok))

    def to(self, device: torch.device | str) -> QueryChunk:
        """The same chunk on ``device`` (``q_offsets`` stays on the CPU)."""
        q, q_pos, cur_k, cur_v = (
            x.to(device) for x in (self.q, self.q_pos, self.cur_k, self.cur_v)
        )
        return replace(self, q=q, q_pos=q_pos, cur_k=cur_k, cur_v=cur_v)


@dataclass(frozen=True, slots=True)
class MixedKV:
    """One layer's stored keys and values for B sequences, as every attention backend reads
    them: BF16 rows, packed INT4 rows with their FP16 scales, and which rows each sequence owns.

    These travel together because none means anything alone: a pool's storage is read only
    through its ``PoolView``, INT4 codes only with their scales, and K only beside V. The KV
    store builds one per layer and step (``runtime/memory/kv_pools.py``); the Triton launcher
    and the C kernel's wrapper unpack it into flat arguments, each in one place.

    Attributes
    ----------
    high_k, high_v : torch.Tensor
        ``[Nh, Hkv, D]`` BF16 (any float) pool storage; ``high`` selects each sequence's rows.
    high : PoolView
        The high rows of each sequence and their absolute positions.
    low_k_codes, low_v_codes : torch.Tensor
        ``[Nl, Hkv, ceil(D/2)]`` uint8 packed INT4 (paper App. B.5, ``int4.py``).
    low_k_scales, low_v_scales : torch.Tensor
        ``[Nl, Hkv, 1]`` FP16 row scales.
    low : PoolView
        The low rows of each sequence and their absolute positions.
    high_bounds, low_bounds : tuple[int, ...]
        ``high.offsets`` and ``low.offsets`` as Python ints, read once when the view is built.

    Raises
    ------
    ValueError, TypeError
        Inconsistent shapes, offsets or dtypes (the message names the field).
    """

    high_k: torch.Tensor
    high_v: torch.Tensor
    high: PoolView
    low_k_codes: torch.Tensor
    low_v_codes: torch.Tensor
    low_k_scales: torch.Tensor
    low_v_scales: torch.Tensor
    low: PoolView
    high_bounds: tuple[int, ...] = field(init=False, repr=False, compare=False)
    low_bounds: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_shape("high_k", self.high_k, (None, None, None))
        n_high, n_kvh, dim = self.high_k.shape
        _check_shape("high_v", self.high_v, (n_high, n_kvh, dim))
        _check_shape("low_k_codes", self.low_k_codes, (None, n_kvh, packed_dim(dim)))
        n_low = self.low_k_codes.shape[0]
        _check_shape("low_v_codes", self.low_v_codes, (n_low, n_kvh, packed_dim(dim)))
        _check_shape("low_k_scales", self.low_k_scales, (n_low, n_kvh, 1))
        _check_shape("low_v_scales", self.low_v_scales, (n_low, n_kvh, 1))
        _check_dtypes((("high_k", self.high_k), ("high_v", self.high_v)), packed=False)
        codes = (("low_k_codes", self.low_k_codes), ("low_v_codes", self.low_v_codes))
        _check_dtypes(codes, packed=True)
        for name, view in (("high", self.high), ("low", self.low)):
            if not isinstance(view, PoolView):
                raise TypeError(f"{name} must be a PoolView, got {type(view).__name__}")
            object.__setattr__(self, f"{name}_bounds", view.checked_bounds(name))

    def to(self, device: torch.device | str) -> MixedKV:
        """The same view with every tensor on ``device`` (the offsets stay on the CPU)."""
        high_k, high_v = self.high_k.to(device), self.high_v.to(device)
        codes = (self.low_k_codes, self.low_v_codes, self.low_k_scales, self.low_v_scales)
        low_k_codes, low_v_codes, low_k_scales, low_v_scales = (x.to(device) for x in codes)
        return MixedKV(
            high_k, high_v, self.high.to(device),
            low_k_codes, low_v_codes, low_k_scales, low_v_scales, self.low.to(device),
        )  # fmt: skip


def check_attention_inputs(chunk: QueryChunk, kv: MixedKV) -> None:
    """Check that ``chunk`` and ``kv`` belong together (each checked itself when built): the
    same KV heads and head dim, and the same number of sequences."""
    if not isinstance(chunk, QueryChunk):
        raise TypeError(f"chunk must be a QueryChunk, got {type(chunk).__name__}")
    if not isinstance(kv, MixedKV):
        raise TypeError(f"kv must be a MixedKV, got {type(kv).__name__}")
    n_kvh, dim = chunk.cur_k.shape[1:]
    _check_shape("high_k", kv.high_k, (None, n_kvh, dim))
    for name, bounds in (("high", kv.high_bounds), ("low", kv.low_bounds)):
        if len(bounds) != len(chunk.bounds):
            raise ValueError(
                f"{name}.offsets describes {len(bounds) - 1} sequences but q_offsets "
                f"describes {len(chunk.bounds) - 1}"
            )
