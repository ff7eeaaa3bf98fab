"""An OpenAI ``/v1/chat/completions`` body → one runtime turn (``TurnSpec``).

Pydantic checks the body's shape at the door; the meaning (tool choice, response format,
sampling limits) is translated here into the keyword values ``Runtime.stream`` takes. Fields
the runtime cannot honour are refused with a 400 that names them, never ignored: ``n > 1``,
``logprobs``, penalties and ``logit_bias``. Unknown fields (``user``, ``metadata``, ``store``)
are ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pask_agent.runtime.turns.outputs import schema_prompt
from pask_agent.runtime.turns.turn import TurnRequest
from pask_agent.server.errors import APIError, bad_request

CONVERSATION_HEADER = "x-conversation-id"  # names the conversation as the body's field does
JSON_OBJECT_INSTRUCTION = "Answer with a single JSON object and nothing else."


class ChatCompletionBody(BaseModel):
    """The request body; PASK knobs ride along as extra fields (``extra_body`` in the SDK)."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    pask_policy: str | None = None
    pask_budget: float | None = None
    conversation_id: str | None = Field(default=None, min_length=1, max_length=256)


@dataclass(frozen=True, slots=True)
class TurnSpec:
    """One chat completion, translated and checked: the runtime's ``TurnRequest`` and what only
    the HTTP protocol adds to it.

    ``output_schema`` is the JSON Schema a ``response_format`` binds the answer to (``None``:
    tools or free text); its instruction is already in ``turn.messages``. The grammar is
    compiled from it by the runtime that serves the turn.
    """

    model: str
    turn: TurnRequest
    output_schema: dict[str, Any] | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    conversation_id: str | None

    @property
    def tool_mode(self) -> bool:
        """True when the answer may be tool calls (it is then read as calls or text)."""
        return self.turn.tools is not None and self.turn.tool_choice != "none"


def parse_body(raw: bytes, *, default_max_tokens: int, default_temperature: float) -> TurnSpec:
    """Validate and translate a request body.

    Raises
    ------
    APIError
        400 naming the field that is malformed or asks for what the server does not do.
    """
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise bad_request(f"the body is not JSON: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object", code="invalid_json")
    try:
        body = ChatCompletionBody.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise bad_request(f"{where}: {first['msg']}", param=where) from exc
    _refuse_unsupported(body)
    tools = _tools(body.tools)
    tool_choice = _tool_choice(body.tool_choice, tools)
    messages = [_message(m, i) for i, m in enumerate(body.messages)]
    schema = _output_schema(body.response_format)
    if schema is not None:
        if tools is not None and tool_choice != "none":
            raise bad_request(
                "response_format together with tools is supported only with tool_choice='none'; "
                "drop the tools or the response_format",
                param="response_format",
            )
        tools = None
        messages = _with_instruction(messages, _instruction(body.response_format, schema))
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if len(stop) > 4:
        raise bad_request("stop takes at most 4 sequences", param="stop")
    options = body.stream_options or {}
    turn = TurnRequest(
        messages=tuple(messages),
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        policy=body.pask_policy,
        budget=body.pask_budget,
        max_new_tokens=body.max_completion_tokens or body.max_tokens or default_max_tokens,
        temperature=default_temperature if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
    )
    return TurnSpec(
        model=body.model,
        turn=turn,
        output_schema=schema,
        stop=tuple(s for s in stop if s),
        stream=body.stream,
        include_usage=bool(body.stream and options.get("include_usage")),
        conversation_id=body.conversation_id,
    )


def _refuse_unsupported(body: ChatCompletionBody) -> None:
    if body.n not in (None, 1):
        raise bad_request(f"n={body.n}: this server returns one choice (n=1)", param="n")
    if body.logprobs or body.top_logprobs:
        raise bad_request("logprobs are not supported by this server", param="logprobs")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name):
            raise bad_request(f"{name} is not supported (leave it 0)", param=name)
    if body.logit_bias:
        raise bad_request("logit_bias is not supported", param="logit_bias")


def _tools(tools: list[dict[str, Any]] | None) -> tuple[dict[str, Any], ...] | None:
    if tools is None:
        return None
    for i, tool in enumerate(tools):
        if tool.get("type", "function") != "function" or not isinstance(tool.get("function"), dict):
            raise bad_request(
                f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}",
                param=f"tools[{i}]",
            )
    # An empty list reaches the runtime, which refuses it with a SchemaError (400).
    return tuple(tools)


def _tool_choice(choice: str | dict[str, Any] | None, tools: tuple | None) -> str:
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if choice.get("type") != "function" or not isinstance(name, str):
            raise bad_request(
                "tool_choice must be 'auto', 'none', 'required' or "
                "{'type': 'function', 'function': {'name': ...}}",
                param="tool_choice",
            )
        choice = name
    elif choice is not None and choice not in ("auto", "none", "required"):
        raise bad_request(
            f"tool_choice {choice!r} is not 'auto', 'none', 'required' or a named function",
            param="tool_choice",
        )
    if tools is None and choice not in (None, "none"):
        raise bad_request(f"tool_choice={choice!r} needs tools", param="tool_choice")
    return choice or "auto"


def _message(message: dict[str, Any], i: int) -> dict[str, Any]:
    """An OpenAI message → the dict the chat template renders (text content, argument objects)."""
    role = message.get("role")
    if role == "developer":
        role = "system"
    if role not in ("system", "user", "assistant", "tool"):
        raise bad_request(
            f"messages[{i}].role {role!r} is not system, developer, user, assistant or tool",
            param=f"messages[{i}].role",
        )
    out: dict[str, Any] = {"role": role, "content": _text(message.get("content"), i)}
    if role == "tool" and "tool_call_id" in message:
        out["tool_call_id"] = message["tool_call_id"]
    if role == "assistant" and message.get("tool_calls"):
        out["tool_calls"] = [_history_call(c, i) for c in message["tool_calls"]]
    return out


def _text(content: Any, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_request(
                    f"messages[{i}] has a {kind!r} content part; this model reads text only",
                    param=f"messages[{i}].content",
                )
        return "".join(parts)
    raise bad_request(f"messages[{i}].content must be text", param=f"messages[{i}].content")


def _history_call(call: Any, i: int) -> dict[str, Any]:
    """A past tool call: the chat template renders ``arguments`` as an object, the API sends a
    JSON string."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad_request(
            f"messages[{i}].tool_calls entries need function.name", param=f"messages[{i}]"
        )
    args = fn.get("arguments") or {}
    if isinstance(args, str):
        try:
            args = json.loads(args or "{}")
        except ValueError as exc:
            raise bad_request(
                f"messages[{i}].tool_calls: arguments of {fn['name']!r} are not JSON",
                param=f"messages[{i}].tool_calls",
            ) from exc
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": fn["name"], "arguments": args},
    }


def _output_schema(fmt: dict[str, Any] | None) -> dict[str, Any] | None:
    kind = (fmt or {}).get("type")
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise bad_request(
                "response_format json_schema needs json_schema.schema (a JSON Schema object)",
                param="response_format.json_schema.schema",
            )
        # strict or not, the grammar binds the answer to the schema; a keyword it cannot
        # enforce is refused (SchemaError → 400) rather than passed unchecked.
        return schema
    raise bad_request(
        f"response_format type {kind!r} is not 'text', 'json_object' or 'json_schema'",
        param="response_format",
    )


def _instruction(fmt: dict[str, Any] | None, schema: dict[str, Any]) -> str:
    if (fmt or {}).get("type") == "json_object":
        return JSON_OBJECT_INSTRUCTION
    return schema_prompt(schema)


def _with_instruction(messages: list[dict[str, Any]], instruction: str) -> list[dict[str, Any]]:
    """The schema's field list goes into the system message, as the LangChain model does."""
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        return [{**first, "content": f"{first['content']}\n\n{instruction}"}, *messages[1:]]
    return [{"role": "system", "content": instruction}, *messages]


__all__ = ["APIError", "ChatCompletionBody", "TurnSpec", "parse_body"]
