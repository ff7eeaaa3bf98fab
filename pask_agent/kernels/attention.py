"""Mixed-precision attention over a token-pool KV store (paper App. B.2, B.5).

Per layer the store keeps a HIGH pool of bf16 K/V rows and a LOW pool of packed INT4 rows
(``int4.py`` format, fp16 scales); each sequence owns a ragged list of slots in each pool plus the
absolute position of every slot's token. A batch of B sequences is attended at once: their
queries (and the current chunk's K/V, same layout) are concatenated along the token axis.

Each query of sequence b sees b's high keys, b's low keys (dequantized block by block, never the
whole pool) and b's current-chunk keys, restricted to ``key_position <= query_position``: this makes
the chunk causal and stays right across gaps left by released tokens. GQA maps query head ``h``
to KV head ``h // (Hq // Hkv)``. All parts share ONE softmax, merged online in fp32
(running max / running sum), i.e. ``o = sum_j e^{v_j - v} u_j / sum_j e^{v_j - v} l_j``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pask_agent.kernels import cpu_attention, decode_attention
from pask_agent.kernels.attention_inputs import (
    KeyScores,
    MixedKV,
    PoolView,
    QueryChunk,
    check_attention_inputs,
)
from pask_agent.kernels.int4 import BACKENDS, unpack_int4_unchecked

__all__ = [
    "LOW_BLOCK",
    "KeyScores",
    "MixedKV",
    "PoolView",
    "QueryChunk",
    "mixed_attention",
    "mixed_attention_cpu",
    "mixed_attention_ref",
    "mixed_attention_triton",
]

ATTENTION_BACKENDS = (*BACKENDS, "native")

LOW_BLOCK = 256
"""Low-pool keys dequantized at a time by the reference (bounds the fp32 scratch per step)."""

HOIST_ROWS = 1 << 15
"""While the step's pool rows (all sequences, both pools) number at most this, the reference
gathers and dequantizes them with one call per pool, not one per sequence: a batch of B
decoding sequences then costs B slices instead of B gathers and unpacks per layer (about
33 MB of fp32 scratch at the bound for 2 KV heads of dim 64)."""


class _OnlineSoftmax:
    """Running max / sum / weighted values of one sequence, per (KV head, query row)."""

    def __init__(self, n_kvh: int, n_rows: int, dim: int, device: torch.device) -> None:
        # finite start: a block whose keys are all masked then leaves the state unchanged
        # (exp(-inf - m) = 0, alpha = 1) without an inf - inf
        self.m = torch.full((n_kvh, n_rows), -1.0e30, device=device)
        self.l = torch.zeros((n_kvh, n_rows), device=device)
        self.acc = torch.zeros((n_kvh, n_rows, dim), device=device)

    def add(self, scores: torch.Tensor, v: torch.Tensor) -> None:
        """``scores [Hkv, R, N]`` (masked keys at -inf), ``v [Hkv, N, D]`` fp32."""
        m_new = torch.maximum(self.m, scores.amax(dim=-1))  # [Hkv, R]
        alpha = torch.exp(self.m - m_new)  # rescales what was accumulated so far
        p = torch.exp(scores - m_new[..., None])  # [Hkv, R, N]
        self.l = self.l * alpha + p.sum(dim=-1)
        self.acc = self.acc * alpha[..., None] + torch.matmul(p, v)
        self.m = m_new


def _scores(
    qg: torch.Tensor, q_rows_pos: torch.Tensor, k: torch.Tensor, k_pos: torch.Tensor, scale: float
) -> torch.Tensor:
    """``qg [Hkv, R, D]``, ``k [Hkv, N, D]`` -> masked scaled scores ``[Hkv, R, N]``."""
    s = torch.matmul(qg, k.transpose(1, 2)) * scale
    visible = k_pos[None, :] <= q_rows_pos[:, None]  # [R, N]
    return s.masked_fill(~visible, float("-inf"))


def _key_mass(scores: torch.Tensor, state: _OnlineSoftmax) -> torch.Tensor:
    """Final probabilities of ``scores [Hkv, R, N]`` summed over query rows -> ``[N, Hkv]``."""
    p = torch.exp(scores - state.m[..., None]) / state.l[..., None]
    return p.sum(dim=1).transpose(0, 1)


def mixed_attention_ref(
    chunk: QueryChunk,
    kv: MixedKV,
    *,
    scale: float,
    return_key_scores: bool = False,
    small_queries: Callable[..., None] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, KeyScores]:
    """Attention of B ragged sequences over high (bf16), low (INT4) and current K/V (reference).

    This is also the CPU production path, fp32 throughout. Sequences with a few queries (decode
    steps) are attended together in padded batches (``decode_attention.py``) unless key scores
    are asked for; the others go through a Python loop over sequences and low-pool blocks,
    batched matmuls over gathered rows everywhere else. When every sequence takes the loop,
    the gathers and the INT4 unpacking run once for the whole batch (``HOIST_ROWS``).

    Parameters
    ----------
    chunk : QueryChunk
        ``[T, Hq, D]`` queries of the B sequences concatenated, their positions and their own
        keys/values (the current chunk).
    kv : MixedKV
        One layer's stored rows: BF16 and packed INT4 (App. B.5) pools, and which rows each
        sequence reads.
    scale : float
        Softmax temperature applied to ``q . k`` (usually ``D ** -0.5``).
    return_key_scores : bool
        Also return :class:`KeyScores` (attention mass per key).
    small_queries : callable, optional
        How the decode-sized sequences are attended when no key scores are asked for, called
        as ``small_queries(out, seqs, chunk, kv, scale=scale)``; ``mixed_attention_cpu`` passes
        the compiled kernel's. The default, and the path whenever key scores are asked for, is
        ``decode_attention.attend_small_queries``.

    Returns
    -------
    torch.Tensor or (torch.Tensor, KeyScores)
        ``[T, Hq, D]`` float32 attention output (and the key scores if asked).

    Raises
    ------
    ValueError, TypeError
        ``chunk`` and ``kv`` do not belong together (the message names the field).
    """
    check_attention_inputs(chunk, kv)
    q, q_pos, high, low = chunk.q, chunk.q_pos, kv.high, kv.low
    q_off, h_off, l_off = chunk.bounds, kv.high_bounds, kv.low_bounds
    n_tok, n_qh, dim = q.shape
    n_kvh = chunk.cur_k.shape[1]
    group = n_qh // n_kvh
    out = torch.empty((n_tok, n_qh, dim), dtype=torch.float32, device=q.device)
    if return_key_scores:
        mass_high = torch.zeros((high.slots.shape[0], n_kvh), device=q.device)
        mass_low = torch.zeros((low.slots.shape[0], n_kvh), device=q.device)
        mass_cur = torch.zeros((n_tok, n_kvh), device=q.device)
    n_seq = len(q_off) - 1
    masses = None
    if return_key_scores:
        masses = {"high": mass_high, "low": mass_low, "cur": mass_cur}
    # sequences with a few queries (decode steps): one padded batch for all of them
    small = decode_attention.SMALL_QUERIES
    batched = [b for b in range(n_seq) if 0 < q_off[b + 1] - q_off[b] <= small]
    if small_queries is not None and masses is None:
        small_queries(out, batched, chunk, kv, scale=scale)
    else:
        decode_attention.attend_small_queries(out, batched, chunk, kv, scale=scale, masses=masses)
    looped = sorted(set(range(n_seq)) - set(batched))
    cur_kf, cur_vf = chunk.cur_k.float(), chunk.cur_v.float()
    # the per-sequence gathers are hoisted only when every sequence goes through the loop
    hoist = not batched and high.slots.shape[0] + low.slots.shape[0] <= HOIST_ROWS
    if hoist:  # [Mh, Hkv, D] and [Ml, Hkv, D] fp32, sequence b's rows at its offsets
        all_hk, all_hv = kv.high_k[high.slots].float(), kv.high_v[high.slots].float()
        all_lk = unpack_int4_unchecked(kv.low_k_codes[low.slots], kv.low_k_scales[low.slots], dim)
        all_lv = unpack_int4_unchecked(kv.low_v_codes[low.slots], kv.low_v_scales[low.slots], dim)

    for b in looped:
        t0, t1 = q_off[b], q_off[b + 1]
        n_q = t1 - t0
        if n_q == 0:
            continue
        # [Tb, Hq, D] -> [Hkv, G*Tb, D]; row r = g*Tb + t
        qg = q[t0:t1].float().reshape(n_q, n_kvh, group, dim).permute(1, 2, 0, 3)
        qg = qg.reshape(n_kvh, group * n_q, dim)
        rows_pos = q_pos[t0:t1].repeat(group)  # [G*Tb]
        state = _OnlineSoftmax(n_kvh, group * n_q, dim, q.device)
        kept: list[tuple[torch.Tensor, torch.Tensor, int]] = []  # (mass target, scores, start)

        # the high rows and the current chunk form one block: keys [Hkv, Nh + Tb, D]
        h0, h1 = h_off[b], h_off[b + 1]
        if hoist:
            hk, hv = all_hk[h0:h1], all_hv[h0:h1]
        else:
            idx = high.slots[h0:h1]
            hk, hv = kv.high_k[idx].float(), kv.high_v[idx].float()
        k = torch.cat((hk, cur_kf[t0:t1])).transpose(0, 1)
        v = torch.cat((hv, cur_vf[t0:t1])).transpose(0, 1)
        k_pos = torch.cat((high.positions[h0:h1], q_pos[t0:t1]))
        s = _scores(qg, rows_pos, k, k_pos, scale)
        state.add(s, v)
        if return_key_scores:
            kept.append((mass_high, s[..., : h1 - h0], h0))
            kept.append((mass_cur, s[..., h1 - h0 :], t0))

        l0, l1 = l_off[b], l_off[b + 1]
        if l1 > l0 and not hoist:
            # gather the packed bytes once (cheap: D/2 bytes a row), dequantize block by block
            idx = low.slots[l0:l1]
            k_codes, k_scales = kv.low_k_codes[idx], kv.low_k_scales[idx]
            v_codes, v_scales = kv.low_v_codes[idx], kv.low_v_scales[idx]
        for s0 in range(0, l1 - l0, LOW_BLOCK):
            s1 = min(s0 + LOW_BLOCK, l1 - l0)
            if hoist:
                k = all_lk[l0 + s0 : l0 + s1].transpose(0, 1)
                v = all_lv[l0 + s0 : l0 + s1].transpose(0, 1)
            else:
                k = unpack_int4_unchecked(k_codes[s0:s1], k_scales[s0:s1], dim).transpose(0, 1)
                v = unpack_int4_unchecked(v_codes[s0:s1], v_scales[s0:s1], dim).transpose(0, 1)
            s = _scores(qg, rows_pos, k, low.positions[l0 + s0 : l0 + s1], scale)
            state.add(s, v)
            if return_key_scores:
                kept.append((mass_low, s, l0 + s0))

        o = state.acc / state.l[..., None]  # [Hkv, G*Tb, D]
        out[t0:t1] = o.reshape(n_kvh, group, n_q, dim).permute(2, 0, 1, 3).reshape(n_q, n_qh, dim)
        for target, s, start in kept:
            target[start : start + s.shape[-1]] = _key_mass(s, state)

    if return_key_scores:
        return out, KeyScores(high=mass_high, low=mass_low, cur=mass_cur)
    return out


def mixed_attention_cpu(
    chunk: QueryChunk,
    kv: MixedKV,
    *,
    scale: float,
) -> torch.Tensor:
    """:func:`mixed_attention_ref` with its decode-step sequences attended by the compiled C
    kernel (``cpu_attention.py``), which reads BF16 and INT4 rows without widening whole pools;
    sequences with many queries (prefill chunks) stay on the torch path. No key scores.

    Raises
    ------
    RuntimeError
        The kernel could not be built here (``cpu_attention.native_status()`` says why).
    """
    return mixed_attention_ref(  # type: ignore[return-value]
        chunk, kv, scale=scale, small_queries=cpu_attention.attend_small_queries_native
    )


def mixed_attention_triton(
    chunk: QueryChunk,
    kv: MixedKV,
    *,
    scale: float,
    return_key_scores: bool = False,
) -> torch.Tensor:
    """Triton version of :func:`mixed_attention_ref` (same inputs and output, no key scores).

    One program per (query token, KV head) serves the whole GQA group: it walks the sequence's
    high slots, then its low slots (bytes unpacked and scaled in-kernel), then the current chunk,
    with one online softmax.

    Raises
    ------
    ValueError
        ``return_key_scores=True`` (use the torch reference), or inconsistent inputs.
    """
    if return_key_scores:
        raise ValueError(
            "mixed_attention_triton does not return key scores; call mixed_attention_ref "
            "(or mixed_attention(..., backend='torch')) when a policy needs them"
        )
    check_attention_inputs(chunk, kv)
    from pask_agent.kernels._attention_triton import launch_mixed_attention  # lazy: triton

    return launch_mixed_attention(chunk, kv, scale=scale)


def mixed_attention(
    chunk: QueryChunk,
    kv: MixedKV,
    *,
    scale: float,
    return_key_scores: bool = False,
    backend: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, KeyScores]:
    """Dispatch to the Triton kernel ("auto" on CUDA, or "triton"), the compiled CPU decode
    kernel ("auto" on a CPU where it builds, or "native") or the torch reference ("torch", or
    "auto" on a CPU without a C compiler).

    Key scores always come from the reference ("auto" picks it when they are asked for).
    See :func:`mixed_attention_ref` for arguments; an unknown backend raises ValueError.
    """
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(
            f"unknown kernel backend {backend!r}; valid backends: {list(ATTENTION_BACKENDS)}"
        )
    on_cuda = chunk.q.is_cuda
    use_triton = backend == "triton" or (backend == "auto" and on_cuda and not return_key_scores)
    if use_triton:
        return mixed_attention_triton(chunk, kv, scale=scale, return_key_scores=return_key_scores)
    native = backend == "native" or (
        backend == "auto" and not on_cuda and cpu_attention.native_kernel() is not None
    )
    if native and not return_key_scores:
        return mixed_attention_cpu(chunk, kv, scale=scale)
    return mixed_attention_ref(chunk, kv, scale=scale, return_key_scores=return_key_scores)
