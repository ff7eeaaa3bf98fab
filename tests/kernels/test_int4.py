"""INT4 quantize/pack and dequantize (App. B.5): hand-computed bytes, error bound, ref parity."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import torch

from pask_agent.kernels.int4 import (
    INT4_MAX,
    dequantize_int4,
    dequantize_int4_ref,
    quantize_int4,
    quantize_int4_ref,
)

if TYPE_CHECKING:
    from conftest import KernelImpl

TINY = 2.0**-24  # smallest positive fp16

# (row, expected packed bytes, expected fp16 scale), computed by hand:
# byte j = code[2j] (low nibble) | code[2j+1] << 4, codes in 4-bit two's complement.
HAND_CASES = {
    # s = 7/7 = 1; codes 1, -7 (0x9), 7 (the clip value), 0.5 -> 0 and 2.5 -> 2 (ties to even);
    # odd dim: the last byte's high nibble is the zero padding.
    "odd_dim_clip_value_ties": ([1.0, -7.0, 7.0, 0.5, 2.5], [0x91, 0x07, 0x02], 1.0),
    # s = 3.5/7 = 0.5; x/s = -7, 3, -0.5 -> 0, 7, -3.5 -> -4 (0xC, tie to even)
    "negative_values": ([-3.5, 1.5, -0.25, 3.5, -1.75], [0x39, 0x70, 0x0C], 0.5),
    # all zero: zero codes, unit scale
    "zero_row": ([0.0, 0.0, 0.0, 0.0, 0.0], [0x00, 0x00, 0x00], 1.0),
    # max/7 = (3/7) * 2**-24 rounds to fp16 0 -> scale bounded below by 2**-24; codes 3, -1 (0xF)
    "tiny_row_scale_floor": ([3 * TINY, -TINY, 0.0, 0.0, TINY], [0xF3, 0x00, 0x01], TINY),
    # max/7 = (10/7) * 2**-24 rounds to the subnormal 2**-24, so 10 and -9 clip to 7 and -7
    "subnormal_scale_clips": ([10 * TINY, -9 * TINY, TINY], [0x97, 0x01], TINY),
    # max/7 overflows fp16: the scale saturates at 65504 and the code clips to 7
    "huge_row_scale_ceiling": ([1.0e6, 0.0], [0x07], 65504.0),
    # even dim, every byte full: s = 1.75/7 = 0.25; codes 7, -7 (0x9), -2 (0xE), 1
    "even_dim": ([1.75, -1.75, -0.5, 0.25], [0x97, 0x1E], 0.25),
}


def _to(impl: KernelImpl, *tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.to(impl.device) for t in tensors]


@pytest.mark.parametrize("case", list(HAND_CASES), ids=list(HAND_CASES))
def test_packed_bytes_match_hand_computed(impl: KernelImpl, case: str) -> None:
    row, want_bytes, want_scale = HAND_CASES[case]
    x = torch.tensor([row], dtype=torch.float32)
    codes, scales = impl.quantize(*_to(impl, x))
    codes, scales = codes.cpu(), scales.cpu()
    assert codes.dtype == torch.uint8 and scales.dtype == torch.float16
    assert codes.shape == (1, (len(row) + 1) // 2) and scales.shape == (1, 1)
    assert codes[0].tolist() == want_bytes
    assert scales[0, 0].item() == want_scale


def test_hand_case_dequantizes_to_code_times_scale(impl: KernelImpl) -> None:
    codes = torch.tensor([[0x91, 0x07, 0x02], [0x39, 0x70, 0x0C]], dtype=torch.uint8)
    scales = torch.tensor([[1.0], [0.5]], dtype=torch.float16)
    out = impl.dequantize(*_to(impl, codes, scales), 5).cpu()
    assert out.dtype == torch.float32
    assert out.tolist() == [[1.0, -7.0, 7.0, 0.0, 2.0], [-3.5, 1.5, 0.0, 3.5, -2.0]]


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((6, 3, 64), torch.bfloat16),
        ((5, 2, 80), torch.float32),
        ((9, 33), torch.float16),
        ((4, 1), torch.float32),
        ((0, 2, 64), torch.bfloat16),
    ],
    ids=["bf16_d64", "fp32_d80", "fp16_odd_d33", "d1", "no_rows"],
)
def test_round_trip_within_half_a_step(
    impl: KernelImpl, shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(hash(shape) % 1000)
    x = torch.randn(shape, generator=gen) * torch.rand(shape[:-1] + (1,), generator=gen) * 4
    x = x.to(dtype)
    if x.shape[0] > 1:
        x[1] = 0.0  # a zero row among ordinary ones
    codes, scales = impl.quantize(*_to(impl, x))
    ref_codes, ref_scales = quantize_int4_ref(x)
    assert torch.equal(codes.cpu(), ref_codes) and torch.equal(scales.cpu(), ref_scales)

    deq = impl.dequantize(codes, scales, shape[-1]).cpu()
    assert deq.shape == x.shape and deq.dtype == torch.float32
    s = scales.cpu().float()
    # |x - q*s| <= s/2: the division and the fp16 rounding of s add at most ~1e-6 relative
    assert ((x.float() - deq).abs() <= s * (0.5 + 1e-6)).all()
    amax = x.float().abs().amax(dim=-1, keepdim=True)
    assert torch.equal(s[amax == 0], torch.ones_like(s[amax == 0]))
    assert not deq[(amax == 0).expand_as(deq)].any()
    nibbles = torch.stack((codes.cpu() & 0xF, codes.cpu() >> 4))
    assert not (nibbles == 0x8).any(), "-8 must never be produced"
    if shape[-1] % 2:
        assert not (codes.cpu()[..., -1] >> 4).any(), "odd dim: padding nibble must be 0"


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [64, 80, 33])
def test_dequantize_matches_ref_on_all_byte_values(
    impl: KernelImpl, dim: int, out_dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(dim)
    n_bytes = (dim + 1) // 2
    codes = torch.randint(0, 256, (7, 2, n_bytes), generator=gen, dtype=torch.uint8)
    codes[0, 0, :16] = torch.arange(0, 256, 16, dtype=torch.uint8)[:n_bytes]  # every high nibble
    codes[0, 1, :16] = torch.arange(16, dtype=torch.uint8)[:n_bytes]  # every low nibble
    scales = (torch.rand(7, 2, 1, generator=gen) + 0.01).to(torch.float16)
    want = dequantize_int4_ref(codes, scales, dim, out_dtype)
    got = impl.dequantize(*_to(impl, codes, scales), dim, out_dtype).cpu()
    assert got.dtype == out_dtype and torch.equal(got, want)
    low = (codes[0, 1, :16] & 0xF).to(torch.int64)
    signed = torch.where(low >= 8, low - 16, low).float()
    expected = (signed * scales[0, 1].float()).to(out_dtype)
    assert torch.equal(want[0, 1, 0 : 2 * len(low) : 2], expected)


def test_non_contiguous_input_matches_contiguous(impl: KernelImpl) -> None:
    x = torch.randn(64, 10, generator=torch.Generator().manual_seed(3)).t()  # [10, 64] view
    assert not x.is_contiguous()
    codes, scales = impl.quantize(*_to(impl, x))
    ref_codes, ref_scales = quantize_int4_ref(x.contiguous())
    assert torch.equal(codes.cpu(), ref_codes) and torch.equal(scales.cpu(), ref_scales)


def test_dispatcher_picks_and_validates_backends(triton_device: str) -> None:
    x = torch.randn(3, 2, 17)
    ref = quantize_int4_ref(x)
    ref_deq = dequantize_int4_ref(*ref, 17, torch.bfloat16)
    # "auto" follows the tensor: the reference on CPU, Triton on CUDA; "triton" needs the device
    for backend, device in (("auto", "cpu"), ("torch", "cpu"), ("auto", triton_device),
                            ("triton", triton_device)):  # fmt: skip
        codes, scales = quantize_int4(x.to(device), backend=backend)
        assert codes.device.type == device
        assert torch.equal(codes.cpu(), ref[0]) and torch.equal(scales.cpu(), ref[1])
        deq = dequantize_int4(codes, scales, 17, dtype=torch.bfloat16, backend=backend)
        assert deq.dtype == torch.bfloat16 and torch.equal(deq.cpu(), ref_deq)
    with pytest.raises(ValueError, match="valid backends"):
        quantize_int4(x, backend="cuda")
    with pytest.raises(ValueError, match="valid backends"):
        dequantize_int4(*ref, 17, backend="numpy")


def test_bad_inputs_raise_typed_errors(impl: KernelImpl) -> None:
    with pytest.raises(TypeError, match="floating-point"):
        impl.quantize(torch.ones(2, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="last"):
        impl.quantize(torch.ones(2, 0))
    codes = torch.zeros(2, 3, dtype=torch.uint8)
    scales = torch.ones(2, 1, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"ceil\(dim / 2\) = 4"):
        impl.dequantize(codes, scales, 8)
    with pytest.raises(ValueError, match="scales must have shape"):
        impl.dequantize(codes, scales[:1], 5)
    with pytest.raises(TypeError, match="uint8"):
        impl.dequantize(codes.to(torch.int16), scales, 5)
    assert INT4_MAX == 7
