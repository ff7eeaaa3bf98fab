"""Where a model computes: the device an engine moves it to, and puts its KV pools on.

A model converted for the CPU (``cpu_linear.py``'s oneDNN layers) cannot move, and a process
shares one copy of each model (``loading.load_model``), so the refusal says how to get a copy
that can.
"""

from __future__ import annotations

from typing import Any

import torch

from pask_agent.errors import ConfigError
from pask_agent.runtime.models.cpu_linear import OneDNNLinear


def place_model(model: Any, device: str | None) -> torch.device:
    """Move ``model`` to ``device`` (None: leave it) and return where it is: the device an
    engine then puts its KV pools and input ids on (``RuntimeConfig.device``).

    Raises
    ------
    ConfigError
        ``device`` names a GPU torch cannot see, or the model's linear layers were already
        converted for the CPU (``onednn_linear``), which cannot move.
    """
    here = next(model.parameters()).device
    target = here if device is None else torch.device(device)
    if target.type == here.type and target.index in (None, here.index):  # "cuda": the current GPU
        return here
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={device!r}, but torch sees no CUDA device here")
    if any(isinstance(m, OneDNNLinear) for m in model.modules()):
        raise ConfigError(
            f"an earlier engine converted this model's linear layers for the CPU "
            f"(onednn_linear), and a process shares one copy of a model: serve it on {device!r} "
            "from a process that has not served it on the CPU, or give the CPU runtime "
            "RuntimeConfig(onednn_linear=False)"
        )
    model.to(target)
    return next(model.parameters()).device
