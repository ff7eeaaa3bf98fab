"""The soak over HTTP (``soak --serve``): the same plan, sent to ``pask-agent serve``.

Why: the server adds ways for a request to end that the in-process API never sees, and each
must still reach the runtime as a cancellation (``server/chat.py``, ``TurnResponse``): a
client that closes a stream mid-answer, a client whose task is cancelled while a non-streamed
answer decodes (the connection drops), and a client whose own timeout fires while the request
waits in the queue or decodes. A server that leaked KV on any of them would pass the
in-process soak and still stop admitting work after a day of real clients.

The app of ``create_app`` runs under uvicorn in a daemon thread of this process, on
127.0.0.1 and an ephemeral port (as the server tests run it), and the requests go through the
real ``openai`` client (``AsyncOpenAI``, no retries):

- tool calls: streamed, ``tool_choice="required"``; a cancel lands right after the first
  delta and closes the stream;
- structured outputs: not streamed, ``response_format`` ``json_schema`` with the Pydantic
  model's schema; the answer must validate against the model; a cancel drops the connection
  while the server decodes;
- SQL questions: streamed plain chat with ``SQLiteAssistant``'s schema prompt, on a
  ``conversation_id`` (the server keeps its KV between turns, as the assistant's conversations
  do in process). The server has no SQL route, so no SQL grammar binds the answer: it is free
  text cut at ``;`` and run read-only by the client; a query SQLite refuses is a model miss,
  counted apart from faults, as in process.

Short deadlines are the client's own per-request ``timeout``. After the run every
conversation is deleted over HTTP (``DELETE /v1/conversations/{id}``), and then the runtime
the server's lifespan opened (same process) is judged exactly as in process
(``soak.leftovers``), plus: no 5xx among the server's own status counts (``/metrics``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, cast

import anyio
import httpx
import openai
from starlette.applications import Starlette

from pask_agent.eval.soak import Soak, run_phases
from pask_agent.eval.soak_report import build_report
from pask_agent.eval.soak_workload import STRUCTURED, TOOLS, Planned, SoakConfig, plan, warm_up_plan
from pask_agent.eval.sql_data import load_sample_questions
from pask_agent.integrations.sql import SQLiteAssistant
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.models.loading import LoadedModel, load_model
from pask_agent.runtime.runtime import Runtime
from pask_agent.server import ServerSettings, create_app
from pask_agent.server.loopback import LoopbackServer

SERVED = "soak"
OPENAI_TOOLS = [{"type": "function", "function": tool} for tool in TOOLS]
_FENCE = re.compile(r"```(?:sql)?", re.IGNORECASE)


class SoakServer(LoopbackServer):
    """The server under soak: ``create_app`` over an already loaded model, on loopback."""

    def __init__(self, settings: ServerSettings, loaded: LoadedModel) -> None:
        super().__init__(cast(Starlette, create_app(settings, loaded=loaded)))  # no api_key

    @property
    def runtime(self) -> Runtime:
        """The runtime the app's lifespan opened (read it only while the engine is idle)."""
        return self.app.state.server.rt


class ConversationIds:
    """One ``conversation_id`` per request at a time, per database, as the assistant keeps.

    Why: the server answers 409 to a turn on a busy conversation, and a conversation whose
    client went away stays busy on the server until its cancel lands. So an id comes back to
    the pool only after a request that ended normally; an abandoned one is never reused. Every
    id handed out is deleted at the drain.
    """

    def __init__(self) -> None:
        self.free: dict[str, list[str]] = {}
        self.minted: list[str] = []

    def take(self, db: str) -> str:
        pool = self.free.setdefault(db, [])
        if pool:
            return pool.pop()
        cid = f"soak-{db}-{len(self.minted)}"
        self.minted.append(cid)
        return cid

    def give_back(self, db: str, cid: str) -> None:
        self.free.setdefault(db, []).append(cid)


class ServeSoak(Soak):
    """Runs planned requests over HTTP against one ``SoakServer``."""

    def __init__(
        self,
        server: SoakServer,
        client: openai.AsyncOpenAI,
        config: SoakConfig,
        assistants: dict[str, SQLiteAssistant],
    ) -> None:
        super().__init__(server.runtime, config, assistants)
        self.server, self.client = server, client
        self.conversations = ConversationIds()
        self.drain_errors: list[str] = []
        self.conversations_deleted = 0
        self.sql_messages: dict[str, list[dict[str, str]]] = {}

    def prepare(self, planned: list[Planned]) -> None:
        """Render the SQL prompts now, while the server is idle.

        Why: the assistant counts prompt tokens with the server's tokenizer, and a Rust
        tokenizer used from two threads at once can fail ("Already borrowed").
        """
        for p in planned:
            if p.kind == "sql" and p.prompt not in self.sql_messages:
                db, question = p.prompt.split("|", 1)
                self.sql_messages[p.prompt] = self.assistants[db].messages(question)

    def deadline(self, p: Planned) -> AbstractContextManager[object]:
        return nullcontext()  # the client's own timeout is the deadline (``request``)

    async def request(self, p: Planned, first_token: anyio.Event) -> dict[str, Any]:
        """Send one request; a client timeout is raised as ``TimeoutError``."""
        timeout = p.delay_s if p.fate == "timeout" else self.config.time_limit_s
        try:
            if p.kind == "tools":
                return await self._tools(p, first_token, timeout)
            if p.kind == "structured":
                return await self._structured(p, timeout)
            return await self._sql(p, first_token, timeout)
        except (openai.APITimeoutError, httpx.TimeoutException) as exc:
            # before the response (openai's error) or between two chunks (httpx's)
            raise TimeoutError(str(exc)) from exc

    async def _stream(
        self, first_token: anyio.Event, timeout: float, **kw: Any
    ) -> tuple[str, list[str], str | None]:
        """A streamed completion: its text, its tool-call names and its finish reason.

        The stream is closed however this ends (shielded: a cancel must not skip the close, or
        the connection would linger and the server never hear that the client left).
        """
        stream = await self.client.chat.completions.create(
            model=SERVED, stream=True, timeout=timeout, **kw
        )
        text, names, reason = "", [], None
        try:
            async for chunk in stream:
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                delta = choice.delta
                if delta.content or delta.tool_calls:
                    first_token.set()
                text += delta.content or ""
                names += [c.function.name for c in delta.tool_calls or [] if c.function.name]
                reason = choice.finish_reason or reason
        finally:
            with anyio.CancelScope(shield=True):
                await stream.close()
        return text, names, reason

    async def _tools(self, p: Planned, first_token: anyio.Event, timeout: float) -> dict[str, Any]:
        _, names, reason = await self._stream(
            first_token,
            timeout,
            messages=[{"role": "user", "content": p.prompt}],
            tools=OPENAI_TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=self.config.max_new_tokens,
        )
        if not names or reason != "tool_calls":
            raise RuntimeError(f"no tool call in the stream (finish_reason {reason!r})")
        return {"calls": names}

    async def _structured(self, p: Planned, timeout: float) -> dict[str, Any]:
        which, text = p.prompt.split("|", 1)
        schema, template = STRUCTURED[int(which)]
        fmt = {
            "type": "json_schema",
            "json_schema": {"name": schema.__name__, "schema": schema.model_json_schema()},
        }
        r = await self.client.chat.completions.create(
            model=SERVED,
            messages=[{"role": "user", "content": template.format(text=text)}],
            response_format=fmt,  # type: ignore[arg-type]
            max_tokens=self.config.max_new_tokens,
            timeout=timeout,
        )
        content = r.choices[0].message.content
        if content is None:
            raise RuntimeError(f"no content (finish_reason {r.choices[0].finish_reason!r})")
        return {"value": schema.model_validate_json(content).model_dump()}

    async def _sql(self, p: Planned, first_token: anyio.Event, timeout: float) -> dict[str, Any]:
        db = p.prompt.split("|", 1)[0]
        cid = self.conversations.take(db)
        text, _, _ = await self._stream(
            first_token,
            timeout,
            messages=self.sql_messages[p.prompt],
            max_tokens=self.config.max_new_tokens,
            stop=[";"],
            extra_body={"conversation_id": cid},
        )
        self.conversations.give_back(db, cid)  # ended normally: the server is done with it
        sql = _FENCE.sub("", text).strip()
        try:
            rows = await anyio.to_thread.run_sync(self.assistants[db].run_sql, sql)
        except Exception as exc:  # noqa: BLE001 - SQLite refusing the model's query is a miss
            return {"sql": sql, "sqlite_error": str(exc)[:200], "rows": 0}
        return {"sql": sql, "sqlite_error": None, "rows": len(rows.rows)}

    async def drain(self, timeout_s: float = 60.0) -> None:
        """Wait until the server is idle, delete every conversation, wait again.

        A delete must answer 200 (or 404: the turn that would have opened it was cancelled
        before it began); anything else, a conversation still busy, is a fault.
        """
        await self._idle(timeout_s)
        async with httpx.AsyncClient(base_url=self.server.base_url, timeout=30) as http:
            for cid in self.conversations.minted:
                r = await http.delete(f"/v1/conversations/{cid}")
                self.conversations_deleted += r.status_code == 200
                if r.status_code not in (200, 404):
                    self.drain_errors.append(f"DELETE {cid}: {r.status_code} {r.text[:200]}")
        self.conversations = ConversationIds()
        await self._idle(timeout_s)

    async def _idle(self, timeout_s: float) -> None:
        async with httpx.AsyncClient(base_url=self.server.base_url, timeout=30) as http:
            with anyio.fail_after(timeout_s):
                while True:
                    health = (await http.get("/health")).json()
                    busy = health["live_requests"] or health["queue_depth"]
                    if not busy and not self.rt.engine.has_work():
                        return
                    await anyio.sleep(0.05)

    async def statuses(self) -> dict[str, int]:
        """The server's own count of chat completions by HTTP status (``/metrics``)."""
        async with httpx.AsyncClient(base_url=self.server.base_url, timeout=30) as http:
            text = (await http.get("/metrics")).text
        found = re.findall(r'^pask_requests_total\{status="(\d+)"\} (\S+)$', text, re.MULTILINE)
        return {code: int(float(n)) for code, n in found}


async def run_serve_soak(
    config: SoakConfig, loaded: LoadedModel | None = None, *, progress: Callable | None = None
) -> dict[str, Any]:
    """``soak.run_soak`` over HTTP: start the server, warm up, measure, run, drain, judge."""
    if loaded is None:
        loaded = await anyio.to_thread.run_sync(load_model, config.model)
    data = load_sample_questions()
    questions = [(q.db, q.question) for q in data.questions]
    planned = plan(config, questions)
    settings = ServerSettings(
        model=config.model,
        served_model_name=SERVED,
        max_queue=max(64, 2 * config.concurrency),  # the soak tests cancels, not 429
        default_max_tokens=config.max_new_tokens,
        runtime=RuntimeConfig(max_batch=config.max_batch),
    )
    with SoakServer(settings, loaded) as server:
        client = openai.AsyncOpenAI(
            base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0
        )
        async with client:
            assistants = {  # prompts and read-only execution; the model is behind the server
                db: SQLiteAssistant(path, runtime=server.runtime, candidates=1)
                for db, path in data.databases
            }
            soak = ServeSoak(server, client, config, assistants)
            warm = warm_up_plan(config, questions)
            soak.prepare(warm + planned)
            phases = await run_phases(soak, warm, planned, config, server.runtime, progress)
            statuses = await soak.statuses()
    for db in assistants.values():
        db.close()
    server_errors = [f"the server answered {code} {n} times" for code, n in statuses.items()
                     if code.startswith("5")]  # fmt: skip
    report = build_report(
        config,
        loaded,
        phases.outcomes,
        phases.warm_out,
        path="serve",
        transport=TRANSPORT,
        extra_errors=soak.drain_errors + server_errors,
        **phases.measured(),
    )
    report["server_statuses"] = statuses  # warm-up included; 499: the client went away
    report["conversations_deleted"] = soak.conversations_deleted  # warm-up included
    return report


TRANSPORT = {
    "server": "pask_agent.server.create_app under uvicorn, 127.0.0.1:<ephemeral>, same process",
    "client": f"openai {openai.__version__} AsyncOpenAI, max_retries=0",
    "tools": "streamed, tool_choice=required; cancel = stream closed after the first delta",
    "structured": "response_format json_schema, not streamed; cancel = connection dropped",
    "sql": "streamed plain chat with the assistant's schema prompt on a conversation_id, "
    "no SQL grammar (the server has no SQL route), run read-only by the client",
    "timeouts": "the client's per-request timeout",
}
