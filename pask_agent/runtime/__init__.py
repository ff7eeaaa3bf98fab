"""Serving: the async ``Runtime`` and its engine at the top; ``memory/`` (the KV store), ``models/``
(loading and the transformers seam) and ``turns/`` (one request's input and output) below it.
Imports policy/, grammars/, kernels/, record/ and errors; never calibration/, eval/ or above.

The names below are resolved on first use (PEP 562), as at the package's top: importing one
submodule (the KV store, the engine) must not import the async ``Runtime`` and with it
xgrammar, jsonschema and anyio, which a machine that only runs the engine (``scripts/
gpu_check.py`` on a GPU host) may lack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pask_agent.lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
