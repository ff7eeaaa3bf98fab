"""``RuntimeConfig.device``: where the model and the KV pools live (issue 32, item 4).

The engine puts its pools beside the model; a device torch cannot see, or a model whose linear
layers were converted for the CPU, is a ``ConfigError`` that says what to do. The CUDA path
itself runs in ``scripts/gpu_check.py`` on a GPU machine.
"""

from __future__ import annotations

import pytest
import torch

from pask_agent.errors import ConfigError
from pask_agent.eval.random_model import SMOKE, random_model
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.engine import Engine
from pask_agent.runtime.models.placement import place_model

CAPACITY = 1 << 20


def test_the_store_lives_where_the_model_does() -> None:
    loaded = random_model(SMOKE)
    for device in (None, "cpu"):
        engine = Engine(loaded, RuntimeConfig(kv_capacity_bytes=CAPACITY, device=device))
        assert engine.device == torch.device("cpu")
        assert engine.store.pools.buffer.device == torch.device("cpu")


@pytest.mark.parametrize("device", ["gpu", "cuda:x", ""])
def test_a_device_torch_cannot_parse_is_refused(device: str) -> None:
    with pytest.raises(ConfigError, match="not a torch device; use 'cpu', 'cuda'"):
        RuntimeConfig(device=device)


def test_cuda_without_a_gpu_is_refused_before_anything_moves() -> None:
    loaded = random_model(SMOKE)
    if torch.cuda.is_available():  # a GPU machine: the model and its pools move there
        engine = Engine(loaded, RuntimeConfig(kv_capacity_bytes=CAPACITY, device="cuda"))
        assert engine.store.pools.buffer.is_cuda and engine.device.type == "cuda"
        return
    with pytest.raises(ConfigError, match="torch sees no CUDA device"):
        Engine(loaded, RuntimeConfig(kv_capacity_bytes=CAPACITY, device="cuda"))
    assert next(loaded.model.parameters()).device == torch.device("cpu")


def test_a_model_converted_for_the_cpu_cannot_move() -> None:
    """oneDNN-held weights have no GPU form: say how to get a copy that can move."""
    loaded = random_model(SMOKE)
    Engine(loaded, RuntimeConfig(kv_capacity_bytes=CAPACITY, onednn_linear=True))
    if not torch.backends.mkldnn.is_available():
        pytest.fail("this CPU build of torch has no oneDNN; the conversion under test is absent")
    with pytest.raises(ConfigError, match="from a process that has not served it on the CPU"):
        place_model(loaded.model, "meta")
