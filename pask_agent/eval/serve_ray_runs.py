"""The runs of ``eval.serve_ray``: the client workload (multi-turn chats through the ``openai``
client), the single-process reference, a local Ray Serve deployment, and the affinity and
failover runs against it (the replicas' own counters say where each turn went)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import openai

from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.models.loading import LoadedModel
from pask_agent.server import ServerSettings, create_app
from pask_agent.server.loopback import LoopbackServer

SERVED = "smol"
SYSTEM = "You are a helpful assistant. Answer in one short sentence."
TOPICS = (
    "the moon",
    "volcanoes",
    "honey bees",
    "the Nile",
    "glaciers",
    "owls",
    "copper",
    "tides",
    "bamboo",
    "comets",
    "penguins",
    "deserts",
    "coral",
    "thunder",
    "salt",
    "maple trees",
    "the Alps",
    "octopuses",
    "rain",
    "granite",
)
FOLLOW_UPS = (
    "Why is that?",
    "Tell me one more fact.",
    "How do people use that?",
    "What is surprising about it?",
    "Say it more simply.",
)


@dataclass(frozen=True, slots=True)
class Workload:
    conversations: int = 20
    turns: int = 6
    max_tokens: int = 12

    def opening(self, i: int) -> str:
        return f"Tell me one fact about {TOPICS[i % len(TOPICS)]}."

    def follow_up(self, turn: int) -> str:
        return FOLLOW_UPS[(turn - 1) % len(FOLLOW_UPS)]


@dataclass(frozen=True, slots=True)
class TurnRecord:
    conversation: int
    turn: int
    replica: str | None
    started: float
    seconds: float
    answer: str | None
    prompt_tokens: int = 0
    prefilled_tokens: int = 0
    error: str | None = None


async def run_conversations(
    base_url: str, work: Workload, *, ids: str, on_turn: Callable[[int], None] | None = None
) -> list[TurnRecord]:
    """Every conversation's turns in order, all conversations at once; the client sends the
    whole history each turn, as OpenAI clients do."""
    client = openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=600
    )
    records: list[TurnRecord] = []

    async def one(i: int) -> None:
        messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
        for turn in range(work.turns):
            messages.append(
                {"role": "user", "content": work.follow_up(turn) if turn else work.opening(i)}
            )
            t0 = time.time()
            try:
                raw = await client.chat.completions.with_raw_response.create(
                    model=SERVED,
                    messages=messages,
                    max_tokens=work.max_tokens,  # type: ignore[arg-type]
                    extra_body={"conversation_id": f"{ids}-{i}"},
                )
                done = raw.parse()
            except openai.OpenAIError as exc:
                records.append(
                    TurnRecord(i, turn, None, t0, time.time() - t0, None, error=repr(exc))
                )
                return
            answer = done.choices[0].message.content or ""
            usage = done.usage
            prompt = usage.prompt_tokens if usage else 0
            details = usage.prompt_tokens_details if usage else None
            cached = (details.cached_tokens or 0) if details else 0
            records.append(
                TurnRecord(
                    i,
                    turn,
                    raw.headers.get("x-pask-replica"),
                    t0,
                    time.time() - t0,
                    answer,
                    prompt_tokens=prompt,
                    prefilled_tokens=prompt - cached,
                )
            )
            messages.append({"role": "assistant", "content": answer})
            if on_turn is not None:
                on_turn(len(records))

    await asyncio.gather(*(one(i) for i in range(work.conversations)))
    await client.close()
    return sorted(records, key=lambda r: (r.conversation, r.turn))


def replica_settings(model: str = "smollm2-135m", kv_capacity_mb: int = 128) -> ServerSettings:
    """The server each run serves: one small KV pool per runtime, greedy answers."""
    return ServerSettings(
        model=model,
        served_model_name=SERVED,
        runtime=RuntimeConfig(max_batch=8, kv_capacity_bytes=kv_capacity_mb << 20),
    )


class RayReplicas:
    """A local Ray instance serving ``application(settings, plan)`` on loopback, until closed."""

    def __init__(self, settings: ServerSettings, plan: Any, *, num_cpus: int = 2) -> None:
        import ray
        from ray import serve

        from pask_agent.server.replicas.deployment import APP_NAME, application

        self._ray, self._serve = ray, serve
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(
                num_cpus=num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(application(settings, plan), name=APP_NAME, route_prefix="/")
        self.base_url = f"http://127.0.0.1:{port}"
        self.wait_for_replicas(plan.replicas)

    def reports(self) -> list[dict[str, Any]]:
        """The board's reports: requests per routing key, live KV bytes, up or down."""
        return httpx.get(f"{self.base_url}/v1/replicas", timeout=30).json()["data"]

    def wait_for_replicas(self, n: int, timeout_s: float = 300.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while True:
            up = [r for r in self.reports() if r["up"]]
            if len(up) >= n:
                return up
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(up)} of {n} replicas reported within {timeout_s} s")
            time.sleep(0.5)

    def kill(self, actor_name: str) -> None:
        actor = self._ray.get_actor(actor_name, namespace="serve")
        self._ray.kill(actor, no_restart=True)

    def close(self) -> None:
        self._serve.shutdown()
        if self._owns_ray:
            self._ray.shutdown()


@contextmanager
def ray_replicas(settings: ServerSettings, plan: Any) -> Iterator[RayReplicas]:
    replicas = RayReplicas(settings, plan)
    try:
        yield replicas
    finally:
        replicas.close()


def affinity(reports: list[dict[str, Any]], ids: str) -> dict[str, Any]:
    """Per conversation, how many replicas served it (from the replicas' own counters)."""
    holders: dict[str, list[str]] = {}
    for report in reports:
        for key, n in report["keys"].items():
            if key.startswith(f"conversation:{ids}-") and n > 0:
                holders.setdefault(key, []).append(report["replica"])
    one = sum(len(v) == 1 for v in holders.values())
    return {
        "conversations": len(holders),
        "on_one_replica": one,
        "affinity": one / len(holders) if holders else 0.0,
    }


def delete_conversations(base_url: str, ids: str, n: int) -> list[int]:
    return [
        httpx.delete(f"{base_url}/v1/conversations/{ids}-{i}", timeout=60).status_code
        for i in range(n)
    ]


def settled_reports(replicas: RayReplicas, after: float, timeout_s: float = 30.0) -> list[dict]:
    """The live replicas' reports made after ``after`` (their state once the last request ended)."""
    deadline = time.monotonic() + timeout_s
    while True:
        up = [r for r in replicas.reports() if r["up"]]
        if all(r["time"] > after for r in up) or time.monotonic() > deadline:
            return up
        time.sleep(0.3)


def run_affinity(replicas: RayReplicas, work: Workload, ids: str) -> dict[str, Any]:
    """The workload, then where its turns went, then every conversation deleted (a client that
    is done with a conversation frees its KV)."""
    records = asyncio.run(run_conversations(replicas.base_url, work, ids=ids))
    placed = affinity(settled_reports(replicas, time.time()), ids)
    statuses = delete_conversations(replicas.base_url, ids, work.conversations)
    return {"records": records, "affinity": placed, "delete_statuses": statuses}


def run_failover(replicas: RayReplicas, work: Workload, ids: str) -> dict[str, Any]:
    """Kill the replica holding the most of this run's conversations once half the turns are
    done (turns already sent keep running; those on the killed replica are retried by the
    ingress); then delete every conversation and read the survivors' live KV bytes."""
    half = work.conversations * work.turns // 2
    killed: dict[str, Any] = {}
    fired = threading.Event()

    def on_turn(done: int) -> None:
        if done >= half and not fired.is_set():
            fired.set()
            kill_busiest()  # on the clients' loop: no new turn starts until the kill is sent

    def kill_busiest() -> None:
        reports = [r for r in replicas.reports() if r["up"]]
        mine = f"conversation:{ids}-"
        victim = max(
            reports, key=lambda r: sum(n for k, n in r["keys"].items() if k.startswith(mine))
        )

        killed.update(
            replica=victim["replica"],
            at=time.time(),
            conversations=sum(k.startswith(f"conversation:{ids}-") for k in victim["keys"]),
        )
        replicas.kill(victim["actor_name"])

    records = asyncio.run(run_conversations(replicas.base_url, work, ids=ids, on_turn=on_turn))
    statuses = delete_conversations(replicas.base_url, ids, work.conversations)
    after = time.time()
    survivors = [
        r for r in settled_reports(replicas, after) if r["replica"] != killed.get("replica")
    ]
    return {
        "records": records,
        "killed": killed,
        "delete_statuses": statuses,
        "survivors": [
            {k: r[k] for k in ("replica", "kv_live_bytes", "conversations", "requests")}
            for r in survivors
        ],
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_single(
    settings: ServerSettings, work: Workload, loaded: LoadedModel | None = None
) -> list[TurnRecord]:
    """The reference: one process, one runtime (``pask-agent serve``'s app on loopback)."""
    with LoopbackServer(create_app(settings, loaded=loaded)) as server:
        return asyncio.run(run_conversations(server.base_url, work, ids="single"))
