"""Mixed-precision attention for sequences with few queries (decode steps), all at once.

The reference in ``attention.py`` walks sequences one by one, which on a CPU costs a dozen small
torch calls per sequence and layer; with eight decoding sequences that Python loop, not the
arithmetic, is a large share of attention. Here every sequence with at most ``SMALL_QUERIES``
queries is padded to the longest one and the whole batch is attended with a handful of batched
matmuls: one gather per pool, one softmax, one weighted sum.

INT4 rows are never multiplied by their scales element by element. Their signed nibbles are
split into the even and odd halves of the head dimension, so ``q . k`` is two matmuls over the
nibbles (``q_even . lo + q_odd . hi``) times the key's scale, and the value sum folds each value
scale into its probability. A low row then costs what a bf16 row costs: one conversion to fp32.

Padding keys carry position ``PAD_POSITION`` (never visible to a real query); padding queries
carry it too (they see every key and their output is dropped).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pask_agent.kernels.attention_inputs import MixedKV, QueryChunk
from pask_agent.kernels.int4 import unpack_int4_unchecked

__all__ = ["BATCH_ROWS", "SMALL_QUERIES", "attend_small_queries"]

SMALL_QUERIES = 8
"""Sequences with at most this many queries in a step are attended in one padded batch."""

BATCH_ROWS = 1 << 15
"""At most this many padded pool rows (sequences × longest history) per batch; a larger step
is split, which keeps each fp32 scratch tensor at 16 MiB for 2 KV heads of 64: under glibc's
largest mmap threshold, so its pages are reused (``runtime/memory/host_memory.py``)."""

PAD_POSITION = torch.iinfo(torch.int64).max


def _padded(
    offsets: Sequence[int], seqs: list[int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[S, C]`` indices into a flat per-sequence layout, and ``[S, C]`` validity, on
    ``device`` (where the tensors they index live: a GPU when the reference runs there)."""
    starts = torch.tensor([offsets[b] for b in seqs], dtype=torch.int64)
    counts = torch.tensor([offsets[b + 1] - offsets[b] for b in seqs], dtype=torch.int64)
    width = int(counts.max()) if seqs else 0
    cols = torch.arange(width, dtype=torch.int64)
    valid = cols[None, :] < counts[:, None]
    index = torch.where(valid, starts[:, None] + cols[None, :], 0)
    return index.to(device), valid.to(device)


def _masked(scores: torch.Tensor, key_pos: torch.Tensor, row_pos: torch.Tensor) -> torch.Tensor:
    """``scores [Hkv, S, R, C]`` with keys at ``key_pos [S, C]`` after ``row_pos [S, R]`` hidden."""
    hidden = key_pos[:, None, :] > row_pos[:, :, None]  # [S, R, C]
    return scores.masked_fill(hidden[None], float("-inf"))


def _scores(
    qg: torch.Tensor, keys: torch.Tensor, scale: float, key_pos: torch.Tensor, row_pos: torch.Tensor
) -> torch.Tensor:
    """``qg [Hkv, S, R, D]`` against fp32 ``keys [Hkv, S, C, D]``: masked scaled scores."""
    return _masked(torch.matmul(qg, keys.transpose(-1, -2)) * scale, key_pos, row_pos)


def _split_nibbles(codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed bytes ``[..., D/2]`` -> signed low and high nibbles as fp32 (even, odd dims)."""
    signed = codes.view(torch.int8)
    return ((signed << 4) >> 4).float(), (signed >> 4).float()


def _rows(pool: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index [S, C]`` of ``pool [N, Hkv, X]`` as a contiguous ``[Hkv, S, C, X]``, still
    in the pool's dtype (one ``index_select``, many times faster on a CPU than indexing with
    a 2-D tensor; the head-major copy is made before the fp32 conversion, on fewer bytes)."""
    rows = pool.index_select(0, index.reshape(-1)).view(*index.shape, *pool.shape[1:])
    return rows.permute(2, 0, 1, 3).contiguous()


@dataclass(frozen=True, slots=True)
class _Part:
    """One kind of key of a padded batch: its masked scores and what its values are."""

    name: str  # "cur" | "high" | "low": which KeyScores entry its key mass goes to
    scores: torch.Tensor  # [Hkv, S, R, C]
    values: torch.Tensor  # [Hkv, S, C, D] fp32, or packed INT4 bytes [Hkv, S, C, D/2]
    value_scales: torch.Tensor | None  # [Hkv, S, 1, C] for INT4 values, folded into p
    index: torch.Tensor  # [S, C] flat row ids (query tokens or pool view rows)
    valid: torch.Tensor  # [S, C] not padding

    def weighted_sum(self, p: torch.Tensor) -> torch.Tensor:
        """``p [Hkv, S, R, C]`` -> ``sum_c p v`` as ``[Hkv, S, R, D]``."""
        if self.value_scales is not None:
            p = p * self.value_scales
        if self.values.dtype != torch.uint8:
            return torch.matmul(p, self.values)
        lo, hi = _split_nibbles(self.values)
        return torch.stack((torch.matmul(p, lo), torch.matmul(p, hi)), dim=-1).flatten(-2)


def _batches(seqs: list[int], h_off: Sequence[int], l_off: Sequence[int]) -> list[list[int]]:
    """``seqs`` in order, cut so that sequences × longest history stays within BATCH_ROWS."""
    out: list[list[int]] = []
    widest = 0
    for b in seqs:
        rows = h_off[b + 1] - h_off[b] + l_off[b + 1] - l_off[b]
        if out and (len(out[-1]) + 1) * max(widest, rows) <= BATCH_ROWS:
            out[-1].append(b)
            widest = max(widest, rows)
        else:
            out.append([b])
            widest = rows
    return out


def attend_small_queries(
    out: torch.Tensor,
    seqs: list[int],
    chunk: QueryChunk,
    kv: MixedKV,
    *,
    scale: float,
    masses: dict[str, torch.Tensor] | None = None,
) -> None:
    """Write into ``out [T, Hq, D]`` the attention of sequences ``seqs`` (each with at least
    one and at most a few queries), in batches of at most ``BATCH_ROWS`` padded pool rows.

    ``chunk`` and ``kv`` are checked together by the caller. ``masses``, when given, maps
    "high", "low" and "cur" to the ``KeyScores`` tensors to fill for these sequences' keys.
    Arguments otherwise as in ``mixed_attention_ref``, whose output this matches to fp32
    rounding.
    """
    q, q_pos, high, low = chunk.q, chunk.q_pos, kv.high, kv.low
    q_off, h_off, l_off = chunk.bounds, kv.high_bounds, kv.low_bounds
    n_qh, dim = q.shape[1], q.shape[2]
    n_kvh = chunk.cur_k.shape[1]
    group = n_qh // n_kvh
    for batch in _batches(seqs, h_off, l_off):
        # queries: [Hkv, S, R, D] with row r = g * Tq + t, padding rows at PAD_POSITION
        t_idx, t_valid = _padded(q_off, batch, q.device)
        n_s, n_t = t_idx.shape
        qg = q[t_idx].float().reshape(n_s, n_t, n_kvh, group, dim).permute(2, 0, 3, 1, 4)
        qg = qg.reshape(n_kvh, n_s, group * n_t, dim)
        t_pos = torch.where(t_valid, q_pos[t_idx], PAD_POSITION)
        row_pos = t_pos.repeat(1, group)  # [S, R]

        ck, cv = (_rows(x, t_idx).float() for x in (chunk.cur_k, chunk.cur_v))  # [Hkv, S, Tq, D]
        parts = [_Part("cur", _scores(qg, ck, scale, t_pos, row_pos), cv, None, t_idx, t_valid)]

        h_idx, h_valid = _padded(h_off, batch, q.device)
        if h_idx.shape[1]:
            slots = high.slots[h_idx]
            key_pos = torch.where(h_valid, high.positions[h_idx], PAD_POSITION)
            hk, hv = (_rows(x, slots).float() for x in (kv.high_k, kv.high_v))
            parts.append(
                _Part("high", _scores(qg, hk, scale, key_pos, row_pos), hv, None, h_idx, h_valid)
            )

        l_idx, l_valid = _padded(l_off, batch, q.device)
        if l_idx.shape[1]:
            slots = low.slots[l_idx]
            key_pos = torch.where(l_valid, low.positions[l_idx], PAD_POSITION)
            k_scale, v_scale = (
                _rows(x, slots).float().squeeze(-1)[:, :, None, :]
                for x in (kv.low_k_scales, kv.low_v_scales)
            )  # [Hkv, S, 1, C]
            if dim % 2 == 0:
                lo, hi = _split_nibbles(_rows(kv.low_k_codes, slots))  # [Hkv, S, C, D/2] each
                q_even, q_odd = qg[..., 0::2].contiguous(), qg[..., 1::2].contiguous()
                raw = torch.matmul(q_even, lo.transpose(-1, -2))
                raw = raw + torch.matmul(q_odd, hi.transpose(-1, -2))
                lv = _rows(kv.low_v_codes, slots)
            else:  # odd head dim: the last byte holds one value, unpack the ordinary way
                unit = torch.ones((), device=q.device)
                lk = unpack_int4_unchecked(_rows(kv.low_k_codes, slots), unit, dim)
                raw = torch.matmul(qg, lk.transpose(-1, -2))
                lv = unpack_int4_unchecked(_rows(kv.low_v_codes, slots), unit, dim)
            scores = _masked(raw * (k_scale * scale), key_pos, row_pos)
            parts.append(_Part("low", scores, lv, v_scale, l_idx, l_valid))

        probs = torch.softmax(torch.cat([p.scores for p in parts], dim=-1), dim=-1)
        if masses is not None:  # per key: probability summed over real query rows and group heads
            real_rows = t_valid.repeat(1, group)[None, :, :, None]  # [1, S, R, 1]
            mass = (probs * real_rows).sum(dim=2).permute(1, 2, 0)  # [S, sum C, Hkv]
        acc = torch.zeros_like(qg)
        start = 0
        for part in parts:
            width = part.scores.shape[-1]
            acc += part.weighted_sum(probs[..., start : start + width])
            if masses is not None:
                masses[part.name][part.index[part.valid]] = mass[:, start : start + width][
                    part.valid
                ]
            start += width

        # [Hkv, S, G*Tq, D] -> [S, Tq, Hq, D], padding rows dropped
        o = acc.reshape(n_kvh, n_s, group, n_t, dim).permute(1, 3, 0, 2, 4)
        out[t_idx[t_valid]] = o.reshape(n_s, n_t, n_qh, dim)[t_valid]
