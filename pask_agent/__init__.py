"""pask-agent: tool-calling and text-to-SQL agents on a small local model, PASK KV persistence.

The public API imports from the top: ``from pask_agent import Runtime, PaskChatModel,
SQLiteAssistant, PolicyTable``. The names are resolved on first use (PEP 562), because the
runtime pulls in torch and transformers and the LangChain model pulls in langchain-core: a
program that only reads a policy table, or the CLI printing its help, should not pay for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pask_agent.lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "Runtime": "pask_agent.runtime.runtime",
    "RuntimeConfig": "pask_agent.runtime.config",
    "Conversation": "pask_agent.runtime.runtime",
    "ToolCall": "pask_agent.runtime.turns.results",
    "ChatResult": "pask_agent.runtime.turns.results",
    "Usage": "pask_agent.runtime.turns.results",
    "PaskChatModel": "pask_agent.integrations.langchain",
    "SQLiteAssistant": "pask_agent.integrations.sql",
    "SqlExample": "pask_agent.integrations.sql_examples",
    "PolicyTable": "pask_agent.policy.table",
    "ToolSpec": "pask_agent.grammars.tool_spec",
    "load_model": "pask_agent.runtime.models.loading",
}

__all__ = [
    "ChatResult",
    "Conversation",
    "PaskChatModel",
    "PolicyTable",
    "Runtime",
    "RuntimeConfig",
    "SQLiteAssistant",
    "SqlExample",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "__version__",
    "load_model",
]

if TYPE_CHECKING:
    from pask_agent.grammars.tool_spec import ToolSpec
    from pask_agent.integrations.langchain import PaskChatModel
    from pask_agent.integrations.sql import SQLiteAssistant
    from pask_agent.integrations.sql_examples import SqlExample
    from pask_agent.policy.table import PolicyTable
    from pask_agent.runtime.config import RuntimeConfig
    from pask_agent.runtime.models.loading import load_model
    from pask_agent.runtime.runtime import Conversation, Runtime
    from pask_agent.runtime.turns.results import ChatResult, ToolCall, Usage


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
