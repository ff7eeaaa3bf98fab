"""The model's fp32 linear layers through oneDNN on a CPU (weights converted once).

Decoding a 0.5B model on this CPU is mostly weight matmuls with a handful of rows: one per
running request. ``torch.nn.Linear`` sends them to MKL's sgemm, which at 1-8 rows reads the
weights at about half the speed oneDNN's inner product does once the weight is held as a
oneDNN tensor. Measured here on the default model's shapes, weights read from memory
(``results/cpu_paths.md``): the 896 x 151,936 output head takes 44.2 ms at 1 row and 91.1 ms
at 8 rows through ``nn.Linear``, 19.9 and 34.2 ms through oneDNN; the MLP projections gain
1.2-1.9x (the small k/v projections lose, 0.6x). Quantized weights read fewer bytes still
(``quantized_linear.py``).

``prepack_linear_layers`` swaps each ``nn.Linear`` for a ``OneDNNLinear`` in place. The dense
weight is released, except where another module shares it (a tied output head keeps the
embedding dense and adds a oneDNN copy: 545 MB more for the default model). Outputs differ
from ``nn.Linear`` by fp32 rounding.

The other parameters (embedding, norms) are copied into ordinary memory first. A model loaded
from safetensors keeps its whole checkpoint file mapped while any tensor still points into it,
so without the copy every page the conversion read would stay resident on top of the oneDNN
weights: the default model's whole 2.5 GB checkpoint (``tests/runtime/test_cpu_linear.py``
checks that its file-backed pages stay under a quarter of that). The mapping only goes when the
last tensor in it does, at the end of the conversion, so each converted weight's own pages are
dropped from the process as soon as its oneDNN copy exists (``madvise(MADV_DONTNEED)`` on a
file mapping: a page touched again is read back from the file, never lost). Without that the
conversion held the checkpoint and its copy at once, nearly twice what the process holds once
done; the test bounds the peak by what is held afterwards plus an eighth of the checkpoint.
"""

from __future__ import annotations

import torch
from torch import nn

from pask_agent.runtime.memory.host_memory import FileMappings
from pask_agent.runtime.models.quantized_linear import QuantizedLinear

__all__ = ["OneDNNLinear", "prepack_linear_layers", "step_weight_bytes"]


class OneDNNLinear(nn.Module):
    """``nn.Linear`` with its weight (and bias) held as oneDNN tensors; same inputs, outputs."""

    def __init__(self, linear: nn.Linear, *, shared: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # a weight another module also uses (a tied output head) stays reachable as it is
        self._shared_weight = linear.weight.detach() if shared else None
        with torch.no_grad():
            self.register_buffer("packed_weight", linear.weight.detach().to_mkldnn())
            bias = linear.bias
            self.register_buffer("packed_bias", None if bias is None else bias.detach().to_mkldnn())

    @property
    def weight(self) -> torch.Tensor:
        """The dense ``[out, in]`` weight, for code that reads it (a copy unless it is shared)."""
        if self._shared_weight is not None:
            return self._shared_weight
        return self.packed_weight.to_dense()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to_mkldnn()
        y = torch._C._nn.mkldnn_linear(flat, self.packed_weight, self.packed_bias).to_dense()
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN"


def _eligible(module: nn.Module) -> bool:
    if type(module) is not nn.Linear:  # before .weight: a OneDNNLinear's densifies its copy
        return False
    weight = getattr(module, "weight", None)
    return weight is not None and weight.device.type == "cpu" and weight.dtype == torch.float32


def prepack_linear_layers(model: nn.Module) -> int:
    """Replace every fp32 CPU ``nn.Linear`` of ``model`` by a ``OneDNNLinear``; return
    how many were replaced (0 on other devices or dtypes: the model is left as it was)."""
    if not torch.backends.mkldnn.is_available():
        return 0
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if _eligible(child)
    ]
    if not swaps:  # converted already (a second runtime on the same model), or nothing to do
        return 0
    linears = {id(child) for _, _, child in swaps}
    rest = [m for m in model.modules() if id(m) not in linears]
    mapped_files = FileMappings.of_this_process()
    with torch.no_grad():  # out of the checkpoint's file mapping (see the module docstring)
        for module in rest:
            for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
                if t.layout != torch.strided:
                    continue  # a oneDNN tensor: our own copy, never a file mapping
                mapped, t.data = t.data, t.data.clone()
                mapped_files.release(mapped)
    others = {p.data_ptr() for m in rest for p in m.parameters(recurse=False)}
    for parent, name, child in swaps:
        shared = child.weight.data_ptr() in others
        setattr(parent, name, OneDNNLinear(child, shared=shared))
        for t in (child.weight, child.bias):  # its copy exists: the checkpoint's pages can go
            if t is not None:
                mapped_files.release(t)
    return len(swaps)


def step_weight_bytes(model: nn.Module) -> int:
    """Bytes of weights a decode step reads: every linear layer (oneDNN-held, quantized or
    neither) and the small parameters, but not an embedding table (a step reads one row)."""
    total = 0
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            continue
        tensors = list(module.parameters(recurse=False))
        if isinstance(module, OneDNNLinear):
            tensors = [t for t in (module.packed_weight, module.packed_bias) if t is not None]
        elif isinstance(module, QuantizedLinear):  # codes, scales, zeros and bias
            tensors = list(module.buffers(recurse=False))
        total += sum(t.numel() * t.element_size() for t in tensors)
    return total
