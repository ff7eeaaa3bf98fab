"""One list of kernel implementations that every kernel test runs over (STYLE rule 12).

By default everything runs on the CPU and the Triton kernels run under ``TRITON_INTERPRET=1``,
which must be set before any ``@triton.jit`` kernel is decorated: the kernel modules are
imported lazily by ``pask_agent.kernels``, so setting it here, at collection time, is enough.

On a machine with a GPU run ``PASK_KERNEL_DEVICE=cuda pytest tests/kernels``: the Triton
kernels are then compiled for CUDA (no interpreter), the torch reference is also run on CUDA,
and every result is still compared with the CPU reference.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import pytest

KERNEL_DEVICE = os.environ.get("PASK_KERNEL_DEVICE", "cpu")
if KERNEL_DEVICE not in ("cpu", "cuda"):
    raise pytest.UsageError(f"PASK_KERNEL_DEVICE must be 'cpu' or 'cuda', got {KERNEL_DEVICE!r}")
if KERNEL_DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from pask_agent.kernels.attention import (  # noqa: E402
    mixed_attention_cpu,
    mixed_attention_ref,
    mixed_attention_triton,
)
from pask_agent.kernels.int4 import (  # noqa: E402
    dequantize_int4_ref,
    dequantize_int4_triton,
    quantize_int4_ref,
    quantize_int4_triton,
)

if KERNEL_DEVICE == "cuda" and not torch.cuda.is_available():
    raise pytest.UsageError("PASK_KERNEL_DEVICE=cuda but torch sees no CUDA device")


@dataclass(frozen=True)
class KernelImpl:
    """One implementation of every kernel, and the device its inputs must live on."""

    name: str
    device: str
    quantize: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    dequantize: Callable[..., torch.Tensor]
    attention: Callable[..., torch.Tensor]


KERNEL_IMPLS: tuple[KernelImpl, ...] = (
    KernelImpl("torch", "cpu", quantize_int4_ref, dequantize_int4_ref, mixed_attention_ref),
    # the compiled C decode kernel: decode-sized sequences in C, the rest through the torch path
    KernelImpl("native", "cpu", quantize_int4_ref, dequantize_int4_ref, mixed_attention_cpu),
    KernelImpl(
        "triton",
        KERNEL_DEVICE,
        quantize_int4_triton,
        dequantize_int4_triton,
        mixed_attention_triton,
    ),
) + (
    (KernelImpl("torch-cuda", "cuda", quantize_int4_ref, dequantize_int4_ref, mixed_attention_ref),)
    if KERNEL_DEVICE == "cuda"
    else ()
)


@pytest.fixture(params=KERNEL_IMPLS, ids=lambda impl: impl.name)
def impl(request: pytest.FixtureRequest) -> KernelImpl:
    """Each kernel test runs once per entry of ``KERNEL_IMPLS``."""
    return request.param


@pytest.fixture
def triton_device() -> str:
    """Where Triton kernels run in this session: "cpu" (interpreter) or "cuda" (compiled)."""
    return KERNEL_DEVICE
