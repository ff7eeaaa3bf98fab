"""Serving: the async ``Runtime`` and its engine at the top; ``memory/`` (the KV store), ``models/``
(loading and the transformers seam) and ``turns/`` (one request's input and output) below it.
Imports policy/, grammars/, kernels/, record/ and errors; never calibration/, eval/ or above.

The names below are resolved on first use (PEP 562), as at the package's top: importing one
submodule (the KV store, the engine) must not import the async ``Runtime`` and with it
xgrammar, jsonschema and anyio, which a machine that only runs the engine (``scripts/
gpu_check.py`` on a GPU host) may lack.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# public name -> module that defines it
_EXPORTS = {
    "ChatResult": "pask_agent.runtime.turns.results",
    "Conversation": "pask_agent.runtime.runtime",
    "Delta": "pask_agent.runtime.turns.results",
    "LoadedModel": "pask_agent.runtime.models.loading",
    "Runtime": "pask_agent.runtime.runtime",
    "RuntimeConfig": "pask_agent.runtime.config",
    "ToolCall": "pask_agent.runtime.turns.results",
    "Usage": "pask_agent.runtime.turns.results",
    "load_model": "pask_agent.runtime.models.loading",
    "load_tokenizer": "pask_agent.runtime.models.loading",
}

__all__ = [
    "ChatResult",
    "Conversation",
    "Delta",
    "LoadedModel",
    "Runtime",
    "RuntimeConfig",
    "ToolCall",
    "Usage",
    "load_model",
    "load_tokenizer",
]

if TYPE_CHECKING:
    from pask_agent.runtime.config import RuntimeConfig
    from pask_agent.runtime.models.loading import LoadedModel, load_model, load_tokenizer
    from pask_agent.runtime.runtime import Conversation, Runtime
    from pask_agent.runtime.turns.results import ChatResult, Delta, ToolCall, Usage


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pask_agent.runtime' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
