"""Keep freed host memory in the process (glibc ``mallopt``), so CPU decode steps stop paying
page faults for their scratch tensors.

A CPU decode step allocates the same tens of megabytes of fp32 scratch in every layer (the
gathered K/V rows, the unpacked INT4 nibbles, the scores) and frees them a moment later.
glibc hands every allocation above its mmap threshold (adaptive, 128 KiB up to 32 MiB) to the
kernel with ``mmap`` and gives it back on ``free``, and it trims the top of its heap likewise;
the next layer then touches fresh pages and faults on each of them. On the 2-core CPU here,
splitting 11 × 3,740 INT4 rows into fp32 nibbles took 1.94 ms with fresh pages and 0.53 ms with
the heap kept (``results/cpu_paths.md``). The pools themselves are allocated once, so
what stays in the process is one step's scratch, not the KV cache.

It changes process-wide allocator settings, hence a ``RuntimeConfig`` switch
(``retain_host_memory``); on anything but glibc it does nothing.

``FileMappings`` is the other direction: pages of a mapped file (a safetensors checkpoint) that
the process has read and will not read again, handed back with ``madvise(MADV_DONTNEED)``
(``runtime/models/cpu_linear.py`` after converting each weight).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "MMAP_THRESHOLD_BYTES",
    "FileMappings",
    "give_back_freed_heap",
    "retain_freed_host_memory",
]

_MADV_DONTNEED = 4

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
"""Allocations below this come from the heap and are reused (glibc's largest allowed value on
64-bit builds); larger ones (weights, the preallocated pools) still map pages of their own."""

_TRIM_THRESHOLD_BYTES = 1 << 30


def retain_freed_host_memory() -> bool:
    """Raise glibc's mmap and trim thresholds; True when both settings were taken."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = _libc_function("mallopt")
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mapped = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    trimmed = mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES) == 1
    return mapped and trimmed


def give_back_freed_heap() -> bool:
    """Return the heap's free pages to the system (glibc ``malloc_trim``), after a one-time
    burst of temporaries such as a model's weight conversion; True when it ran. With the
    thresholds above raised, such pages would otherwise stay resident for good."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = _libc_function("malloc_trim")
    except (OSError, AttributeError):
        return False
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def _libc_function(name: str) -> Callable[..., int] | None:
    """``name`` from the C library on Linux, else None (OSError/AttributeError if absent)."""
    library = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
    return getattr(ctypes.CDLL(library, use_errno=True), name) if library else None


@dataclass(frozen=True, slots=True)
class FileMappings:
    """This process's mappings of regular files at one moment, and ``madvise`` to release them."""

    spans: tuple[tuple[int, int], ...] = ()
    madvise: Callable[..., int] | None = None

    @classmethod
    def of_this_process(cls) -> FileMappings:
        """Read ``/proc/self/maps``; empty (every ``release`` a no-op) off Linux."""
        maps = Path("/proc/self/maps")
        try:
            madvise = _libc_function("madvise")
        except (OSError, AttributeError):
            madvise = None
        if madvise is None or not maps.exists():
            return cls()
        madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        spans = []
        for line in maps.read_text().splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                spans.append((start, end))
        return cls(tuple(spans), madvise)

    def release(self, t: torch.Tensor) -> None:
        """Drop the whole pages of ``t`` that lie in a file mapping from the process's memory.

        Only file-backed pages: the file still holds their bytes, so whoever reads them again
        (a neighbour in the same checkpoint) faults them back in unchanged. Anonymous memory is
        never touched, nor a tensor without plain storage (a oneDNN one)."""
        if self.madvise is None or t.layout != torch.strided:
            return
        start, size = t.data_ptr(), t.numel() * t.element_size()
        if not any(lo <= start and start + size <= hi for lo, hi in self.spans):
            return
        page = mmap.PAGESIZE
        first, last = -(-start // page) * page, (start + size) // page * page
        if last > first:
            self.madvise(first, last - first, _MADV_DONTNEED)
