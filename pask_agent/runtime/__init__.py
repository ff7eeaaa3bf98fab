"""Serving: the async ``Runtime`` and its engine at the top; ``memory/`` (the KV store), ``models/``
(loading and the transformers seam) and ``turns/`` (one request's input and output) below it.
Imports policy/, grammars/, kernels/, record/ and errors; never calibration/, eval/ or above."""

from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.models.loading import LoadedModel, load_model, load_tokenizer
from pask_agent.runtime.runtime import Conversation, Runtime
from pask_agent.runtime.turns.results import ChatResult, Delta, ToolCall, Usage

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
