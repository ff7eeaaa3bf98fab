"""The compiled CPU decode-attention kernel (``_decode_attention.c``) and its loader.

Why C and not torch: the torch path widens every retained row to fp32 before its matmuls, so
on a CPU an INT4 row costs what a BF16 row costs, and both cost several passes over memory
(``results/cpu_paths.md``: 13.1 ms a layer for 11 × 4,160 rows). There is no Triton backend for
CPUs. The C kernel widens one row at a time into a buffer that stays in cache and folds it into
an online softmax for every query head of its group, so a step reads each row's own bytes once.

The source ships with the package and is compiled on first use with the system C compiler
(``cc -O3 -march=native -fopenmp``, well under a second) into the cache directory
(``$PASK_AGENT_CACHE``, else ``$XDG_CACHE_HOME/pask-agent``, else ``~/.cache/pask-agent``),
keyed by the source, the flags and the machine. Without a compiler, or when the build fails,
``native_kernel()`` is None, ``native_status()`` says why and callers keep the torch path.
It handles the sequences with a few queries (decode steps) and no key scores; everything else
stays on the torch reference.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from pask_agent.kernels import decode_attention
from pask_agent.kernels.attention_inputs import MixedKV, QueryChunk

__all__ = ["attend_small_queries_native", "native_kernel", "native_status"]

SOURCE = Path(__file__).with_name("_decode_attention.c")
HEADERS = (Path(__file__).with_name("_vector_ops.h"),)  # part of the build key
FLAGS = (
    "-O3",
    "-march=native",
    "-fopenmp",
    "-fPIC",
    "-shared",
    "-std=gnu11",
    "-Wall",
    "-Werror=implicit-function-declaration",
)
HEAD_DIMS = (64, 128)  # the head sizes the kernel is built for
DISABLE_ENV = "PASK_AGENT_NO_NATIVE"  # set to 1 to keep the torch path

_state: dict[str, object] = {}
_I64 = ctypes.c_int64
_P = ctypes.c_void_p


def _cache_dir() -> Path:
    explicit = os.environ.get("PASK_AGENT_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pask-agent"


def _build(compiler: str, flags: tuple[str, ...] = FLAGS) -> Path:
    source = b"".join(path.read_bytes() for path in (SOURCE, *HEADERS))
    key = hashlib.sha256(
        source + " ".join((compiler, *flags, platform.machine(), platform.node())).encode()
    ).hexdigest()[:16]
    target = _cache_dir() / "kernels" / f"decode_attention-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        subprocess.run(
            [compiler, *flags, "-o", str(built), str(SOURCE), "-lm"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        os.replace(built, target)  # atomic: a concurrent build never sees half a file
    return target


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    fn = lib.pask_decode_attention
    fn.restype = ctypes.c_int
    fn.argtypes = [_I64, *([_P] * 19), _I64, _I64, _I64, ctypes.c_float, _I64, ctypes.c_int]
    return lib


def native_kernel() -> ctypes.CDLL | None:
    """The compiled kernel, built once per process (None when unavailable; see the status)."""
    if "lib" in _state:
        return _state["lib"]  # type: ignore[return-value]
    lib = None
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        status = f"disabled by {DISABLE_ENV}"
    elif (compiler := shutil.which(os.environ.get("CC", "cc"))) is None:
        status = "no C compiler on PATH (set CC)"
    else:
        try:
            lib = _load(_build(compiler))
            status = "compiled"
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            status = f"build failed: {exc} {detail.decode(errors='replace')[-400:]}".strip()
            lib = None
    _state["lib"], _state["status"] = lib, status
    return lib


def native_status() -> str:
    """Why the native kernel is or is not in use ("compiled", "no C compiler ...", ...)."""
    native_kernel()
    return str(_state["status"])


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


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
    if q.shape[2] not in HEAD_DIMS or not all(p.is_contiguous() for p in pools):
        # other head sizes, or pools that are views with gaps (copying a whole pool per call
        # would cost more than it saves): the torch path
        decode_attention.attend_small_queries(out, seqs, chunk, kv, scale=scale)
        return
    keep = [
        q.float().contiguous(),
        chunk.q_pos.contiguous(),
        chunk.cur_k.float().contiguous(),
        chunk.cur_v.float().contiguous(),
        kv.high_k.view(torch.int16),
        kv.high_v.view(torch.int16),
        high.slots.contiguous(),
        high.positions.contiguous(),
        kv.low_k_codes,
        kv.low_v_codes,
        kv.low_k_scales.view(torch.int16),
        kv.low_v_scales.view(torch.int16),
        low.slots.contiguous(),
        low.positions.contiguous(),
    ]
    q_off = chunk.bounds
    bounds = (seqs, q_off, kv.high_bounds, kv.low_bounds)
    meta = [torch.tensor(x, dtype=torch.int64) for x in bounds]
    n_qh, dim = q.shape[1], q.shape[2]
    n_kvh = chunk.cur_k.shape[1]
    longest = max(q_off[b + 1] - q_off[b] for b in seqs)
    rc = lib.pask_decode_attention(
        len(seqs), *(_ptr(t) for t in meta), *(_ptr(t) for t in keep), _ptr(out),
        n_qh, n_kvh, dim, float(scale), longest * (n_qh // n_kvh), torch.get_num_threads(),
    )  # fmt: skip
    if rc != 0:
        raise MemoryError(f"the native decode kernel failed (code {rc})")
