"""The compiled CPU decode-attention kernel (``_decode_attention.c``) and its loader.

Why C and not torch: the torch path widens every retained row to fp32 before its matmuls, so
on a CPU an INT4 row costs what a BF16 row costs, and both cost several passes over memory
(``results/cpu_paths.md``: 13.1 ms a layer for 11 × 4,160 rows). There is no Triton backend for
CPUs. The C kernel widens one row at a time into a buffer that stays in cache and folds it into
an online softmax for every query head of its group, so a step reads each row's own bytes once.

The source ships with the package and is compiled on first use (``native_build.py``). Without a
compiler, or when the build fails, ``native_kernel()`` is None, ``native_status()`` says why
and callers keep the torch path.
It handles the sequences with a few queries (decode steps) and no key scores; everything else
stays on the torch reference.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from pask_agent.kernels import decode_attention
from pask_agent.kernels.attention_inputs import MixedKV, QueryChunk
from pask_agent.kernels.native_build import DISABLE_ENV, FLAGS, build_library, load_once

__all__ = ["DISABLE_ENV", "attend_small_queries_native", "native_kernel", "native_status"]

SOURCE = Path(__file__).with_name("_decode_attention.c")
HEADERS = (Path(__file__).with_name("_vector_ops.h"),)  # part of the build key
HEAD_DIMS = (64, 128)  # the head sizes the kernel is built for

_state: dict[str, object] = {}
_I64 = ctypes.c_int64
_P = ctypes.c_void_p


def _build(compiler: str, flags: tuple[str, ...] = FLAGS) -> Path:
    return build_library("decode_attention", SOURCE, HEADERS, compiler, flags)


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    fn = lib.pask_decode_attention
    fn.restype = ctypes.c_int
    fn.argtypes = [_I64, *([_P] * 19), _I64, _I64, _I64, ctypes.c_float, _I64, ctypes.c_int]
    return lib


def native_kernel() -> ctypes.CDLL | None:
    """The compiled kernel, built once per process (None when unavailable; see the status)."""
    return load_once(_state, _build, _load)


def native_status() -> str:
    """Why the native kernel is or is not in use ("compiled", "no C compiler ...", ...)."""
    native_kernel()
    return str(_state["status"])


def attend_small_queries_native(
    out: torch.Tensor,
    seqs: list[int],
    chunk: QueryChunk,
    kv: MixedKV,
    *,
    scale: float,
) -> None:
    """``decode_attention.attend_small_queries`` through the C kernel, without key scores (the
    caller checks ``native_kernel()`` first and keeps key scores on the torch path). The one
    place the chunk and the view become the kernel's flat pointers."""
    lib = native_kernel()
    if lib is None:
        raise RuntimeError(f"the native decode kernel is not usable here ({native_status()})")
    if not seqs:
        return
    q, high, low = chunk.q, kv.high, kv.low
    pools = (kv.high_k, kv.high_v, kv.low_k_codes, kv.low_v_codes, kv.low_k_scales, kv.low_v_scales)
    if (
        q.shape[2] not in HEAD_DIMS
        or kv.high_k.dtype != torch.bfloat16
        or not all(p.is_contiguous() for p in pools)
    ):
        # other head sizes or high dtypes, or pools that are views with gaps (copying a whole
        # pool per call would cost more than it saves): the torch path
        decode_attention.attend_small_queries(out, seqs, chunk, kv, scale=scale)
        return
    # what the kernel reads, each dense and of its dtype (a no-op for what the store passes);
    # BF16 rows and FP16 scales go as their bits, from the same pointers
    held = [
        torch.tensor(seqs, dtype=torch.int64),
        *(o.to(torch.int64).contiguous() for o in (chunk.q_offsets, high.offsets, low.offsets)),
        q.float().contiguous(),
        chunk.q_pos.contiguous(),
        chunk.cur_k.float().contiguous(),
        chunk.cur_v.float().contiguous(),
        kv.high_k,
        kv.high_v,
        high.slots.contiguous(),
        high.positions.contiguous(),
        *pools[2:],
        low.slots.contiguous(),
        low.positions.contiguous(),
        out,
    ]
    q_off = chunk.bounds
    n_qh, dim = q.shape[1], q.shape[2]
    n_kvh = chunk.cur_k.shape[1]
    longest = max(q_off[b + 1] - q_off[b] for b in seqs)
    rc = lib.pask_decode_attention(
        len(seqs), *[t.data_ptr() for t in held],
        n_qh, n_kvh, dim, float(scale), longest * (n_qh // n_kvh), torch.get_num_threads(),
    )  # fmt: skip
    if rc != 0:
        raise MemoryError(f"the native decode kernel failed (code {rc})")
