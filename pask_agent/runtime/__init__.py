"""Serving: offline model loading, the mixed-precision KV store, the transformers seam and the
async runtime (``Runtime.open(...)``, ``await rt.call(...)``, ``await rt.chat(...)``).

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
    "ChatResult": "pask_agent.runtime.results",
    "Conversation": "pask_agent.runtime.runtime",
    "Delta": "pask_agent.runtime.results",
    "LoadedModel": "pask_agent.runtime.models",
    "Runtime": "pask_agent.runtime.runtime",
    "RuntimeConfig": "pask_agent.runtime.engine",
    "ToolCall": "pask_agent.runtime.results",
    "Usage": "pask_agent.runtime.results",
    "load_model": "pask_agent.runtime.models",
    "load_tokenizer": "pask_agent.runtime.models",
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
    from pask_agent.runtime.engine import RuntimeConfig
    from pask_agent.runtime.models import LoadedModel, load_model, load_tokenizer
    from pask_agent.runtime.results import ChatResult, Delta, ToolCall, Usage
    from pask_agent.runtime.runtime import Conversation, Runtime


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pask_agent.runtime' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
