"""Linear layers that read quantized weights on a CPU: the decode step reads less memory.

A decode step on this CPU is bound by how many weight bytes it reads: the default model's
linear layers hold 494 M parameters, 1.98 GB as fp32, read once per step at about 28 GB/s.
The default model ships as a GGUF whose weights are already 4-8 bits (Q5_0, Q4_K, Q6_K,
Q8_0); we dequantize them at load, so an fp32 step reads four times what the file holds.
torch's CPU kernels for weight-only quantized matmuls read the weights as they are stored and
take bf16 activations:

- ``"int8"``: one symmetric int8 scale per output channel (``aten._weight_int8pack_mm``).
  Requantizing the GGUF's 5-bit groups onto a per-channel 8-bit grid moves each weight by at
  most an eighth of its original step, so this is the near-lossless choice.
- ``"int4"``: 4-bit codes with a scale and a zero per group of 32 inputs
  (``aten._weight_int4pack_mm_for_cpu``), min-max within the group. Lossy for tensors the
  GGUF keeps at 5-8 bits; half the bytes of int8.

Measured side by side in ``results/cpu_paths.md``. Activations go in as bf16 and outputs come
back as the caller's dtype; the rounding this adds is bounded in
``tests/runtime/test_quantized_linear.py`` against the fp32 layer.

``quantize_linear_layers`` swaps each fp32 ``nn.Linear`` in place, releasing the checkpoint's
file pages as it goes (``cpu_linear.py`` explains why that matters). A weight another module
also reads (a tied output head's embedding) stays as it is.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from pask_agent.errors import ConfigError
from pask_agent.runtime.memory.host_memory import FileMappings, give_back_freed_heap
from pask_agent.runtime.models.weight_formats import WEIGHT_FORMATS

__all__ = [
    "Int4Linear",
    "Int8Linear",
    "QuantizedLinear",
    "check_weight_format",
    "fuse_rows",
    "quantize_linear_layers",
    "require_weights",
]

INT4_GROUP = 32  # inputs per int4 scale/zero pair; the GGUF's own block size
INT4_ROW_BLOCK = 64  # the CPU int4 packing interleaves output channels in blocks of this many


class QuantizedLinear(nn.Module):
    """Shared part of the quantized layers: the bias, the shapes and the dtype round trip."""

    format: str = ""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        bias = linear.bias
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:  # [rows, in] bf16 -> [rows, out] bf16
        raise NotImplementedError

    def _codes(self) -> tuple[str, int]:
        """The buffer whose rows are output channels, and how many rows can be cut apart."""
        raise NotImplementedError

    def _per_channel(self) -> tuple[str, int]:
        """The per-output-channel buffer (scales) and its output-channel dimension."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._matmul(x.reshape(-1, self.in_features).to(torch.bfloat16)).to(x.dtype)
        bias = self.bias
        if bias is not None:
            y += bias  # y is this call's own tensor
        return y if x.dim() == 2 else y.view(*x.shape[:-1], self.out_features)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized ``[out, in]`` weight (a new fp32 tensor), for code that reads it."""
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        return self._matmul(eye).float().T.contiguous()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.format}"


class Int8Linear(QuantizedLinear):
    """Weight-only int8, one scale per output channel."""

    format = "int8"

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        w = linear.weight.detach().float()
        scales = (w.abs().amax(dim=1) / 127.0).clamp(min=torch.finfo(torch.float32).tiny)
        codes = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
        self.register_buffer("codes", codes)
        self.register_buffer("scales", scales.to(torch.bfloat16))

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x, self.codes, self.scales)

    def _codes(self) -> tuple[str, int]:
        return "codes", 1

    def _per_channel(self) -> tuple[str, int]:
        return "scales", 0


class Int4Linear(QuantizedLinear):
    """Weight-only int4, a scale and a zero per group of ``INT4_GROUP`` inputs (min-max)."""

    format = "int4"

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        n, k = self.out_features, self.in_features
        groups = linear.weight.detach().float().reshape(n, k // INT4_GROUP, INT4_GROUP)
        low, high = groups.amin(dim=-1, keepdim=True), groups.amax(dim=-1, keepdim=True)
        scale = ((high - low) / 15.0).clamp(min=torch.finfo(torch.float32).tiny)
        codes = torch.round((groups - low) / scale).clamp(0, 15).to(torch.int32).reshape(n, k)
        # the kernel computes (code - 8) * scale + zero; [k / group, n, 2] as it expects
        zero = low + 8.0 * scale
        pairs = torch.stack([scale.squeeze(-1).T, zero.squeeze(-1).T], dim=-1)
        self.register_buffer("scales_and_zeros", pairs.to(torch.bfloat16).contiguous())
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        self.register_buffer("packed", packed)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, self.packed, INT4_GROUP, self.scales_and_zeros
        )

    def _codes(self) -> tuple[str, int]:
        return "packed", INT4_ROW_BLOCK

    def _per_channel(self) -> tuple[str, int]:
        return "scales_and_zeros", 1


def fuse_rows(parts: list[nn.Module]) -> QuantizedLinear | None:
    """One quantized layer computing ``parts`` (same input, same format) as one matmul, or
    ``None`` when they cannot be fused (not quantized alike, or cut inside a packed block).

    The kernels compute each output channel from its own row of codes, so the fused layer's
    columns equal each part's outputs exactly. The parts' codes become views into the fused
    layer's, so fusing costs no weight memory; their scales stay their own (the kernels read
    scales densely, and a column slice of the fused scales is not dense): an eighth of a byte
    per int4 weight, four bytes per int8 row.
    """
    first = parts[0]
    if not isinstance(first, QuantizedLinear) or len(parts) < 2:
        return None
    kind = type(first)
    if any(type(p) is not kind or p.in_features != first.in_features for p in parts):
        return None
    codes_name, block = first._codes()
    if any(p.out_features % block for p in parts):
        return None
    scales_name, channel_dim = first._per_channel()
    fused = kind.__new__(kind)
    nn.Module.__init__(fused)
    fused.in_features = first.in_features
    fused.out_features = sum(p.out_features for p in parts)
    with torch.no_grad():
        codes = torch.cat([getattr(p, codes_name) for p in parts])
        biases = [p.bias for p in parts]
        if all(b is None for b in biases):
            bias = None
        else:
            bias = torch.cat(
                [
                    b if b is not None else torch.zeros(p.out_features)
                    for b, p in zip(biases, parts, strict=True)
                ]
            )
    fused.register_buffer("bias", bias)
    fused.register_buffer(codes_name, codes)
    scales = torch.cat([getattr(p, scales_name) for p in parts], dim=channel_dim)
    fused.register_buffer(scales_name, scales.contiguous())
    start = 0
    for p in parts:  # the parts read the fused codes: one copy of the weights
        setattr(p, codes_name, codes[start : start + p.out_features])
        start += p.out_features
    return fused


_LAYERS: dict[str, type[QuantizedLinear]] = {"int8": Int8Linear, "int4": Int4Linear}


def check_weight_format(weights: str) -> None:
    """Refuse a weight format this torch build cannot run on the CPU, before any model loads."""
    if weights not in WEIGHT_FORMATS:
        raise ConfigError(f"weights={weights!r} is not one of {', '.join(WEIGHT_FORMATS)}")
    if weights != "fp32":
        _probe_kernel(weights)


@functools.cache
def _probe_kernel(weights: str) -> None:
    """Run the format's kernel once per process (every ``RuntimeConfig`` checks its format)."""
    probe = nn.Linear(2 * INT4_GROUP, 16, bias=False)
    try:
        _LAYERS[weights](probe)(torch.ones(1, 2 * INT4_GROUP))
    except (RuntimeError, NotImplementedError, AttributeError) as exc:
        others = ", ".join(w for w in WEIGHT_FORMATS if w != weights)
        raise ConfigError(
            f"weights={weights!r} cannot run on this machine ({exc}); use one of {others}"
        ) from exc


def require_weights(loaded: str, asked: str) -> None:
    """Refuse a runtime whose ``RuntimeConfig.weights`` differs from how its model was loaded:
    the layers are converted once, at load, and shared by every runtime on that model."""
    if loaded != asked:
        raise ConfigError(
            f"the model was loaded with weights={loaded!r} but the runtime asks for {asked!r}: "
            f"load it with load_model(..., weights={asked!r}) or open the runtime by model name"
        )


def _eligible(module: nn.Module, weights: str) -> bool:
    if type(module) is not nn.Linear:
        return False
    w = module.weight
    if w.device.type != "cpu" or w.dtype != torch.float32:
        return False
    # the int4 kernel packs 16 output channels at a time
    fits_int4 = module.in_features % INT4_GROUP == 0 and module.out_features % 16 == 0
    return weights != "int4" or fits_int4


def quantize_linear_layers(model: nn.Module, weights: str) -> int:
    """Replace every fp32 CPU ``nn.Linear`` of ``model`` by an ``Int8Linear`` or ``Int4Linear``
    (``weights``); return how many were replaced. ``"fp32"`` replaces none."""
    check_weight_format(weights)
    if weights == "fp32":
        return 0
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if _eligible(child, weights)
    ]
    linears = {id(child) for _, _, child in swaps}
    rest = [m for m in model.modules() if id(m) not in linears]
    mapped_files = FileMappings.of_this_process()
    with torch.no_grad():
        for module in rest:  # out of the checkpoint's file mapping (cpu_linear.py)
            for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
                if t.layout == torch.strided:
                    mapped, t.data = t.data, t.data.clone()
                    mapped_files.release(mapped)
        shared = {p.data_ptr() for m in rest for p in m.parameters(recurse=False)}
        for parent, name, child in swaps:
            setattr(parent, name, _LAYERS[weights](child))
            if child.weight.data_ptr() not in shared:  # its codes exist: the pages can go
                mapped_files.release(child.weight)
    give_back_freed_heap()  # the conversion's temporaries, so they do not stay resident
    return len(swaps)
