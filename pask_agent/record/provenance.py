"""Where a result came from: the command, the git commit and the machine, for every file in
``results/`` (a number without them cannot be checked or rerun)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any


def provenance(argv: list[str] | None = None) -> dict[str, Any]:
    """The running command, the checkout's commit (``+dirty`` when files differ) and the
    machine (CPU count, platform, Python)."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, check=False
            )
        except OSError:  # no git on this machine (a copied tree on a GPU host)
            return ""
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD") or "unknown"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", "pask_agent"))
    args = list(sys.argv if argv is None else argv)
    if args and args[0].endswith(".py") and "pask_agent" in Path(args[0]).parts:
        parts = Path(args[0]).with_suffix("").parts
        args[0] = "-m " + ".".join(parts[parts.index("pask_agent") :])  # run as python -m
    return {
        "command": " ".join(["python", *args]) if args else "",
        "git_commit": commit + ("+dirty" if dirty else ""),
        "machine": f"{os.cpu_count()}-core {platform.machine()} {platform.system()}, "
        f"Python {platform.python_version()}",
    }
