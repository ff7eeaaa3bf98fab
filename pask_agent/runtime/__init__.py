"""Serving: offline model loading, the mixed-precision KV store, the transformers seam and the
async runtime (``Runtime.open(...)``, ``await rt.call(...)``, ``await rt.chat(...)``)."""

from pask_agent.runtime.engine import RuntimeConfig
from pask_agent.runtime.models import LoadedModel, load_model, load_tokenizer
from pask_agent.runtime.results import ChatResult, Delta, ToolCall, Usage
from pask_agent.runtime.runtime import Conversation, Runtime

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
