"""One HTTP request carried from the ingress to a replica, and the server app run in-process there.

A replica runs the same ASGI app as ``pask-agent serve`` (``create_app``), so a replicated
server answers exactly as the single-process one: same parsing, errors, SSE and metrics. The
ingress forwards the raw request; the replica feeds it to the app and streams back the ASGI
messages the app sends, which the ingress passes to its client unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from pask_agent.errors import ConfigError

Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ForwardedRequest:
    """An HTTP request as the ingress received it, plus the key the router places it by.

    ``route_key``: ``"conversation:<id>"``, ``"prefix:<digest>"`` or ``None`` (any replica;
    see ``routing.route_key``). ``ends_conversation``: the request deletes the conversation,
    so the router forgets where it lived.
    """

    method: str
    path: str
    query: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    route_key: str | None = None
    ends_conversation: bool = False

    @property
    def conversation_id(self) -> str | None:
        key = self.route_key or ""
        return key.split(":", 1)[1] if key.startswith("conversation:") else None

    def header(self, name: str) -> str | None:
        wanted = name.lower().encode()
        for k, v in self.headers:
            if k.lower() == wanted:
                return v.decode("latin-1")
        return None

    @classmethod
    def from_scope(
        cls,
        scope: Mapping[str, Any],
        body: bytes,
        *,
        route_key: str | None = None,
        ends_conversation: bool = False,
    ) -> ForwardedRequest:
        return cls(
            method=scope["method"],
            path=scope["path"],
            query=scope.get("query_string", b""),
            headers=tuple((bytes(k), bytes(v)) for k, v in scope.get("headers", ())),
            body=body,
            route_key=route_key,
            ends_conversation=ends_conversation,
        )


class AsgiHost:
    """Runs an ASGI app without a socket: its lifespan once, then one forwarded request a call.

    ``start`` returns when the app's lifespan has started (the runtime is open) and raises
    ``ConfigError`` with the app's own message when it failed, so a replica that cannot load
    its model fails its constructor and never serves.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._outbox: asyncio.Queue[Message] = asyncio.Queue()
        self._lifespan: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        """The app's lifespan still runs (its runtime worker has not stopped)."""
        return self._lifespan is not None and not self._lifespan.done()

    async def start(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self._lifespan = asyncio.create_task(
            self.app(scope, self._inbox.get, self._outbox.put), name="asgi-lifespan"
        )
        await self._inbox.put({"type": "lifespan.startup"})
        reply = await self._next_lifespan_message()
        if reply["type"] != "lifespan.startup.complete":
            said = str(reply.get("message", reply)).strip().splitlines() or ["no reason given"]
            raise ConfigError(f"the server app did not start: {said[-1]}")  # the error's line

    async def stop(self) -> None:
        if not self.alive:
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        with contextlib.suppress(Exception):
            await self._next_lifespan_message()
        assert self._lifespan is not None
        await asyncio.wait([self._lifespan], timeout=30)

    async def _next_lifespan_message(self) -> Message:
        assert self._lifespan is not None
        got = asyncio.ensure_future(self._outbox.get())
        await asyncio.wait([got, self._lifespan], return_when=asyncio.FIRST_COMPLETED)
        if got.done():
            return got.result()
        got.cancel()
        exc = self._lifespan.exception()
        return {"type": "lifespan.startup.failed", "message": repr(exc)}

    async def serve(self, request: ForwardedRequest) -> AsyncIterator[Message]:
        """The ASGI messages the app sends for ``request``, in order, as it sends them.

        Closing the iterator early (the client went away) is a disconnect for the app: a
        running turn is cancelled and its KV freed, as with a dropped socket.
        """
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": "http",
            "path": request.path,
            "raw_path": request.path.encode(),
            "query_string": request.query,
            "root_path": "",
            "headers": [list(h) for h in request.headers],
            "client": ("ray-serve-ingress", 0),
            "server": ("replica", 0),
            "state": {},
        }
        sent: asyncio.Queue[Message | None] = asyncio.Queue()
        gone = asyncio.Event()
        delivered = False

        async def receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": request.body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def run() -> None:
            try:
                await self.app(scope, receive, sent.put)
            finally:
                await sent.put(None)

        task = asyncio.create_task(run(), name=f"asgi {request.method} {request.path}")
        try:
            while (message := await sent.get()) is not None:
                yield _plain(message)
            await task  # the app's own exception, if it raised after its last message
        finally:
            gone.set()
            if not task.done():
                await asyncio.wait([task], timeout=10)
                task.cancel()


def _plain(message: Message) -> Message:
    """A copy that pickles small: headers as tuples of bytes, bodies as bytes."""
    out = dict(message)
    if "headers" in out:
        out["headers"] = [(bytes(k), bytes(v)) for k, v in out["headers"]]
    if "body" in out:
        out["body"] = bytes(out["body"])
    return out
