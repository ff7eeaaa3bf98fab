"""Load-and-cancellation soak of the in-process API: every request ends, nothing leaks.

Why: an agent runtime sits under other programs, which cancel, time out and retry. A request
that ends any way other than normally must still give back its KV slots, its admission
reservation and its memory, or a long-running server slowly stops admitting work. The soak
sends ``requests`` requests through ``concurrency`` concurrent clients, mixing the three
workloads (tool calls through ``Runtime.stream``, structured output through ``Runtime.call``
with Pydantic schemas, text-to-SQL through ``SQLiteAssistant``), cancels a share of them
mid-flight and gives another share a deadline too short to meet (``anyio.fail_after``).

At the end, after every conversation is closed: the store must hold 0 live bytes and no
sequence, every slot of every pool must be free exactly once (``KVStore.audit``), the engine
must have no live or queued request, no error other than the intended cancellations and
timeouts may have occurred, and the process RSS must be within ``rss_tolerance`` of its
warm baseline (taken after one warm-up wave that grows the pools and compiles the grammars).

    python -m pask_agent.eval.soak --out results/soak      # writes results/soak.{json,md}

``--serve`` sends the same plan to the OpenAI-compatible server over HTTP instead
(``soak_serve.py``) and checks the same things on the runtime behind it; the report's ``path``
says which was covered. The soak is bounded in request count and in wall time
(``time_limit_s``).
"""

from __future__ import annotations

import argparse
import gc
import os
import shlex
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from pask_agent.eval.soak_report import build_report, environment, write
from pask_agent.eval.soak_workload import (
    STRUCTURED,
    TOOLS,
    Planned,
    SoakConfig,
    plan,
    warm_up_plan,
)
from pask_agent.eval.sql_data import load_sample_questions
from pask_agent.integrations.sql import SQLiteAssistant
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.models.loading import LoadedModel, load_model
from pask_agent.runtime.runtime import Runtime
from pask_agent.runtime.turns.results import ChatResult, Delta


@dataclass
class Outcome:
    index: int
    kind: str
    fate: str
    status: str = "pending"  # ok | cancelled | timed_out | error
    latency_s: float = 0.0
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


class Soak:
    """Runs planned requests against one open Runtime and records how each ended."""

    def __init__(self, rt: Runtime, config: SoakConfig, assistants: dict[str, SQLiteAssistant]):
        self.rt = rt
        self.config = config
        self.assistants = assistants

    async def request(self, p: Planned, first_token: anyio.Event) -> dict[str, Any]:
        """Send one request and return a short description of its answer."""
        if p.kind == "tools":
            result = None
            async for item in self.rt.stream(
                [{"role": "user", "content": p.prompt}],
                tools=TOOLS,
                tool_choice="required",
                parallel_tool_calls=False,
                max_new_tokens=self.config.max_new_tokens,
                with_result=True,
            ):
                if isinstance(item, Delta):
                    first_token.set()
                elif isinstance(item, ChatResult):
                    result = item
            if result is None or not result.tool_calls:
                raise RuntimeError(f"no tool call in {result.text if result else None!r}")
            return {"calls": [c.name for c in result.tool_calls]}
        if p.kind == "structured":
            which, text = p.prompt.split("|", 1)
            schema, template = STRUCTURED[int(which)]
            value = await self.rt.call(
                schema, template.format(text=text), max_new_tokens=self.config.max_new_tokens
            )
            return {"value": value.model_dump()}
        db, question = p.prompt.split("|", 1)
        answer = await self.assistants[db].ask(question)
        # A query SQLite refuses is the model's miss, reported in the answer, not a fault.
        return {"sql": answer.sql, "sqlite_error": answer.error, "rows": len(answer.rows)}

    def deadline(self, p: Planned) -> AbstractContextManager[object]:
        """The short deadline of a ``timeout`` request: a caller's ``anyio.fail_after``.

        The HTTP soak overrides it: there the deadline is the client's own request timeout.
        """
        return anyio.fail_after(p.delay_s) if p.fate == "timeout" else nullcontext()

    async def run_one(self, p: Planned) -> Outcome:
        out = Outcome(p.index, p.kind, p.fate)
        first_token = anyio.Event()
        start = time.perf_counter()
        try:
            with self.deadline(p):
                if p.fate == "cancel":
                    out.detail = await _cancelled(self.request(p, first_token), first_token, p)
                else:
                    out.detail = await self.request(p, first_token)
            out.status = "ok" if out.detail is not None else "cancelled"
        except TimeoutError:
            out.status = "timed_out"
        except Exception as exc:  # noqa: BLE001 - every unintended error is counted, not raised
            out.status, out.error = "error", f"{type(exc).__name__}: {exc}"[:300]
        out.latency_s = time.perf_counter() - start
        return out

    async def run(
        self,
        planned: list[Planned],
        outcomes: list[Outcome],
        progress: Callable[[str], None] | None = None,
    ) -> None:
        """Run the plan through ``concurrency`` clients, each taking the next request.

        Outcomes are appended as requests end, so a run stopped by the time limit still
        reports what it did.
        """
        queue = list(reversed(planned))
        start = time.perf_counter()

        async def client() -> None:
            while queue:
                outcomes.append(await self.run_one(queue.pop()))
                if progress and len(outcomes) % 25 == 0:
                    states = Counter(o.status for o in outcomes)
                    progress(
                        f"{len(outcomes)} ended after {time.perf_counter() - start:.0f} s: "
                        f"{dict(states)}"
                    )

        async with anyio.create_task_group() as tg:
            for _ in range(min(self.config.concurrency, len(planned))):
                tg.start_soon(client)

    async def drain(self, timeout_s: float = 60.0) -> None:
        """Close every conversation (the SQL assistant's) and wait until the engine is idle."""
        for cid in self.rt.conversation_ids:
            self.rt.end_conversation(cid)
        with anyio.fail_after(timeout_s):
            while self.rt.engine.has_work():
                await anyio.sleep(0.05)


async def _cancelled(
    work: Awaitable[dict[str, Any]], first_token: anyio.Event, p: Planned
) -> dict[str, Any] | None:
    """Run ``work`` while another task cancels it, like a client that hangs up.

    Returns None when the cancel landed, the answer when the work finished first.
    """
    result: dict[str, Any] | None = None
    scope = anyio.CancelScope()

    async def canceller() -> None:
        if p.delay_s:
            await anyio.sleep(p.delay_s)
        else:
            await first_token.wait()
        scope.cancel()

    error: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(canceller)
        with scope:
            try:
                result = await work
            except Exception as exc:  # noqa: BLE001 - re-raised below, outside the task group
                error = exc
        tg.cancel_scope.cancel()
    if error is not None:
        raise error
    return None if scope.cancelled_caught else result


def rss_bytes() -> int:
    """This process's resident set size now, after a full garbage collection (Linux)."""
    gc.collect()
    resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


async def run_soak(
    config: SoakConfig, loaded: LoadedModel | None = None, *, progress: Callable | None = None
) -> dict[str, Any]:
    """Warm up, take the RSS baseline, run the plan, drain, and measure what is left.

    ``loaded`` reuses an already loaded model (tests); otherwise ``config.model`` is loaded.
    Returns the report written to ``soak.json``.
    """
    if loaded is None:
        loaded = await anyio.to_thread.run_sync(load_model, config.model)
    data = load_sample_questions()
    questions = [(q.db, q.question) for q in data.questions]
    planned = plan(config, questions)
    rt_config = RuntimeConfig(max_batch=config.max_batch)
    async with Runtime.open(loaded, config=rt_config) as rt:
        assistants = {
            # one request per SQL ask (no candidate batch): the soak counts requests
            db: SQLiteAssistant(
                path, runtime=rt, max_new_tokens=config.max_new_tokens, candidates=1
            )
            for db, path in data.databases
        }
        soak = Soak(rt, config, assistants)
        phases = await run_phases(soak, warm_up_plan(config, questions), planned, config, rt,
                                  progress)  # fmt: skip
    return build_report(config, loaded, phases.outcomes, phases.warm_out, **phases.measured())


@dataclass
class Phases:
    """What :func:`run_phases` saw: the warm-up and the planned run, and what was left."""

    warm_out: list[Outcome]
    outcomes: list[Outcome]
    warm_s: float
    wall_s: float
    time_limit_hit: bool
    rss: tuple[int, int]
    pool_baseline: int
    left: dict[str, Any]

    def measured(self) -> dict[str, Any]:
        """``build_report``'s keyword arguments."""
        return {"wall_s": self.wall_s, "warm_s": self.warm_s,
                "time_limit_hit": self.time_limit_hit, "rss": self.rss,
                "pool_baseline": self.pool_baseline, **self.left}  # fmt: skip


async def run_phases(
    soak: Any,
    warm: list[Planned],
    planned: list[Planned],
    config: SoakConfig,
    rt: Runtime,
    progress: Callable | None = None,
) -> Phases:
    """Warm up and drain, take the RSS and pool baselines, run the plan under the time limit,
    drain, and read what the runtime still holds — the same for both soak paths (``soak`` has
    ``run(planned, outcomes[, progress])`` and ``drain()``)."""
    t0 = time.perf_counter()
    warm_out: list[Outcome] = []
    await soak.run(warm, warm_out)
    await soak.drain()
    warm_s = time.perf_counter() - t0
    rss_baseline = rss_bytes()
    pool_baseline = rt.engine.store.allocated_bytes()
    if progress:
        mib = rss_baseline >> 20
        progress(f"warm-up: {len(warm_out)} requests in {warm_s:.0f} s, RSS {mib} MiB")
    t0 = time.perf_counter()
    outcomes: list[Outcome] = []
    with anyio.move_on_after(config.time_limit_s) as limit:
        await soak.run(planned, outcomes, progress)
    outcomes.sort(key=lambda o: o.index)
    await soak.drain()
    wall_s = time.perf_counter() - t0
    left = leftovers(rt)
    return Phases(warm_out, outcomes, warm_s, wall_s, limit.cancelled_caught,
                  (rss_baseline, rss_bytes()), pool_baseline, left)  # fmt: skip


def leftovers(rt: Runtime) -> dict[str, Any]:
    """What a drained runtime still holds; both soak paths judge it the same way.

    Call it only once the engine is idle: it reads the store without the worker's help.
    """
    store = rt.engine.store
    try:
        store.audit()
        audit_error = None
    except Exception as exc:  # noqa: BLE001 - reported as a failed check
        audit_error = str(exc)
    return {
        "leaked": store.live_bytes(),
        "audit_error": audit_error,
        "engine_idle": not rt.engine.live and not rt.engine.inbox,
        "sequences_left": store.num_sequences,
        "pool_after": store.allocated_bytes(),
    }


def main(argv: list[str] | None = None) -> int:
    d = SoakConfig()
    p = argparse.ArgumentParser(prog="python -m pask_agent.eval.soak", description=__doc__)
    p.add_argument("--model", default=d.model)
    p.add_argument("--requests", type=int, default=d.requests)
    p.add_argument("--concurrency", type=int, default=d.concurrency)
    p.add_argument("--cancel-fraction", type=float, default=d.cancel_fraction)
    p.add_argument("--timeout-fraction", type=float, default=d.timeout_fraction)
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--max-batch", type=int, default=d.max_batch)
    p.add_argument("--time-limit-s", type=float, default=d.time_limit_s)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--out", default="results/soak", help="writes <out>.json and <out>.md")
    p.add_argument(
        "--serve",
        action="store_true",
        help="send the requests over HTTP to `pask-agent serve` (started in this process on a "
        "loopback port) with the openai client, instead of through the in-process API",
    )
    args = p.parse_args(argv)
    config = SoakConfig(
        model=args.model,
        requests=args.requests,
        concurrency=args.concurrency,
        cancel_fraction=args.cancel_fraction,
        timeout_fraction=args.timeout_fraction,
        max_new_tokens=args.max_new_tokens,
        time_limit_s=args.time_limit_s,
        seed=args.seed,
        max_batch=args.max_batch,
    )
    argv = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "-m", "pask_agent.eval.soak", *argv])
    env = environment(command)

    def say(message: str) -> None:
        print(message, flush=True)

    if args.serve:
        from pask_agent.eval.soak_serve import run_serve_soak

        report = anyio.run(lambda: run_serve_soak(config, progress=say))
    else:
        report = anyio.run(lambda: run_soak(config, progress=say))
    report.update(env)
    write(report, Path(args.out))
    print(Path(args.out).with_suffix(".md").read_text())
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
