"""One chat completion on the runtime: streamed or whole, cut by stop sequences, cancelled when
the client goes away.

``ChatTurn`` turns the runtime's deltas into OpenAI delta pieces (``answer_pieces.py``): text,
tool-call deltas, or under ``tool_choice="auto"`` text and then, from the line where a call
begins, tool-call deltas.

``TurnResponse`` is the ASGI response that runs it. Why not Starlette's ``StreamingResponse``:
a request must be cancelled when its client disconnects at any point (waiting in the queue,
prefilling, or decoding a non-streamed answer), not only when a chunk fails to send. So the
response listens for ``http.disconnect`` beside the turn and cancels it; the runtime's stream
then marks the request cancelled and the engine frees its KV at its next step.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.types import Receive, Scope, Send

from pask_agent.errors import PaskError
from pask_agent.runtime.runtime import Runtime
from pask_agent.runtime.turns.results import ChatResult, Delta
from pask_agent.server import responses, sse
from pask_agent.server.answer_pieces import AnswerPieces
from pask_agent.server.errors import APIError, api_error
from pask_agent.server.metrics import ServerMetrics
from pask_agent.server.protocol import TurnSpec


class ChatTurn:
    """The runtime request behind one completion and the OpenAI pieces it produces."""

    def __init__(
        self,
        rt: Runtime,
        spec: TurnSpec,
        *,
        stamp: responses.Stamp,
        metrics: ServerMetrics,
        policy: str,
    ) -> None:
        self.rt, self.spec, self.stamp, self.metrics = rt, spec, stamp, metrics
        self.policy = policy
        self.answer = AnswerPieces(stop=spec.stop, calls_allowed=spec.tool_mode)
        self.completion_tokens = 0
        self.result: ChatResult | None = None
        self._items: AsyncIterator[Delta | ChatResult] | None = None
        self._first: Delta | ChatResult | None = None

    async def start(self) -> None:
        """Submit the request and wait for its first piece.

        Raises
        ------
        PaskError, APIError
            The request is refused (bad schema, too large, busy conversation, …), before
            anything was sent to the client.
        """
        spec, rt = self.spec, self.rt
        output = rt.outputs.json_schema(spec.output_schema) if spec.output_schema else None
        conversation = None
        if spec.conversation_id is not None:
            conversation = rt.conversation(spec.conversation_id)
            if conversation.busy:
                raise APIError(
                    409, f"conversation {spec.conversation_id!r} already has a turn running; "
                    "wait for it or use another conversation_id", code="conversation_busy",
                )  # fmt: skip
        turn = dataclasses.replace(spec.turn, spec=output)
        self._items = rt.stream_turn(turn, conversation=conversation, with_result=True)
        self._first = await anext(self._items)

    async def pieces(self) -> AsyncIterator[dict[str, Any]]:
        """OpenAI ``delta`` dicts (``content`` or ``tool_calls``) until the turn ends."""
        items = self._items
        if items is None:
            raise RuntimeError("ChatTurn.start() first")
        try:
            item: Delta | ChatResult | None = self._first
            while item is not None:
                if isinstance(item, ChatResult):
                    self.result = item
                    self.metrics.finished(item.usage)
                else:
                    self.completion_tokens += len(item.token_ids)
                    self.metrics.tokens(len(item.token_ids))
                    for piece in self.answer.feed(item.text):
                        yield piece
                    if self.answer.stopped:
                        return
                item = await anext(items, None)
            for piece in self.answer.finish():
                yield piece
        finally:
            with anyio.CancelScope(shield=True):
                await items.aclose()  # cancels the runtime request if it is still running

    @property
    def finish_reason(self) -> str:
        if self.answer.stopped or self.result is None:
            return "stop"
        return self.result.finish_reason

    def usage(self) -> dict[str, Any]:
        usage = self.result.usage if self.result is not None else None
        if usage is not None:
            prompt, completion = usage.prompt_tokens, usage.completion_tokens
        else:  # cut by a stop sequence: count the prompt the way the runtime rendered it
            prompt, completion = self.rt.prompt_tokens(self.spec.turn), self.completion_tokens
        budget = self.spec.turn.budget
        budget = budget if budget is not None else self.rt.default_budget
        return responses.usage_dict(
            usage,
            prompt_tokens=prompt,
            completion_tokens=completion,
            policy=self.policy,
            budget=budget,
        )

    async def completion(self) -> dict[str, Any]:
        """The whole ``chat.completion`` object."""
        async for _ in self.pieces():
            pass
        calls = self.result is not None and bool(self.result.tool_calls)
        content = self.answer.content(parsed_calls=calls)
        return responses.completion(
            self.stamp,
            content=content,
            result=self.result,
            finish_reason=self.finish_reason,
            usage=self.usage(),
        )

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """The ``chat.completion.chunk`` objects of a stream."""
        yield responses.chunk(self.stamp, {"role": "assistant", "content": ""})
        async for piece in self.pieces():
            yield responses.chunk(self.stamp, piece)
        yield responses.chunk(self.stamp, {}, self.finish_reason)
        if self.spec.include_usage:
            yield responses.usage_chunk(self.stamp, self.usage())


class TurnResponse:
    """ASGI response running a ``ChatTurn`` while listening for the client's disconnect."""

    def __init__(self, turn: ChatTurn, metrics: ServerMetrics) -> None:
        self.turn = turn
        self.metrics = metrics
        self.complete = False  # the last byte is on its way: a disconnect now cancels nothing
        self.disconnected = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = 200
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch, receive, tg.cancel_scope)
            try:
                status = await self._respond(send)
            except OSError:  # the connection broke while sending
                self.disconnected = True
            finally:
                tg.cancel_scope.cancel()
        self.metrics.status(499 if self.disconnected and not self.complete else status)

    async def _watch(self, receive: Receive, scope: anyio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not self.complete:
                    self.disconnected = True
                    scope.cancel()
                return

    async def _respond(self, send: Send) -> int:
        turn = self.turn
        try:
            await turn.start()
            if not turn.spec.stream:
                body = await turn.completion()
        except (PaskError, APIError) as exc:
            error = api_error(exc)
            await self._send_json(send, error.status, error.body())
            return error.status
        if not turn.spec.stream:
            await self._send_json(send, 200, body)
            return 200
        await send({"type": "http.response.start", "status": 200, "headers": sse.HEADERS})
        try:
            async for chunk in turn.chunks():
                await send(
                    {"type": "http.response.body", "body": sse.event(chunk), "more_body": True}
                )
            tail = sse.DONE
        except PaskError as exc:  # after the headers: the error travels as an event
            tail = sse.event(api_error(exc).body())
        self.complete = True
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        return 200

    async def _send_json(self, send: Send, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body, ensure_ascii=False).encode()
        self.complete = True
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": data, "more_body": False})
