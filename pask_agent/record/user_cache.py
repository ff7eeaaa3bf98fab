"""Where the package keeps what it builds once per machine (converted models, key offsets,
compiled kernels): one folder, read by the loaders and the kernel builder alike."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """``$PASK_AGENT_CACHE``, else ``$XDG_CACHE_HOME/pask-agent``, else ``~/.cache/pask-agent``."""
    explicit = os.environ.get("PASK_AGENT_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pask-agent"
