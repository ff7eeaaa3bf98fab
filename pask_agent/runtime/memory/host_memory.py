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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["MMAP_THRESHOLD_BYTES", "retain_freed_host_memory"]

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
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mapped = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    trimmed = mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES) == 1
    return mapped and trimmed
