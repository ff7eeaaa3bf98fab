"""LangChain's many spellings of tools and ``tool_choice``, turned into the OpenAI forms the
runtime takes (``bind_tools``, ``PaskChatModel(tools=...)`` and per-call kwargs all pass here),
so a tool the grammar cannot enforce fails when it is bound, not at the first call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.utils.function_calling import convert_to_openai_tool

from pask_agent.errors import SchemaError, ToolChoiceError
from pask_agent.grammars.tool_spec import ToolSpec, tool_specs


def format_tools(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """OpenAI tool dicts for any tool form LangChain knows (Anthropic-style dicts included).

    Raises
    ------
    SchemaError
        A tool cannot be converted, or the grammar cannot enforce its schema.
    """
    if isinstance(tools, dict | str) or not isinstance(tools, Sequence):
        raise SchemaError(f"tools must be a list, got {type(tools).__name__}")
    formatted: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        try:
            converted = convert_to_openai_tool(tool)
        except (TypeError, ValueError, KeyError) as exc:
            raise SchemaError(f"cannot convert tool {i} ({tool!r:.80}): {exc}") from exc
        # The same tool given twice (say a Pydantic class and its JSON Schema) is kept once;
        # two different tools with one name are rejected by ``tool_specs`` below.
        same = [t for t in formatted if t["function"]["name"] == converted["function"]["name"]]
        if same and ToolSpec.from_any(same[0]) == ToolSpec.from_any(converted):
            continue
        formatted.append(converted)
    tool_specs(formatted)  # validate now, not at the first call
    return formatted


def normalize_tool_choice(choice: Any) -> str:
    """``"any"``/``"required"``/``True`` → ``"required"``; ``{"function": {"name": n}}`` → n.

    Raises
    ------
    ToolChoiceError
        The value is not a mode, a tool name or an OpenAI/Anthropic tool-choice dict.
    """
    if choice is True or choice in ("any", "required"):
        return "required"
    if choice is False:
        return "none"
    if isinstance(choice, str) and choice:
        return choice
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") or choice.get("name")
        if isinstance(name, str) and name:
            return name
        if choice.get("type") in ("any", "auto", "none"):
            return normalize_tool_choice(choice["type"])
    raise ToolChoiceError(
        f"tool_choice {choice!r} is not 'auto', 'any'/'required', 'none', a tool name or "
        "{'type': 'function', 'function': {'name': ...}}"
    )
