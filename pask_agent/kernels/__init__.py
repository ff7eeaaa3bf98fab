"""Attention and INT4 kernels: a torch reference (the CPU path) and a Triton kernel for each.

Nothing here imports the rest of pask_agent, and nothing imports Triton until a ``*_triton``
function (or ``backend="triton"``, or ``"auto"`` on CUDA) is first called.
"""

from pask_agent.kernels.attention import (
    KeyScores,
    MixedKV,
    PoolView,
    QueryChunk,
    mixed_attention,
    mixed_attention_ref,
    mixed_attention_triton,
)
from pask_agent.kernels.int4 import (
    INT4_MAX,
    dequantize_int4,
    dequantize_int4_ref,
    dequantize_int4_triton,
    quantize_int4,
    quantize_int4_ref,
    quantize_int4_triton,
)

__all__ = [
    "INT4_MAX",
    "KeyScores",
    "MixedKV",
    "PoolView",
    "QueryChunk",
    "dequantize_int4",
    "dequantize_int4_ref",
    "dequantize_int4_triton",
    "mixed_attention",
    "mixed_attention_ref",
    "mixed_attention_triton",
    "quantize_int4",
    "quantize_int4_ref",
    "quantize_int4_triton",
]
