"""The OpenAI-compatible HTTP app over one ``Runtime`` (``pask-agent serve``).

A request continues a conversation (its KV kept between turns) named by the body's
``conversation_id`` or the ``x-conversation-id`` header.

Routes: ``GET /v1/models``, ``POST /v1/chat/completions``, ``DELETE /v1/conversations/{id}``,
``GET /health`` and ``GET /metrics`` (Prometheus). The runtime is opened by the app's lifespan,
in the server's event loop, so its worker and every request share one loop; the server keeps
no model state of its own.

An ``api_key`` guards ``/v1/*`` with a bearer token; without one, ``auth.check_bind`` refuses
any host but loopback, so an open server is never reachable from another machine.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

import pask_agent.policy  # noqa: F401 - registers every policy a request may name
from pask_agent.errors import ConfigError
from pask_agent.policy.base import Policy
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.models.identity import model_id_of
from pask_agent.runtime.models.loading import LoadedModel
from pask_agent.runtime.runtime import Runtime
from pask_agent.server import responses
from pask_agent.server.auth import BearerAuth
from pask_agent.server.chat import ChatTurn, TurnResponse
from pask_agent.server.errors import APIError
from pask_agent.server.metrics import CONTENT_TYPE, ServerMetrics
from pask_agent.server.protocol import CONVERSATION_HEADER, parse_body


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """How the server runs. ``model`` is what ``Runtime.open`` loads; clients may name it by
    ``served_model_name`` (default: ``model``), by ``model`` or by its upstream id.

    ``policy``: a registered name, or a ``Policy`` value (``PaskPolicy(table=...)`` serves a
    table of your own); a request that names the same policy gets this one, table included.
    ``max_queue``: requests waiting for admission beyond which new ones get 429.
    ``default_max_tokens`` / ``default_temperature``: used when a request omits them (greedy
    by default, as the runtime decodes: a 0.5B model is at its best greedy).
    """

    model: str = "default"
    served_model_name: str | None = None
    policy: str | Policy = "full"
    budget: float | None = None
    api_key: str | None = None
    max_queue: int = 64
    default_max_tokens: int = 256
    default_temperature: float = 0.0
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def __post_init__(self) -> None:
        if self.max_queue < 1 or self.default_max_tokens < 1:
            raise ConfigError("max_queue and default_max_tokens must be >= 1")
        if not 0 <= self.default_temperature <= 2:
            raise ConfigError(
                f"default_temperature must lie in [0, 2], got {self.default_temperature}"
            )

    @property
    def policy_name(self) -> str:
        return self.policy if isinstance(self.policy, str) else self.policy.name


@dataclass(frozen=True, slots=True)
class ServerState:
    rt: Runtime
    settings: ServerSettings
    metrics: ServerMetrics
    served: str
    names: frozenset[str]
    created: int


def create_app(settings: ServerSettings, *, loaded: LoadedModel | None = None) -> ASGIApp:
    """The ASGI app. ``loaded`` serves an already loaded model (tests share one)."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        source = loaded if loaded is not None else settings.model
        async with Runtime.open(
            source, policy=settings.policy, budget=settings.budget, config=settings.runtime
        ) as rt:
            rt.check_policy()  # a table made for other weights stops the server, not each request
            served = settings.served_model_name or settings.model
            upstream = model_id_of(rt.engine.loaded)
            app.state.server = ServerState(
                rt=rt,
                settings=settings,
                metrics=ServerMetrics(rt),
                served=served,
                names=frozenset({served, settings.model, upstream}),
                created=int(time.time()),
            )
            yield

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", get_model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/conversations/{conversation_id}", end_conversation, methods=["DELETE"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_exception_handler(APIError, _api_error)  # type: ignore[arg-type]
    if settings.api_key:
        return BearerAuth(app, settings.api_key)
    return app


def _state(request: Request) -> ServerState:
    return request.app.state.server


async def _api_error(request: Request, exc: APIError) -> Response:
    return exc.response()


async def health(request: Request) -> JSONResponse:
    st = _state(request)
    return JSONResponse(
        {
            "status": "ok",
            "model": st.served,
            "live_requests": st.rt.live_requests,
            "queue_depth": st.rt.queue_depth,
        }
    )


async def metrics(request: Request) -> Response:
    return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE)


async def list_models(request: Request) -> JSONResponse:
    st = _state(request)
    upstream = model_id_of(st.rt.engine.loaded)
    return JSONResponse(responses.model_list([st.served], st.created, upstream))


async def get_model(request: Request) -> JSONResponse:
    st = _state(request)
    model_id = request.path_params["model_id"]
    if model_id not in st.names:
        raise _unknown_model(model_id, st.served)
    upstream = model_id_of(st.rt.engine.loaded)
    return JSONResponse(responses.model_list([model_id], st.created, upstream)["data"][0])


async def chat_completions(request: Request) -> TurnResponse:
    st = _state(request)
    try:
        spec = parse_body(
            await request.body(),
            default_max_tokens=st.settings.default_max_tokens,
            default_temperature=st.settings.default_temperature,
        )
        if spec.model not in st.names:
            raise _unknown_model(spec.model, st.served)
        given = request.headers.get(CONVERSATION_HEADER)
        if given and spec.conversation_id is None:
            spec = dataclasses.replace(spec, conversation_id=_conversation_id(given))
        waiting = st.rt.queue_depth
        if waiting >= st.settings.max_queue:
            raise APIError(
                429, f"the queue is full ({waiting} requests waiting); retry later",
                "rate_limit_error", code="queue_full",
            )  # fmt: skip
    except APIError as exc:
        st.metrics.status(exc.status)
        raise
    stamp = responses.Stamp(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), spec.model)
    served = st.settings.policy_name
    if spec.turn.policy == served:  # the server's own policy value, with its table
        spec = dataclasses.replace(spec, turn=dataclasses.replace(spec.turn, policy=None))
    policy = spec.turn.policy or served
    turn = ChatTurn(st.rt, spec, stamp=stamp, metrics=st.metrics, policy=policy)
    return TurnResponse(turn, st.metrics)


async def end_conversation(request: Request) -> JSONResponse:
    """Forget a conversation (``conversation_id`` of earlier requests) and free its KV."""
    st = _state(request)
    conversation_id = request.path_params["conversation_id"]
    if conversation_id not in st.rt.conversation_ids:
        raise APIError(404, f"no conversation {conversation_id!r}", code="conversation_not_found")
    if st.rt.conversation(conversation_id).busy:
        raise APIError(409, f"conversation {conversation_id!r} has a turn running",
                       code="conversation_busy")  # fmt: skip
    st.rt.end_conversation(conversation_id)
    return JSONResponse({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


def _conversation_id(given: str) -> str:
    if len(given) > 256:
        raise APIError(400, f"the {CONVERSATION_HEADER} header is longer than 256 characters",
                       param=CONVERSATION_HEADER)  # fmt: skip
    return given


def _unknown_model(name: str, served: str) -> APIError:
    return APIError(
        404, f"the model {name!r} does not exist here; this server serves {served!r}",
        param="model", code="model_not_found",
    )  # fmt: skip
