#!/usr/bin/env python3
"""GPU readiness check (issue 32, item 4): Triton kernel parity at 1k-32k tokens, then Full KV
against PASK through the engine on a random-weight Qwen3-4B-shaped model.

    python3 scripts/gpu_check.py --out results/gpu_check     # on a GPU, about 3-5 minutes
    python3 scripts/gpu_check.py --smoke                     # tiny, on a CPU (CI)

Runs from a checkout that is not installed: the package is imported from this tree, and the
data folders ``setup.py`` maps into the package (``calibration_data/``: the PASK table) are
mapped the same way here. Prints one JSON summary; exits 0 when every stage passed. What it
does and writes: ``pask_agent/eval/gpu_check.py``.
"""

from __future__ import annotations

import importlib.util
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA_PACKAGES = {  # as in setup.py
    "pask_agent.calibration_data": "calibration_data",
    "pask_agent.sample_data": "recipes/data",
}


def use_checkout() -> None:
    """Import ``pask_agent`` and its data packages from this tree, installed or not."""
    sys.path.insert(0, str(ROOT))
    for name, folder in DATA_PACKAGES.items():
        init = ROOT / folder / "__init__.py"
        if name in sys.modules or not init.is_file():
            continue
        spec = importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(init.parent)]
        )
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through run_check, which writes what finished


if __name__ == "__main__":
    use_checkout()
    signal.signal(signal.SIGTERM, _terminated)
    from pask_agent.eval.gpu_check import main

    sys.exit(main())
