"""Triton kernel for mixed-precision attention over bf16 + INT4 + current K/V (see attention.py).

Imported lazily by ``attention.py`` (Triton decides at decoration time whether it interprets).
One program serves one (query token, KV head) pair and all ``G = Hq // Hkv`` query heads of
that group as a ``[BLOCK_G, D_PAD]`` tile. It walks its sequence's high slots, low slots and
current-chunk keys in ``BLOCK_N`` blocks through the slot indirection, with one online softmax
in base 2. Dots use ``input_precision="ieee"``: fp32 FMA on GPUs (TF32 would cost ~1e-3 relative
accuracy) and the interpreter's correct fp32 path. INT4 bytes are unpacked into two nibble tiles
that ``tl.interleave`` puts back into element order (even element = low nibble).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from pask_agent.kernels.attention_inputs import MixedKV, QueryChunk

BLOCK_N = 32  # keys per block


@triton.jit
def _attend(acc, m_i, l_i, q, k, v, visible, qk_scale):
    """Fold one key block into the running state; ``q [G, Dp]``, ``k``/``v [N, Dp]`` fp32."""
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale  # [G, N], log2 units
    s = tl.where(visible[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: m_i starts at -1e30
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
    return acc, m_new, l_i


@triton.jit
def _unpack_int4(codes_ptr, scales_ptr, slot, kv_head, stride_cn, stride_ch, stride_cb,
                 stride_sn, stride_sh, n_bytes, n_ok, BLOCK_DH: tl.constexpr):  # fmt: skip
    """Rows ``slot [N]`` of one KV head -> dequantized ``[N, 2 * BLOCK_DH]`` fp32."""
    j = tl.arange(0, BLOCK_DH)
    mask = n_ok[:, None] & (j[None, :] < n_bytes)
    ptr = codes_ptr + slot[:, None] * stride_cn + kv_head * stride_ch + j[None, :] * stride_cb
    byte = tl.load(ptr, mask=mask, other=0).to(tl.int32)
    lo = byte & 0xF
    hi = (byte >> 4) & 0xF
    lo = (lo - ((lo & 8) << 1)).to(tl.float32)  # sign-extend
    hi = (hi - ((hi & 8) << 1)).to(tl.float32)
    s = tl.load(scales_ptr + slot * stride_sn + kv_head * stride_sh, mask=n_ok, other=0.0)
    rows = tl.interleave(lo, hi)  # [N, 2*BLOCK_DH], element 2j = low nibble of byte j
    return rows * s.to(tl.float32)[:, None]


@triton.jit
def _mixed_attention_kernel(
    q_ptr, q_pos_ptr, q_seq_ptr, q_off_ptr, ck_ptr, cv_ptr,
    hk_ptr, hv_ptr, h_slot_ptr, h_pos_ptr, h_off_ptr,
    lkc_ptr, lvc_ptr, lks_ptr, lvs_ptr, l_slot_ptr, l_pos_ptr, l_off_ptr,
    out_ptr,
    s_qt, s_qh, s_qd, s_ckt, s_ckh, s_ckd, s_cvt, s_cvh, s_cvd,
    s_hkn, s_hkh, s_hkd, s_hvn, s_hvh, s_hvd,
    s_lkn, s_lkh, s_lkb, s_lvn, s_lvh, s_lvb,
    s_lksn, s_lksh, s_lvsn, s_lvsh,
    s_ot, s_oh,
    qk_scale, dim, n_bytes, group,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DH: tl.constexpr,
):  # fmt: skip
    tok = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    seq = tl.load(q_seq_ptr + tok)
    qpos = tl.load(q_pos_ptr + tok)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, 2 * BLOCK_DH)
    g_ok = g < group
    d_ok = d < dim
    heads = kvh * group + g
    q = tl.load(
        q_ptr + tok * s_qt + heads[:, None] * s_qh + d[None, :] * s_qd,
        mask=g_ok[:, None] & d_ok[None, :],
        other=0.0,
    ).to(tl.float32)
    m_i = tl.full([BLOCK_G], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, 2 * BLOCK_DH], tl.float32)

    # HIGH pool: bf16 rows through the slot indirection
    start = tl.load(h_off_ptr + seq)
    end = tl.load(h_off_ptr + seq + 1)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < end
        slot = tl.load(h_slot_ptr + n, mask=n_ok, other=0)
        visible = n_ok & (tl.load(h_pos_ptr + n, mask=n_ok, other=0) <= qpos)
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(hk_ptr + slot[:, None] * s_hkn + kvh * s_hkh + d[None, :] * s_hkd,
                    mask=kv_mask, other=0.0).to(tl.float32)  # fmt: skip
        v = tl.load(hv_ptr + slot[:, None] * s_hvn + kvh * s_hvh + d[None, :] * s_hvd,
                    mask=kv_mask, other=0.0).to(tl.float32)  # fmt: skip
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, k, v, visible, qk_scale)

    # LOW pool: packed INT4 rows, unpacked and scaled per block
    start = tl.load(l_off_ptr + seq)
    end = tl.load(l_off_ptr + seq + 1)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < end
        slot = tl.load(l_slot_ptr + n, mask=n_ok, other=0)
        visible = n_ok & (tl.load(l_pos_ptr + n, mask=n_ok, other=0) <= qpos)
        k = _unpack_int4(lkc_ptr, lks_ptr, slot, kvh, s_lkn, s_lkh, s_lkb,
                         s_lksn, s_lksh, n_bytes, n_ok, BLOCK_DH)  # fmt: skip
        v = _unpack_int4(lvc_ptr, lvs_ptr, slot, kvh, s_lvn, s_lvh, s_lvb,
                         s_lvsn, s_lvsh, n_bytes, n_ok, BLOCK_DH)  # fmt: skip
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, k, v, visible, qk_scale)

    # current chunk: this sequence's own tokens, causal by position
    start = tl.load(q_off_ptr + seq)
    end = tl.load(q_off_ptr + seq + 1)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < end
        visible = n_ok & (tl.load(q_pos_ptr + n, mask=n_ok, other=0) <= qpos)
        kv_mask = n_ok[:, None] & d_ok[None, :]
        nn = n.to(tl.int64)
        k = tl.load(ck_ptr + nn[:, None] * s_ckt + kvh * s_ckh + d[None, :] * s_ckd,
                    mask=kv_mask, other=0.0).to(tl.float32)  # fmt: skip
        v = tl.load(cv_ptr + nn[:, None] * s_cvt + kvh * s_cvh + d[None, :] * s_cvd,
                    mask=kv_mask, other=0.0).to(tl.float32)  # fmt: skip
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, k, v, visible, qk_scale)

    out = acc / l_i[:, None]
    o_ptr = out_ptr + tok * s_ot + heads[:, None] * s_oh + d[None, :]
    tl.store(o_ptr, out, mask=g_ok[:, None] & d_ok[None, :])


def _nonempty(t: torch.Tensor) -> torch.Tensor:
    """A 1-row stand-in for an empty tensor: some launchers reject null data pointers."""
    if t.numel() > 0:
        return t
    return torch.zeros((1, *t.shape[1:]), dtype=t.dtype, device=t.device)


def launch_mixed_attention(chunk: QueryChunk, kv: MixedKV, *, scale: float) -> torch.Tensor:
    """Launch the kernel on a checked chunk and view: the one place they become flat arguments."""
    q, q_pos, cur_k, cur_v = chunk.q, chunk.q_pos, chunk.cur_k, chunk.cur_v
    n_tok, n_qh, dim = q.shape
    n_kvh = cur_k.shape[1]
    group = n_qh // n_kvh
    dev = q.device
    out = torch.empty((n_tok, n_qh, dim), dtype=torch.float32, device=dev)
    if n_tok == 0:
        return out
    q_off = chunk.bounds
    lengths = torch.tensor([b - a for a, b in zip(q_off, q_off[1:], strict=False)])
    q_seq = torch.repeat_interleave(torch.arange(len(lengths)), lengths).to(dev)
    q_offsets = torch.tensor(q_off, dtype=torch.int64).to(dev)
    high, low = kv.high, kv.low
    h_off = high.offsets.to(device=dev, dtype=torch.int64)
    l_off = low.offsets.to(device=dev, dtype=torch.int64)
    tensors = [
        kv.high_k, kv.high_v, high.slots, high.positions,
        kv.low_k_codes, kv.low_v_codes, kv.low_k_scales, kv.low_v_scales, low.slots, low.positions,
    ]  # fmt: skip
    hk, hv, h_slot, h_pos, lkc, lvc, lks, lvs, l_slot, l_pos = [_nonempty(t) for t in tensors]
    n_bytes = (dim + 1) // 2
    block_dh = max(triton.next_power_of_2(n_bytes), 8)  # dot needs K >= 16
    grid = (n_tok, n_kvh)
    _mixed_attention_kernel[grid](
        q, q_pos, q_seq, q_offsets, cur_k, cur_v,
        hk, hv, h_slot, h_pos, h_off,
        lkc, lvc, lks, lvs, l_slot, l_pos, l_off,
        out,
        *q.stride(), *cur_k.stride(), *cur_v.stride(),
        *hk.stride(), *hv.stride(),
        *lkc.stride(), *lvc.stride(),
        lks.stride(0), lks.stride(1), lvs.stride(0), lvs.stride(1),
        out.stride(0), out.stride(1),
        float(scale) * math.log2(math.e), dim, n_bytes, group,
        BLOCK_G=max(triton.next_power_of_2(group), 16),
        BLOCK_N=BLOCK_N,
        BLOCK_DH=block_dh,
    )  # fmt: skip
    return out
