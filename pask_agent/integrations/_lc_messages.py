"""LangChain messages ⇄ the OpenAI chat dicts the runtime and the chat template take.

Why a converter of our own: the chat template (Qwen2.5's) renders assistant ``tool_calls``
with ``arguments`` as a JSON *object* and tool results as role ``tool``; LangChain's own
OpenAI converter serializes arguments to strings and knows content blocks we must refuse
(images, audio, files: the bundled models read text only).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from pask_agent.errors import ConfigError
from pask_agent.runtime.turns.results import ChatResult

# Content blocks that carry no text for the model: tool-use blocks are repeated in
# ``AIMessage.tool_calls``; reasoning blocks from other providers are not shown to ours.
_SKIPPED_BLOCKS = frozenset(
    {"tool_use", "tool_call", "tool_call_chunk", "thinking", "reasoning", "redacted_thinking"}
)
_TEXT_BLOCKS = frozenset({"text", "text-plain"})


def to_openai_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """Convert a LangChain history to OpenAI-format dicts for ``Runtime.chat``.

    Raises
    ------
    ConfigError
        A message holds a non-text content block (image, audio, file, video) or has an
        unknown type.
    """
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        content = content_text(message.content, where=f"message {i}")
        if isinstance(message, SystemMessage):
            out.append({"role": "system", "content": content})
        elif isinstance(message, HumanMessage):
            out.append({"role": "user", "content": content})
        elif isinstance(message, AIMessage):
            entry: dict[str, Any] = {"role": "assistant", "content": content}
            if message.tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": call.get("id") or f"call_{i}_{k}",
                        "type": "function",
                        "function": {"name": call["name"], "arguments": dict(call["args"])},
                    }
                    for k, call in enumerate(message.tool_calls)
                ]
            out.append(entry)
        elif isinstance(message, ToolMessage):
            out.append({"role": "tool", "content": content, "tool_call_id": message.tool_call_id})
        elif isinstance(message, FunctionMessage):
            out.append({"role": "tool", "content": content, "name": message.name})
        elif isinstance(message, ChatMessage):
            out.append({"role": message.role, "content": content})
        else:
            raise ConfigError(
                f"message {i} has unsupported type {type(message).__name__}; use System, "
                "Human, AI, Tool or Chat messages"
            )
    return out


def content_text(content: str | list[Any], *, where: str) -> str:
    """The text of a message's content (a string or a list of content blocks)."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
            continue
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in _TEXT_BLOCKS:
            parts.append(str(block.get("text", "")))
        elif kind in _SKIPPED_BLOCKS:
            continue
        else:
            raise ConfigError(
                f"{where} has a {kind!r} content block; PaskChatModel's models read text only "
                "(no images, audio, video or files): send text blocks or a string"
            )
    return "".join(parts)


def tool_call_dicts(result: ChatResult) -> list[dict[str, Any]]:
    """``AIMessage.tool_calls`` entries for a runtime result."""
    return [
        {"name": c.name, "args": dict(c.arguments), "id": c.id, "type": "tool_call"}
        for c in result.tool_calls
    ]


def tool_call_chunk_dicts(result: ChatResult) -> list[dict[str, Any]]:
    """``AIMessageChunk.tool_call_chunks`` entries (arguments as a JSON string) for a result."""
    return [
        {
            "name": c.name,
            "args": json.dumps(c.arguments, ensure_ascii=False),
            "id": c.id,
            "index": k,
            "type": "tool_call_chunk",
        }
        for k, c in enumerate(result.tool_calls)
    ]


def usage_metadata(prompt_tokens: int, completion_tokens: int, reused: int) -> dict[str, Any]:
    """LangChain ``UsageMetadata``; a reused KV prefix counts as ``cache_read`` input."""
    return {
        "input_tokens": prompt_tokens,
        "output_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "input_token_details": {"cache_read": reused},
    }


def response_metadata(model: str, result: ChatResult | None, finish_reason: str) -> dict[str, Any]:
    """``model_name``, ``finish_reason`` and the measured KV statistics (``kv``)."""
    meta: dict[str, Any] = {
        "model_name": model,
        "model_provider": "pask",
        "finish_reason": finish_reason,
    }
    if result is not None:
        meta["kv"] = result.usage.as_dict()
    return meta
