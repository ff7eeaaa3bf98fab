"""One chat turn on the host loop, yielded as LangChain ``ChatGenerationChunk`` values.

Why here and not in the caller's thread: stop sequences, retries and the time limit must
cancel the runtime request, which lives on the host loop; and building the chunks next to
the request keeps sync, async, streaming and non-streaming paths identical (non-streaming
calls merge the same chunks).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing, nullcontext
from dataclasses import dataclass
from typing import Any

import anyio
import jsonschema
from langchain_core.messages import AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk

from pask_agent.errors import ConfigError, PaskError, SchemaError, ToolChoiceError
from pask_agent.integrations._lc_messages import (
    response_metadata,
    tool_call_chunk_dicts,
    usage_metadata,
)
from pask_agent.integrations._portal import RuntimeHost
from pask_agent.runtime.runtime import Conversation, Runtime
from pask_agent.runtime.turns.mixed_output import OutputSplitter
from pask_agent.runtime.turns.outputs import schema_prompt
from pask_agent.runtime.turns.results import ChatResult, Delta, ToolCall
from pask_agent.runtime.turns.stops import stop_holdback
from pask_agent.runtime.turns.turn import TurnRequest

# Errors that a retry cannot fix: the request itself is wrong.
_NOT_RETRYABLE = (ConfigError, SchemaError, ToolChoiceError)


@dataclass(frozen=True, slots=True)
class LcTurn:
    """One LangChain call: the runtime's ``TurnRequest`` and what only LangChain adds (its
    runtime host, ``response_format``, stop sequences, timeout, retries, conversation lease)."""

    host: RuntimeHost
    model_name: str
    turn: TurnRequest
    response_format: dict[str, Any] | None
    stop: tuple[str, ...]
    timeout_s: float | None
    max_retries: int
    conversation_id: str | None
    idle_s: float = 600.0  # the conversation's lease: released after this long unused
    thread_id: str | None = None  # the LangGraph thread the turn belongs to, if any
    saver: Any = None  # that thread's checkpointer (asked whether the thread still exists)


def conversation_key(
    model: str, policy: Any, budget: float | None, messages: Sequence[dict[str, Any]]
) -> str:
    """A stable id for an agent loop: the system prompt(s) and the first user message.

    Every step of a loop resends the same opening messages, so its steps land in one runtime
    conversation and each step reuses the KV of the previous steps' common prefix. The policy
    and budget are part of the key because a conversation keeps the policy of its first turn.
    """
    opening: list[dict[str, Any]] = []
    for message in messages:
        opening.append({"role": message["role"], "content": message.get("content")})
        if message["role"] != "system":
            break
    digest = hashlib.sha256(
        json.dumps([model, str(policy), budget, opening], sort_keys=True).encode()
    ).hexdigest()
    return f"lc-{digest[:24]}"


async def run_turn(rt: Runtime, req: LcTurn) -> AsyncIterator[ChatGenerationChunk]:
    """Stream one assistant turn as chunks; the last chunk carries usage and KV statistics.

    A failed attempt is retried (up to ``max_retries``) only while nothing was yielded yet.
    """
    attempt = 0
    while True:
        emitted = False
        try:
            async for chunk in _attempt(rt, req):
                emitted = True
                yield chunk
            return
        except _NOT_RETRYABLE:
            raise
        except (PaskError, TimeoutError):
            if emitted or attempt >= req.max_retries:
                raise
            attempt += 1


async def _attempt(rt: Runtime, req: LcTurn) -> AsyncIterator[ChatGenerationChunk]:
    turn = _bound(rt, req)
    if req.conversation_id is not None:
        req.host.lease_conversation(
            req.conversation_id, idle_s=req.idle_s, thread_id=req.thread_id, saver=req.saver
        )
    claimed = req.conversation_id is not None and req.host.claim_conversation(req.conversation_id)
    conversation = rt.conversation(req.conversation_id) if claimed else None
    builder = _ChunkBuilder(req, tool_mode=bool(turn.tools) and turn.tool_choice != "none")
    limit = anyio.fail_after(req.timeout_s) if req.timeout_s else nullcontext()
    try:
        items = _items(rt, turn, conversation)
        with limit:
            async with aclosing(items):  # closing the stream cancels the request at once
                async for item in items:
                    if isinstance(item, ChatResult):
                        builder.result = item
                        continue
                    for chunk in builder.feed(item):
                        yield chunk
                    if builder.stopped:
                        break  # a stop sequence
    except TimeoutError as exc:
        raise TimeoutError(
            f"the turn took longer than timeout={req.timeout_s} s; raise the timeout or lower "
            "max_tokens"
        ) from exc
    finally:
        if claimed:
            req.host.release_conversation(req.conversation_id)
    if builder.result is None:
        builder.prompt_tokens = rt.prompt_tokens(turn)
    yield builder.final()


async def _items(
    rt: Runtime, turn: TurnRequest, conversation: Conversation | None
) -> AsyncIterator[Delta | ChatResult]:
    """The runtime's stream, ending with the ChatResult (usage, KV statistics).

    A cancelled turn (stop sequence, timeout, abandoned stream) frees its conversation only
    when the engine next steps; a turn that arrives before that runs outside the
    conversation instead of failing (it just does not reuse the cached prefix).
    """

    def open_stream(conv: Conversation | None) -> AsyncIterator[Delta | ChatResult]:
        return rt.stream_turn(turn, conversation=conv, with_result=True)

    stream = open_stream(conversation)
    try:
        first = await anext(stream)
    except ConfigError as exc:
        if conversation is None or "already has a turn running" not in str(exc):
            raise
        stream = open_stream(None)
        first = await anext(stream)
    async with aclosing(stream):
        yield first
        async for item in stream:
            yield item


def _bound(rt: Runtime, req: LcTurn) -> TurnRequest:
    """The runtime turn for the call: a ``response_format`` binds the answer to its schema
    (with the instruction in the system message) and drops the tools."""
    fmt = req.response_format
    if fmt is None:
        return req.turn
    schema = fmt.get("schema")
    if fmt.get("type") == "json_object" and not isinstance(schema, dict):
        instruction = "Answer with a single JSON object and nothing else."
        spec = rt.outputs.json_schema({"type": "object"})
    elif fmt.get("type") in ("json_schema", "json_object") and isinstance(schema, dict):
        # JSON mode with a known schema (with_structured_output) is bound to it as well.
        instruction = schema_prompt(schema)
        spec = rt.outputs.json_schema(schema)
    else:
        raise ConfigError(
            "response_format must be {'type': 'json_object'} or {'type': 'json_schema', "
            f"'schema': {{...}}}}, got {fmt!r}"
        )
    messages = list(req.turn.messages)
    if messages and messages[0]["role"] == "system":
        first = messages[0]
        messages[0] = {**first, "content": f"{first.get('content') or ''}\n\n{instruction}"}
    else:
        messages.insert(0, {"role": "system", "content": instruction})
    return dataclasses.replace(req.turn, messages=tuple(messages), tools=None, spec=spec)


# In ``tool_choice="auto"`` the grammar lets free text start with anything but ``{``/``[``,
# and the default model likes to write its call as a fenced or tagged JSON block instead.
_WRAPPED_CALL_OPENINGS = ("```", "<tool_call>")


def salvage_wrapped_call(result: ChatResult, tools: Sequence[dict[str, Any]]) -> ChatResult:
    """Read a call written as free text (```` ```json {...} ``` ```` or ``<tool_call>``).

    The text is accepted as a call only when it is exactly one JSON call (or a list of them)
    whose name is a bound tool and whose arguments validate against that tool's schema;
    anything else stays text. The grammar did not bind this text, hence the validation.
    """
    body = result.text.strip()
    for opening, closing in (("```json", "```"), ("```", "```"), ("<tool_call>", "</tool_call>")):
        if body.startswith(opening) and body.endswith(closing) and len(body) > len(opening):
            body = body[len(opening) : len(body) - len(closing)].strip()
            break
    try:
        value = json.loads(body)
    except ValueError:
        return result
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
    calls = []
    for item in value if isinstance(value, list) else [value]:
        if not isinstance(item, dict) or item.get("name") not in schemas:
            return result
        arguments = item.get("arguments", {})
        try:
            jsonschema.validate(arguments, schemas[item["name"]])
        except jsonschema.ValidationError:
            return result
        calls.append(ToolCall(f"call_{uuid.uuid4().hex[:24]}", item["name"], arguments))
    if not calls:
        return result
    return dataclasses.replace(result, tool_calls=tuple(calls), finish_reason="tool_calls")


class _ChunkBuilder:
    """Turns runtime deltas into chunks: text as it comes (stop sequences cut it), then the
    tool calls, held until parsed and sent whole in the last chunk.

    Under ``tool_choice="auto"`` an answer is text, calls, or text and then calls from a new
    line (``runtime/turns/mixed_output.py``). An answer that opens like a wrapped call
    (``_WRAPPED_CALL_OPENINGS``) is held whole, to be salvaged as a call at the end.
    """

    def __init__(self, req: LcTurn, *, tool_mode: bool) -> None:
        self.req = req
        # None until the answer's first non-blank characters tell a wrapped call from the rest
        self.wrapped: bool | None = None if tool_mode else False
        self.split = OutputSplitter(calls_allowed=tool_mode)
        self.raw = ""  # the answer as written
        self.text = ""  # its content so far (a stop sequence cuts it)
        self.sent = 0  # characters of ``text`` already yielded
        self.tokens = 0
        self.stopped = False
        self.result: ChatResult | None = None
        self.prompt_tokens = 0

    @property
    def is_call(self) -> bool:
        """The answer holds a call (a wrapped one, or calls after its text)."""
        return bool(self.wrapped) or self.split.in_calls

    def feed(self, delta: Delta) -> list[ChatGenerationChunk]:
        self.raw += delta.text
        self.tokens += len(delta.token_ids)
        piece = delta.text
        if self.wrapped is None:
            head = self.raw.lstrip()
            if not head or any(w.startswith(head) for w in _WRAPPED_CALL_OPENINGS):
                return []  # cannot tell yet
            self.wrapped, piece = head.startswith(_WRAPPED_CALL_OPENINGS), self.raw
        if self.wrapped:
            return []  # a wrapped call is reported whole, once salvaged
        content, _ = self.split.feed(piece)  # calls are parsed from the result, at the end
        return self._content(content, whole=self.split.in_calls)

    def _content(self, new: str, *, whole: bool) -> list[ChatGenerationChunk]:
        """``whole``: no more text will come (the answer ended, or its calls began)."""
        self.text += new
        hits = [i for s in self.req.stop if (i := self.text.find(s)) >= 0]
        if hits:
            self.text, self.stopped = self.text[: min(hits)], True
        held = 0 if whole or self.stopped else stop_holdback(self.text, self.req.stop)
        upto = len(self.text) - held
        if upto <= self.sent:
            return []
        piece, self.sent = self.text[self.sent : upto], upto
        return [ChatGenerationChunk(message=AIMessageChunk(content=piece))]

    def final(self) -> ChatGenerationChunk:
        """The last chunk: remaining text and the tool calls, usage and response metadata."""
        result = self.result
        if result is not None and self.is_call and not result.tool_calls and self.req.turn.tools:
            result = salvage_wrapped_call(result, self.req.turn.tools)
        calls = tool_call_chunk_dicts(result) if result is not None else []
        if calls or self.stopped:
            rest = self.text[self.sent :]
        elif self.is_call or self.wrapped is None:
            rest = self.raw[self.sent :]  # an unparsed "call" stays visible
        else:
            rest = "".join(c.text for c in self._content(self.split.finish(), whole=True))
        if result is not None:
            usage = usage_metadata(
                result.usage.prompt_tokens,
                result.usage.completion_tokens,
                result.usage.prompt_tokens - result.usage.prefilled_tokens,
            )
            reason = result.finish_reason
        else:
            usage = usage_metadata(self.prompt_tokens, self.tokens, 0)
            reason = "stop"
        message = AIMessageChunk(
            content=rest,
            tool_call_chunks=calls,
            usage_metadata=usage,
            response_metadata=response_metadata(self.req.model_name, result, reason),
            chunk_position="last",
        )
        return ChatGenerationChunk(message=message, generation_info={"finish_reason": reason})
