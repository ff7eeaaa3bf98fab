"""Render a chat prompt with tools through the model's own chat template (paper §3.6).

Templates that know tools (Qwen2.5) get ``tools=[spec.to_openai(), ...]``. Templates that ignore
them (SmolLM2) would silently drop the tools, so we then put the tool list into the system
message ourselves, serialized the way Qwen's template does (one ``json.dumps`` line per tool
inside ``<tools></tools>``); the span labeller finds tools the same way in both cases.

Calls earlier assistant turns made are written back the way the grammar made the model write
them (``tool_grammar``: the turn's text, then on a line of their own one bare call or an array
of calls), not in the template's ``<tool_call>`` markup. A history in another format than the
answer's teaches the model that format: with Qwen's markup in the history, the default model
answered "I will call X." and stopped, because ``<tool_call>`` is a special token the grammar
masks. Written back as generated, a conversation's next prompt also starts with the very
tokens the store already holds, so the turn reuses them with the actions PASK gave them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pask_agent.errors import ConfigError
from pask_agent.grammars.tool_spec import ToolSpec, tool_specs

DEFAULT_SYSTEM = "You are a helpful assistant."

_TOOLS_SECTION = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\n"
    "To call a function, answer with only a JSON object "
    '{{"name": <function-name>, "arguments": <args-json-object>}}; to call several, answer with '
    "a JSON array of such objects."
)


def render_tool_prompt(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[ToolSpec] | None,
    *,
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text for ``messages`` (OpenAI chat format) with ``tools`` shown to the model.

    ``tools`` may be in any form ``ToolSpec.from_any`` accepts; ``None`` or ``[]`` renders
    without tools.

    Raises
    ------
    ConfigError
        The messages are empty or malformed, or the tokenizer has no chat template.
    SchemaError
        A tool is invalid (see ``tool_specs``).
    """
    msgs = _check_messages(messages)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError("the tokenizer has no chat template; pass a chat model's tokenizer")
    if not tools:
        return _apply(tokenizer, msgs, None, add_generation_prompt)
    openai_tools = [tool.to_openai() for tool in tool_specs(tools)]
    with_tools = _apply(tokenizer, msgs, openai_tools, add_generation_prompt)
    if with_tools != _apply(tokenizer, msgs, None, add_generation_prompt):
        return with_tools
    # The template ignored tools: describe them in the system message instead.
    section = _TOOLS_SECTION.format(
        tools="\n".join(json.dumps(t, ensure_ascii=False) for t in openai_tools)
    )
    if msgs[0]["role"] == "system":
        system = {**msgs[0], "content": f"{msgs[0]['content']}\n\n{section}"}
        msgs = [system, *msgs[1:]]
    else:
        msgs = [{"role": "system", "content": f"{DEFAULT_SYSTEM}\n\n{section}"}, *msgs]
    return _apply(tokenizer, msgs, None, add_generation_prompt)


def _apply(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
) -> str:
    text = tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    if not isinstance(text, str):
        raise ConfigError(f"the chat template returned {type(text).__name__}, not text")
    return text


def _calls_as_output(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message with ``tool_calls`` as the grammar's output text (see the module
    doc); other messages unchanged."""
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or not calls:
        return message
    rendered = []
    for i, call in enumerate(calls):
        fn = call.get("function", call) if isinstance(call, Mapping) else None
        name = fn.get("name") if isinstance(fn, Mapping) else None
        args = fn.get("arguments", {}) if isinstance(fn, Mapping) else None
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as exc:
                raise ConfigError(f"tool call {i}: arguments are not JSON ({exc})") from exc
        if not isinstance(name, str) or not isinstance(args, Mapping):
            raise ConfigError(
                f"tool call {i} needs a function name and an arguments object, got {call!r}"
            )
        rendered.append({"name": name, "arguments": dict(args)})
    payload: Any = rendered[0] if len(rendered) == 1 else rendered
    text = json.dumps(payload, ensure_ascii=False)
    content = message.get("content") or ""
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    out["content"] = f"{content}\n{text}" if content else text
    return out


def _check_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(messages, str | bytes) or not messages:
        raise ConfigError("messages must be a non-empty list of {'role', 'content'} dicts")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ConfigError(f"message {i} needs a string 'role' (system/user/assistant/tool)")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise ConfigError(f"message {i} content must be text")
        out.append(_calls_as_output({**message, "content": content or ""}))
    return out
