"""Symmetric per-row INT4 quantization with two signed nibbles per byte (paper App. B.5).

A *row* is the last dimension of the input: one token of one KV head. Every row gets its own
scale ``s = max|x| / 7`` computed in fp32, rounded to fp16 (round to nearest even), clamped
into ``[2**-24, 65504]`` (the smallest positive and the largest finite fp16) so that it is
always usable as a divisor. Codes are ``clip(round_half_even(x / s), -7, 7)`` where ``s`` is the
*stored* fp16 scale read back as fp32, so dequantization ``q * s`` uses exactly the value the
codes were computed against. An all-zero row stores zero codes and scale 1.0.

Packing: element ``2j`` goes to the low nibble and element ``2j + 1`` to the high nibble of
byte ``j``, each as 4-bit two's complement (``-7 -> 0x9``, ``7 -> 0x7``). An odd row length is
padded with one zero element, so the last byte's high nibble is 0.

Each op has a torch reference (``*_ref``, the CPU production path), a Triton kernel
(``*_triton``, bit-identical to the reference) and a ``backend="auto"`` dispatcher.
"""

from __future__ import annotations

import torch

__all__ = [
    "INT4_MAX",
    "dequantize_int4",
    "dequantize_int4_ref",
    "dequantize_int4_triton",
    "quantize_int4",
    "quantize_int4_ref",
    "quantize_int4_triton",
]

INT4_MAX = 7
"""Largest code magnitude; codes live in ``[-INT4_MAX, INT4_MAX]`` (-8 is never produced)."""

FP16_TINY = 2.0**-24
"""Smallest positive (subnormal) fp16 value: the lower bound of every scale."""

FP16_MAX = 65504.0
"""Largest finite fp16 value: the upper bound of every scale (rows with max|x| > 458528 clip)."""

BACKENDS = ("auto", "torch", "triton")


def packed_dim(dim: int) -> int:
    """Bytes per packed row of ``dim`` elements: two nibbles per byte, odd ``dim`` padded."""
    return (dim + 1) // 2


def _check_quantize_input(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"quantize_int4 expects a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"quantize_int4 expects a floating-point tensor, got {x.dtype}; "
            "convert it with .float() first"
        )
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(
            f"quantize_int4 needs a last (row) dimension of size >= 1, got shape {tuple(x.shape)}"
        )


def _check_dequantize_input(codes: torch.Tensor, scales: torch.Tensor, dim: int) -> None:
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
        got = codes.dtype if isinstance(codes, torch.Tensor) else type(codes).__name__
        raise TypeError(f"dequantize_int4 expects uint8 codes, got {got}")
    if not isinstance(scales, torch.Tensor) or not scales.is_floating_point():
        got = scales.dtype if isinstance(scales, torch.Tensor) else type(scales).__name__
        raise TypeError(f"dequantize_int4 expects floating-point (fp16) scales, got {got}")
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
        raise ValueError(f"dequantize_int4 needs the unpacked row length dim >= 1, got {dim!r}")
    if codes.dim() == 0 or codes.shape[-1] != packed_dim(dim):
        raise ValueError(
            f"codes of shape {tuple(codes.shape)} do not hold rows of dim={dim}: "
            f"the last dimension must be ceil(dim / 2) = {packed_dim(dim)}"
        )
    if scales.shape != codes.shape[:-1] + (1,):
        raise ValueError(
            f"scales must have shape {tuple(codes.shape[:-1]) + (1,)} (one per row of codes), "
            f"got {tuple(scales.shape)}"
        )


def row_scales_ref(x: torch.Tensor) -> torch.Tensor:
    """Per-row fp16 scales of ``x [..., D]`` -> ``[..., 1]`` (the rule in the module docstring)."""
    amax = x.float().abs().amax(dim=-1, keepdim=True)  # [..., 1] fp32
    # fp32 divide, round to fp16; clamping to FP16_MAX first equals saturating after the cast
    scale = (amax / INT4_MAX).clamp(max=FP16_MAX).to(torch.float16).float()
    scale = scale.clamp(min=FP16_TINY)
    scale = torch.where(amax == 0, torch.ones_like(scale), scale)
    return scale.to(torch.float16)


def quantize_int4_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize and pack rows to INT4 (torch reference; the CPU path).

    Parameters
    ----------
    x : torch.Tensor
        ``[..., D]`` any floating dtype, finite values; the last dimension is the row.

    Returns
    -------
    codes : torch.Tensor
        ``[..., ceil(D / 2)]`` uint8, two signed nibbles per byte (low nibble = even element).
    scales : torch.Tensor
        ``[..., 1]`` float16, one symmetric scale per row.

    Raises
    ------
    TypeError
        ``x`` is not a floating-point tensor.
    ValueError
        ``x`` has no last dimension or it is empty.
    """
    _check_quantize_input(x)
    dim = x.shape[-1]
    scales = row_scales_ref(x)  # [..., 1] fp16
    q = torch.round(x.float() / scales.float())  # round half to even
    q = q.clamp(-INT4_MAX, INT4_MAX).to(torch.int8)  # [..., D]
    if dim % 2:
        q = torch.nn.functional.pad(q, (0, 1))  # zero element in the high nibble
    nibbles = q.to(torch.uint8) & 0xF  # 4-bit two's complement
    codes = nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)  # [..., ceil(D/2)]
    return codes.contiguous(), scales


def dequantize_int4_ref(
    codes: torch.Tensor, scales: torch.Tensor, dim: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Unpack and rescale INT4 rows (torch reference; the CPU path).

    Parameters
    ----------
    codes : torch.Tensor
        ``[..., ceil(dim / 2)]`` uint8 packed codes from :func:`quantize_int4_ref`.
    scales : torch.Tensor
        ``[..., 1]`` float16 row scales.
    dim : int
        Row length before packing (drops the padding nibble of odd rows).
    dtype : torch.dtype
        Output dtype; the product ``q * s`` is formed in fp32 (exact) and then cast.

    Returns
    -------
    torch.Tensor
        ``[..., dim]`` of ``dtype``.

    Raises
    ------
    TypeError, ValueError
        Wrong dtypes, or shapes that do not match ``dim``.
    """
    _check_dequantize_input(codes, scales, dim)
    return unpack_int4_unchecked(codes, scales, dim).to(dtype)


def unpack_int4_unchecked(codes: torch.Tensor, scales: torch.Tensor, dim: int) -> torch.Tensor:
    """:func:`dequantize_int4_ref` to fp32 without input checks (the attention hot loop)."""
    signed = codes.view(torch.int8)  # [..., ceil(dim/2)], same bits
    low = (signed << 4) >> 4  # arithmetic shifts sign-extend each nibble
    high = signed >> 4
    q = torch.stack((low, high), dim=-1).flatten(-2)  # [..., 2*ceil(dim/2)], interleaved
    if q.shape[-1] != dim:
        q = q[..., :dim]  # drop the odd-dim padding
    return q.float() * scales.float()


def quantize_int4_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of :func:`quantize_int4_ref`, bit-identical to it (same shapes, errors)."""
    _check_quantize_input(x)
    from pask_agent.kernels._int4_triton import quantize_rows  # lazy: imports triton

    dim = x.shape[-1]
    lead = x.shape[:-1]
    rows = x.reshape(-1, dim)
    codes, scales = quantize_rows(rows)
    return codes.reshape(*lead, packed_dim(dim)), scales.reshape(*lead, 1)


def dequantize_int4_triton(
    codes: torch.Tensor, scales: torch.Tensor, dim: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Triton version of :func:`dequantize_int4_ref`, bit-identical to it (same shapes, errors)."""
    _check_dequantize_input(codes, scales, dim)
    from pask_agent.kernels._int4_triton import dequantize_rows  # lazy: imports triton

    lead = codes.shape[:-1]
    out = dequantize_rows(codes.reshape(-1, codes.shape[-1]), scales.reshape(-1, 1), dim, dtype)
    return out.reshape(*lead, dim)


def _use_triton(backend: str, tensor: torch.Tensor) -> bool:
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; valid backends: {list(BACKENDS)}")
    return backend == "triton" or (backend == "auto" and tensor.is_cuda)


def quantize_int4(x: torch.Tensor, *, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize rows to packed INT4; ``backend`` is "auto" (Triton on CUDA), "torch" or "triton".

    See :func:`quantize_int4_ref` for shapes and errors; an unknown backend raises ValueError.
    """
    if _use_triton(backend, x):
        return quantize_int4_triton(x)
    return quantize_int4_ref(x)


def dequantize_int4(
    codes: torch.Tensor,
    scales: torch.Tensor,
    dim: int,
    *,
    dtype: torch.dtype = torch.float32,
    backend: str = "auto",
) -> torch.Tensor:
    """Dequantize packed INT4 rows; ``backend`` is "auto" (Triton on CUDA), "torch" or "triton".

    See :func:`dequantize_int4_ref` for shapes and errors; an unknown backend raises ValueError.
    """
    if _use_triton(backend, codes):
        return dequantize_int4_triton(codes, scales, dim, dtype)
    return dequantize_int4_ref(codes, scales, dim, dtype)
