"""Triton kernels for INT4 quantize/pack and dequantize (format in ``int4.py``).

Imported lazily by ``int4.py`` so that importing the package never imports Triton, and so that
``TRITON_INTERPRET=1`` set by a test harness is honoured when the kernels are decorated.
Both kernels work on a 2-D tile of ``BLOCK_R`` rows x ``BLOCK_H`` byte columns; the even and
odd elements of a row are loaded as two stride-2 tiles that map one-to-one onto the nibbles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_R = 16  # rows per program


@triton.jit
def round_half_even(y):
    """Round fp32 to the nearest integer, ties to even, exactly (any |y| < 2**23)."""
    a = tl.abs(y)
    r = tl.floor(a)
    f = a - r  # exact for a >= 0
    odd = (r - 2.0 * tl.floor(r * 0.5)) == 1.0
    up = (f > 0.5) | ((f == 0.5) & odd)
    r = tl.where(up, r + 1.0, r)
    return tl.where(y < 0, -r, r)


@triton.jit
def _quantize_kernel(
    x_ptr,
    codes_ptr,
    scales_ptr,
    n_rows,
    dim,
    stride_x_row,
    stride_x_col,
    n_bytes,
    BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
    TINY: tl.constexpr,
    FP16_MAX: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # [R]
    cols = tl.arange(0, BLOCK_H)  # byte index j
    row_ok = rows < n_rows
    even_ok = row_ok[:, None] & (2 * cols[None, :] < dim)
    odd_ok = row_ok[:, None] & (2 * cols[None, :] + 1 < dim)
    base = x_ptr + rows[:, None].to(tl.int64) * stride_x_row
    x_even = tl.load(base + (2 * cols[None, :]) * stride_x_col, mask=even_ok, other=0.0)
    x_odd = tl.load(base + (2 * cols[None, :] + 1) * stride_x_col, mask=odd_ok, other=0.0)
    x_even = x_even.to(tl.float32)
    x_odd = x_odd.to(tl.float32)

    amax = tl.maximum(tl.max(tl.abs(x_even), axis=1), tl.max(tl.abs(x_odd), axis=1))  # [R]
    # fp32 divide, round to fp16 (nearest even, like torch); clamping to FP16_MAX before the
    # cast gives the same value as saturating after it, without an inf in between
    s16 = tl.minimum(tl.math.div_rn(amax, 7.0), FP16_MAX).to(tl.float16)
    s = tl.maximum(s16.to(tl.float32), TINY)
    s = tl.where(amax == 0.0, 1.0, s)

    q_even = round_half_even(tl.math.div_rn(x_even, s[:, None]))
    q_odd = round_half_even(tl.math.div_rn(x_odd, s[:, None]))
    q_even = tl.minimum(tl.maximum(q_even, -7.0), 7.0).to(tl.int32)
    q_odd = tl.minimum(tl.maximum(q_odd, -7.0), 7.0).to(tl.int32)
    byte = (q_even & 0xF) | ((q_odd & 0xF) << 4)  # padding element is 0 -> high nibble 0

    out_ok = row_ok[:, None] & (cols[None, :] < n_bytes)
    out = codes_ptr + rows[:, None].to(tl.int64) * n_bytes + cols[None, :]
    tl.store(out, byte.to(tl.uint8), mask=out_ok)
    tl.store(scales_ptr + rows, s.to(tl.float16), mask=row_ok)


@triton.jit
def _dequantize_kernel(
    codes_ptr,
    scales_ptr,
    out_ptr,
    n_rows,
    dim,
    stride_c_row,
    stride_s_row,
    n_bytes,
    BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # [R]
    cols = tl.arange(0, BLOCK_H)
    row_ok = rows < n_rows
    in_ok = row_ok[:, None] & (cols[None, :] < n_bytes)
    c_ptr = codes_ptr + rows[:, None].to(tl.int64) * stride_c_row + cols[None, :]
    byte = tl.load(c_ptr, mask=in_ok, other=0).to(tl.int32)
    lo = byte & 0xF
    hi = (byte >> 4) & 0xF
    lo = lo - ((lo & 8) << 1)  # sign-extend the 4-bit value
    hi = hi - ((hi & 8) << 1)
    s = tl.load(scales_ptr + rows.to(tl.int64) * stride_s_row, mask=row_ok, other=1.0)
    s = s.to(tl.float32)[:, None]
    out_row = out_ptr + rows[:, None].to(tl.int64) * dim
    tl.store(out_row + 2 * cols[None, :], lo.to(tl.float32) * s, mask=in_ok)
    odd_ok = row_ok[:, None] & (2 * cols[None, :] + 1 < dim)
    tl.store(out_row + 2 * cols[None, :] + 1, hi.to(tl.float32) * s, mask=odd_ok)


def _block_h(n_bytes: int) -> int:
    return max(triton.next_power_of_2(n_bytes), 2)


def quantize_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows [R, D]`` float -> ``(codes [R, ceil(D/2)] uint8, scales [R, 1] fp16)``."""
    n_rows, dim = rows.shape
    n_bytes = (dim + 1) // 2
    codes = torch.empty((n_rows, n_bytes), dtype=torch.uint8, device=rows.device)
    scales = torch.empty((n_rows, 1), dtype=torch.float16, device=rows.device)
    if n_rows == 0:
        return codes, scales
    grid = (triton.cdiv(n_rows, BLOCK_R),)
    _quantize_kernel[grid](
        rows,
        codes,
        scales,
        n_rows,
        dim,
        rows.stride(0),
        rows.stride(1),
        n_bytes,
        BLOCK_R=BLOCK_R,
        BLOCK_H=_block_h(n_bytes),
        TINY=2.0**-24,
        FP16_MAX=65504.0,
    )
    return codes, scales


def dequantize_rows(
    codes: torch.Tensor, scales: torch.Tensor, dim: int, dtype: torch.dtype
) -> torch.Tensor:
    """``codes [R, ceil(dim/2)] uint8``, ``scales [R, 1]`` -> ``[R, dim]`` of ``dtype``."""
    n_rows, n_bytes = codes.shape
    out = torch.empty((n_rows, dim), dtype=torch.float32, device=codes.device)
    if n_rows == 0:
        return out.to(dtype)
    if codes.stride(1) != 1:
        codes = codes.contiguous()
    grid = (triton.cdiv(n_rows, BLOCK_R),)
    _dequantize_kernel[grid](
        codes,
        scales,
        out,
        n_rows,
        dim,
        codes.stride(0),
        scales.stride(0),
        n_bytes,
        BLOCK_R=BLOCK_R,
        BLOCK_H=_block_h(n_bytes),
    )
    return out.to(dtype)
