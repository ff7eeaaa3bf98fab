"""The OpenAI server as a Ray Serve application: an ingress, N model replicas, and a board.

- ``PaskReplica`` (N of them, or autoscaled): one ``Runtime`` each, running the same app as
  ``pask-agent serve`` in-process (``AsgiHost``); placed by ``ConversationRouter``.
- ``PaskIngress`` (Ray Serve's HTTP entry): reads the request, computes its routing key,
  forwards it, and passes the replica's response through unchanged. A replica that dies
  before it answered is retried on another one, which prefills the history the request
  carries: the client sees a slower turn, not an error. A streamed answer the replica had
  started sending cannot be replayed and ends with an error event.
- ``ReplicaBoard``: the replicas' reports, behind ``/metrics`` and ``/v1/replicas``.

Only this module (and ``router``) imports Ray; install it with ``pip install 'pask-agent[ray]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.config import AutoscalingConfig, RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from pask_agent.server.app import ServerSettings, create_app
from pask_agent.server.replicas.board import ReplicaBoard, ReplicaReport
from pask_agent.server.replicas.forwarding import AsgiHost, ForwardedRequest, Message
from pask_agent.server.replicas.routing_keys import route_key

APP_NAME = "pask"
REPLICA_HEADER = b"x-pask-replica"
_REPLICA_LOST = (RayActorError, ActorUnavailableError)
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReplicaPlan:
    """How many replicas, where, and how they are placed.

    ``replicas``: a fixed count; ``autoscale``: (min, max) replicas, scaled on ongoing
    requests per replica (``target_ongoing``). ``replica_cpus``: Ray CPUs each replica
    reserves, also its torch threads. ``routing``: ``"conversation"`` (``ConversationRouter``)
    or ``"pow2"`` (Ray's default, conversation-blind: what a miss costs is measured with it).
    """

    replicas: int = 2
    autoscale: tuple[int, int] | None = None
    replica_cpus: float = 1.0
    target_ongoing: float = 4.0
    routing: str = "conversation"
    retries: int = 3
    report_every_s: float = 2.0


class PaskReplica:
    """One runtime serving the OpenAI app, reporting to the board."""

    async def __init__(
        self, settings: ServerSettings, board: DeploymentHandle, threads: int, report_every_s: float
    ) -> None:
        import torch

        torch.set_num_threads(max(1, threads))
        self.board = board
        self.host = AsgiHost(create_app(settings))
        await self.host.start()  # a replica that cannot load its model fails here, never serves
        replica_id = serve.get_replica_context().replica_id
        self.replica, self.actor_name = replica_id.unique_id, replica_id.to_full_id_str()
        self.started, self.requests, self.keys = time.time(), 0, Counter[str]()
        self._heartbeat = asyncio.create_task(self._report_every(report_every_s))
        await self._report()

    async def forward(self, request: ForwardedRequest) -> AsyncIterator[Message]:
        self.requests += 1
        if request.route_key is not None:
            self.keys[request.route_key] += 1
        try:
            async for message in self.host.serve(request):
                if message["type"] == "http.response.start":
                    tag = (REPLICA_HEADER, self.replica.encode())
                    message["headers"] = [*message["headers"], tag]
                yield message
        finally:
            with contextlib.suppress(Exception):
                await self._report()

    async def check_health(self) -> None:
        if not self.host.alive:
            raise RuntimeError("the replica's runtime stopped")

    async def _report_every(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            with contextlib.suppress(Exception):
                await self._report()

    async def _report(self) -> None:
        state = _server_state(self.host.app)
        rt = state.rt
        live, allocated = rt.kv_bytes()
        await self.board.push.remote(
            ReplicaReport(
                replica=self.replica,
                actor_name=self.actor_name,
                pid=os.getpid(),
                time=time.time(),
                started=self.started,
                requests=self.requests,
                keys=dict(self.keys),
                kv_live_bytes=int(live),
                kv_allocated_bytes=int(allocated),
                live_requests=rt.live_requests,
                queue_depth=rt.queue_depth,
                conversations=len(rt.conversation_ids),
                metrics=state.metrics.render().decode(),
            )
        )

    async def __del__(self) -> None:
        self._heartbeat.cancel()
        await self.host.stop()


@serve.ingress()
class PaskIngress:
    """Ray Serve's HTTP entry: routing key, forwarding with failover, the board's pages."""

    def __init__(self, replicas: DeploymentHandle, board: DeploymentHandle, retries: int) -> None:
        self.replicas = replicas.options(method_name="forward", stream=True)
        self.board = board
        self.retries = retries

    def __serve_build_asgi_app__(self) -> Any:
        return _AsgiEntry(self)

    async def _asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = await _read_body(receive)
        method, path = scope["method"], scope["path"]
        if method == "GET" and path == "/metrics":
            page = await self.board.metrics_page.remote()
            return await _reply(send, 200, page.encode(), b"text/plain; version=0.0.4")
        if method == "GET" and path == "/v1/replicas":
            reports = await self.board.reports.remote()
            return await _reply(send, 200, json.dumps({"data": reports}).encode())
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        request = ForwardedRequest.from_scope(
            scope,
            body,
            route_key=route_key(method, path, headers, body),
            ends_conversation=method == "DELETE" and path.startswith("/v1/conversations/"),
        )
        await self._relay(request, send)

    async def _relay(self, request: ForwardedRequest, send: Any) -> None:
        for attempt in range(self.retries + 1):
            started = False
            try:
                async for message in self.replicas.remote(request):
                    await send(message)
                    started = True
                return
            except _REPLICA_LOST as exc:
                if started:
                    log.warning("replica lost mid-response for %s: %r", request.route_key, exc)
                    return await send({"type": "http.response.body", "body": _LOST_EVENT})
                log.warning("replica lost before answering (try %d): %r", attempt + 1, exc)
                await asyncio.sleep(0.5 * (attempt + 1))
        await _reply(
            send,
            503,
            json.dumps(
                {
                    "error": {
                        "message": "no replica could serve the request; retry later",
                        "type": "server_error",
                        "code": "replicas_unavailable",
                    }
                }
            ).encode(),
        )


class _AsgiEntry:
    """The ingress as an ASGI 3 app (uvicorn takes a bound method for an ASGI 2 one)."""

    def __init__(self, ingress: PaskIngress) -> None:
        self.ingress = ingress

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self.ingress._asgi(scope, receive, send)


_LOST_EVENT = (
    b'data: {"error": {"message": "the replica serving this stream stopped", '
    b'"type": "server_error", "code": "replica_lost"}}\n\n'
)


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _reply(send: Any, status: int, body: bytes, kind: bytes = b"application/json") -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _server_state(app: Any) -> Any:
    while not hasattr(getattr(app, "state", None), "server"):
        app = app.app  # BearerAuth wraps the Starlette app
    return app.state.server


def application(settings: ServerSettings, plan: ReplicaPlan) -> serve.Application:
    """The Ray Serve application: ``serve.run(application(...))`` deploys it."""
    board = serve.deployment(ReplicaBoard, name="ReplicaBoard", ray_actor_options={"num_cpus": 0})
    scaling: dict[str, Any] = {"num_replicas": plan.replicas}
    if plan.autoscale is not None:
        low, high = plan.autoscale
        scaling = {
            "autoscaling_config": AutoscalingConfig(
                min_replicas=low,
                max_replicas=high,
                target_ongoing_requests=plan.target_ongoing,
            )
        }
    router = None
    if plan.routing == "conversation":
        router = RequestRouterConfig(
            request_router_class="pask_agent.server.replicas.router:ConversationRouter"
        )
    replica = serve.deployment(
        PaskReplica,
        name="PaskReplica",
        ray_actor_options={"num_cpus": plan.replica_cpus},
        max_ongoing_requests=max(8, settings.max_queue + settings.runtime.max_batch),
        health_check_period_s=5,
        health_check_timeout_s=30,
        **({"request_router_config": router} if router is not None else {}),
        **scaling,
    )
    ingress = serve.deployment(PaskIngress, name="PaskIngress", ray_actor_options={"num_cpus": 0})
    board_app = board.bind()
    threads = max(1, int(plan.replica_cpus))
    replicas = replica.bind(settings, board_app, threads, plan.report_every_s)
    return ingress.bind(replicas, board_app, plan.retries)


def run(
    settings: ServerSettings, plan: ReplicaPlan, *, host: str, port: int, address: str | None = None
) -> None:
    """Deploy on a Ray cluster (``address``) or a local one, and serve until interrupted.

    Ctrl-C (SIGINT) is how a user stops a server: the application and Ray Serve shut down and
    the call returns, as the single-process server does, instead of ending in a traceback."""
    ray.init(address=address, include_dashboard=False, log_to_driver=True)
    serve.start(http_options={"host": host, "port": port})
    try:
        serve.run(application(settings, plan), name=APP_NAME, route_prefix="/", blocking=True)
    except KeyboardInterrupt:
        print("pask-agent serve --ray: interrupted, shutting down the replicas", flush=True)
    finally:
        with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: leave Ray to its own exit
            serve.shutdown()
            ray.shutdown()
