"""Which model is served, as the records name it: a policy table's model id (the upstream name of
a bundled model) and a trace's weights identity (name + SHA-256), so a table or a trace recorded
for other weights is refused rather than silently applied."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pask_agent.record.traces import ModelId
from pask_agent.runtime.models.loading import ALIASES, BUNDLED, LoadedModel, resolve_model_dir


def model_id_of(loaded: LoadedModel) -> str:
    """The name a policy table calibrated for this model records: the upstream name of a
    bundled model, else the name the model was loaded by."""
    bundled = BUNDLED.get(ALIASES.get(loaded.name, loaded.name))
    return bundled.model_id if bundled is not None else loaded.name


def model_identity(name: str, path: str | Path | None = None) -> ModelId:
    """Which weights a name stands for, as traces record it: a bundled model's pinned GGUF
    digest (no weights are read), else the SHA-256 of its folder's weight files
    (``*.safetensors`` / ``*.bin`` / ``*.gguf``): a trace recorded on other weights is refused."""
    bundled = BUNDLED.get(ALIASES.get(name, name))
    if bundled is not None and bundled.sha256:
        return ModelId(bundled.name, bundled.sha256)
    folder = Path(path) if path is not None else Path(resolve_model_dir(name))
    digest = hashlib.sha256()
    files = folder.glob("*") if folder.is_dir() else [folder]
    for f in sorted(f for f in files if f.suffix in (".safetensors", ".bin", ".gguf")):
        with f.open("rb") as fh:
            for block in iter(lambda fh=fh: fh.read(1 << 22), b""):
                digest.update(block)
    return ModelId(str(name), digest.hexdigest())
