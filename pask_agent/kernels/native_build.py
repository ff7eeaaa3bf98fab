"""Compiling the package's C kernels on first use, and loading them once per process.

Each kernel ships as C source and is built with the system compiler (``cc -O3 -march=native
-fopenmp``, under a second) into the cache directory (``$PASK_AGENT_CACHE``, else
``$XDG_CACHE_HOME/pask-agent``, else ``~/.cache/pask-agent``), keyed by its source, the flags
and the machine: CPUs differ between machines, and ``-march=native`` code from one may not run
on another. Without a compiler, or when the build fails, the loader returns None and records
why; callers keep their torch path. ``PASK_AGENT_NO_NATIVE=1`` turns every kernel off.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable, MutableMapping
from pathlib import Path

from pask_agent.record.user_cache import cache_root

__all__ = ["DISABLE_ENV", "FLAGS", "build_library", "load_once"]

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
DISABLE_ENV = "PASK_AGENT_NO_NATIVE"  # set to 1 to keep the torch paths


def build_library(
    stem: str,
    source: Path,
    headers: tuple[Path, ...],
    compiler: str,
    flags: tuple[str, ...] = FLAGS,
) -> Path:
    """The shared library built from ``source`` (its headers part of the key), built now
    unless the cache holds it."""
    text = b"".join(path.read_bytes() for path in (source, *headers))
    key = hashlib.sha256(
        text + " ".join((compiler, *flags, platform.machine(), platform.node())).encode()
    ).hexdigest()[:16]
    target = cache_root() / "kernels" / f"{stem}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        subprocess.run(
            [compiler, *flags, "-o", str(built), str(source), "-lm"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        os.replace(built, target)  # atomic: a concurrent build never sees half a file
    return target


def load_once(
    state: MutableMapping[str, object],
    build: Callable[[str], Path],
    load: Callable[[Path], ctypes.CDLL],
) -> ctypes.CDLL | None:
    """The library ``build(compiler)`` makes and ``load`` opens, once per ``state`` (a kernel
    module's own dict): ``state["lib"]`` (None when unavailable) and ``state["status"]``
    ("compiled", or why not)."""
    if "lib" in state:
        return state["lib"]  # type: ignore[return-value]
    lib = None
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        status = f"disabled by {DISABLE_ENV}"
    elif (compiler := shutil.which(os.environ.get("CC", "cc"))) is None:
        status = "no C compiler on PATH (set CC)"
    else:
        try:
            lib = load(build(compiler))
            status = "compiled"
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            status = f"build failed: {exc} {detail.decode(errors='replace')[-400:]}".strip()
            lib = None
    state["lib"], state["status"] = lib, status
    return lib
