"""LangGraph threads → runtime conversations (``create_agent(model, tools, checkpointer=...)``).

A checkpointer replays a thread's whole history on every turn, so the thread's turns, and the
agent steps inside each turn, can continue one runtime conversation: one budget ledger, and each
step prefills only what is new. ``PaskChatModel`` reads the thread from the run config LangGraph
sets for the node that calls it; the host (``_portal``) keeps the conversation's lease and lets
it go when the thread is deleted from that checkpointer or sits idle too long.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from langchain_core.runnables.config import ensure_config

# Where LangGraph puts the run's checkpointer in ``configurable`` (its CONFIG_KEY_CHECKPOINTER,
# not exported publicly). tests/integrations/test_langchain_threads.py pins it: deleting a
# thread must release its conversation.
LANGGRAPH_SAVER_KEY = "__pregel_checkpointer"


def thread_key(model: str, policy: Any, budget: float | None, thread_id: str) -> str:
    """The runtime conversation of a LangGraph thread (``config["configurable"]["thread_id"]``).

    A checkpointer replays the thread's whole history every turn, so the thread's turns and
    the agent steps inside each turn share one conversation: one ledger, and each step prefills
    only what is new. Policy and budget are in the key for the reason ``conversation_key`` says.
    """
    digest = hashlib.sha256(
        json.dumps([model, str(policy), budget, thread_id], sort_keys=True).encode()
    ).hexdigest()
    return f"thread-{digest[:24]}"


def langgraph_thread() -> tuple[str | None, Any]:
    """The thread id and checkpointer of the LangGraph run calling us, or ``(None, None)``.

    LangGraph runs each node with its config as the current one (the context variable that
    ``ensure_config`` reads), and ``create_agent`` invokes the model without passing a config,
    so this is where the model can see ``configurable["thread_id"]``.
    """
    configurable = ensure_config().get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if thread_id is None:
        return None, None
    return str(thread_id), configurable.get(LANGGRAPH_SAVER_KEY)
