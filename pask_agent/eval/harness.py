"""One eval harness: cases -> ordered concurrent runs -> scorer -> rows with provenance.

Every accuracy eval (BFCL, SQL, structured outputs, conversations, and the ones to come) is a
:class:`Workload`: it supplies its cases, runs one case through a runtime under one
configuration (a KV policy at a budget) and scores the answer. The harness owns the rest, once:
the cases of a configuration run concurrently (the runtime batches them) and come back in case
order; each row records the case's measured KV budget and the runtime's fallback counters, the
commit it ran at, and its latency; rows are appended to ``<out>.jsonl`` as they finish, so a
killed run continues from that file (``evaluate`` skips every row already written) and ends
with the same files as one that was never stopped. Summaries, paired statistics and the
written files are in ``harness_report.py``, the shared flags in ``harness_args.py``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import anyio

from pask_agent.errors import ConfigError, PaskError
from pask_agent.eval.harness_report import Summary, summarize_rows, write_report
from pask_agent.eval.harness_rows import Measured, Row, RowFile, Scored
from pask_agent.record.provenance import provenance
from pask_agent.runtime.models.weight_formats import DEFAULT_WEIGHTS

T = TypeVar("T")
R = TypeVar("R")

__all__ = [
    "Config",
    "Measured",
    "Row",
    "Scored",
    "Workload",
    "configurations",
    "evaluate",
    "run_cases",
    "run_ordered",
]


@dataclass(frozen=True, slots=True)
class Config:
    """One configuration of a run: a KV policy (a registered name or a ``Policy``) at a target
    total budget ``B``; ``full`` always runs at ``B = 1``."""

    policy: Any
    budget: float

    @property
    def policy_name(self) -> str:
        return self.policy if isinstance(self.policy, str) else self.policy.name


def configurations(policies: Sequence[Any], budgets: Sequence[float]) -> list[Config]:
    """Every policy at every budget, budget by budget in the order given; ``full`` once.

    Raises
    ------
    ConfigError
        No policy, no budget, or a budget outside ``(0, 1]``.
    """
    if not policies or not budgets:
        raise ConfigError("name at least one policy and one budget")
    out: list[Config] = []
    for b in budgets:
        if not 0 < b <= 1:
            raise ConfigError(f"budget {b} must lie in (0, 1] (a share of Full-KV bytes)")
        for p in policies:
            name = p if isinstance(p, str) else p.name
            cfg = Config(p, 1.0 if name == "full" else b)
            if all((c.policy_name, c.budget) != (name, cfg.budget) for c in out):
                out.append(cfg)
    return out


class Workload:
    """One eval, in three hooks: ``cases()``, ``run(session, case, config)`` (the turn or
    turns one case asks, returning whatever the scorer reads) and ``score(case, answer)``.

    Subclasses are frozen dataclasses of their settings (split, limits, prompt options).
    Optional hooks: ``session`` (per-run state such as open databases), ``config_name``
    (the configuration's column in tables), ``check`` (refuse bad input before the model
    loads), ``report`` (extra JSON and Markdown sections), ``upgrade_row`` (read rows that
    older versions of the eval wrote).
    """

    name: ClassVar[str] = "eval"
    title: ClassVar[str] = "Accuracy and measured KV budget"
    group_key: ClassVar[str] = "category"  # the row key accuracy is broken down by
    # detail of a row whose request raised (so every row has the eval's fields)
    failed_detail: ClassVar[Mapping[str, Any]] = {}

    def cases(self) -> Sequence[Any]:
        raise NotImplementedError

    def case_id(self, case: Any) -> str:
        return str(case.id)

    def group(self, case: Any) -> str:
        return ""

    async def run(self, session: Any, case: Any, config: Config) -> Any:
        raise NotImplementedError

    def score(self, case: Any, answer: Any) -> Scored:
        raise NotImplementedError

    @asynccontextmanager
    async def session(self, rt: Any) -> AsyncIterator[Any]:
        """What ``run`` gets for the whole run (default: the runtime itself)."""
        yield rt

    def config_name(self, config: Config) -> str:
        return config.policy_name

    def stem(self, out: Path) -> Path:
        """The result files' path without extension, from ``--out`` (default: ``out``)."""
        return out

    def check(self, configs: Sequence[Config]) -> None:
        """Refuse unknown policy names before the model loads (``ConfigError``)."""
        from pask_agent.policy.registry import get_policy

        for c in configs:
            if isinstance(c.policy, str):
                get_policy(c.policy)

    def settings(self) -> dict[str, Any]:
        """What decides the rows besides the configuration; a resumed run must match it.
        Default: the workload's plain fields (numbers, strings, flags, lists of them) and the
        name of any field that has one (a ``Policy``)."""
        out: dict[str, Any] = {}
        for f in fields(self) if is_dataclass(self) else ():
            value = getattr(self, f.name)
            if isinstance(value, tuple) and all(isinstance(v, str | int | float) for v in value):
                out[f.name] = list(value)
            elif value is None or isinstance(value, str | int | float | bool):
                out[f.name] = value
            elif isinstance(getattr(value, "name", None), str):
                out[f.name] = value.name
        return out

    def note(self, cases: int) -> str:
        return ""

    def requests_per_case(self) -> int:
        return 1

    def report(self, rows: Sequence[Row]) -> tuple[dict[str, Any], str]:
        """Extra JSON fields and Markdown sections for the written files."""
        return {}, ""

    def upgrade_row(self, data: dict[str, Any]) -> dict[str, Any]:
        """A row as an older version wrote it, in today's keys (default: unchanged)."""
        return data


async def run_ordered(
    items: Sequence[T],
    fn: Callable[[T], Awaitable[R]],
    *,
    concurrency: int | None = None,
    on_result: Callable[[int, R], None] | None = None,
) -> list[R]:
    """``fn(item)`` for every item, at most ``concurrency`` at once (all when ``None``), so the
    runtime batches them; results in item order. ``on_result(i, result)`` sees each result as
    it finishes, in completion order."""
    if concurrency is not None and concurrency < 1:
        raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
    results: list[Any] = [None] * len(items)
    limiter = anyio.CapacityLimiter(concurrency or max(1, len(items)))

    async def one(i: int, item: T) -> None:
        async with limiter:
            results[i] = await fn(item)
        if on_result is not None:
            on_result(i, results[i])

    async with anyio.create_task_group() as tg:
        for i, item in enumerate(items):
            tg.start_soon(one, i, item)
    return results


async def run_cases(
    workload: Workload,
    session: Any,
    cases: Sequence[Any],
    config: Config,
    *,
    concurrency: int | None = None,
    on_row: Callable[[Row], None] | None = None,
    run: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> list[Row]:
    """Every case under one configuration, concurrently, scored; rows in case order, named
    ``name`` (default: the workload's name for the configuration). ``on_row`` sees each row
    as it finishes. A request that raises a ``PaskError`` (refused, or an answer that fails
    validation) is a wrong, invalid row with the error's text."""
    name = name or workload.config_name(config)
    meta = run if run is not None else {}

    async def one(case: Any) -> Row:
        start = time.perf_counter()
        try:
            scored = workload.score(case, await workload.run(session, case, config))
        except PaskError as exc:
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
            scored = Scored(False, False, error, Measured.values(), dict(workload.failed_detail))
        return Row.of(workload, case, name, config, scored, time.perf_counter() - start, meta)

    def finished(_: int, row: Row) -> None:
        if on_row is not None:
            on_row(row)

    return await run_ordered(cases, one, concurrency=concurrency, on_result=finished)


@dataclass(frozen=True, slots=True)
class Shard:
    """Every ``count``-th case from the ``index``-th (``--shard index/count``)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ConfigError(f"--shard {self.index}/{self.count}: need 0 <= I < N")

    @classmethod
    def parse(cls, text: str) -> Shard:
        try:
            index, count = (int(x) for x in text.split("/"))
        except ValueError as exc:
            raise ConfigError(f"--shard must look like 0/2, got {text!r}") from exc
        return cls(index, count)

    def of(self, cases: Sequence[T]) -> list[T]:
        return list(cases[self.index :: self.count])


@dataclass(frozen=True, slots=True)
class Run:
    """Where and how a run writes: the output stem (``<stem>.jsonl`` ...), the configurations
    paired against (``references``), and whether an existing JSONL is resumed."""

    out: Path
    references: tuple[str, ...] = ("full",)
    restart: bool = False
    concurrency: int | None = None
    shard: Shard | None = None
    device: str | None = None  # RuntimeConfig.device ("cuda": the model and pools on a GPU)
    weights: str = DEFAULT_WEIGHTS  # RuntimeConfig.weights


async def evaluate(
    workload: Workload,
    configs: Sequence[Config],
    run: Run,
    *,
    model: Any = "default",
    runtime_config: Any = None,
    log: Callable[[str], None] = print,
) -> list[Summary]:
    """Run every configuration over the workload's cases and rewrite the result files after
    each one; returns the summaries.

    Raises
    ------
    ConfigError
        An unknown policy or bad input (before the model loads), or an existing JSONL written
        with other settings (resume it with the same ones, or pass ``restart``).
    """
    from pask_agent.runtime.config import RuntimeConfig
    from pask_agent.runtime.runtime import Runtime

    workload.check(configs)
    cases = workload.cases()
    if run.shard is not None:
        cases = run.shard.of(cases)
    model_name = model if isinstance(model, str) else model.name
    settings = {"workload": workload.name, "model": model_name, **workload.settings()}
    settings |= {"shard": f"{run.shard.index}/{run.shard.count}" if run.shard else None}
    if run.device is not None:  # a GPU's rows differ in the last bits: never resumed as a CPU's
        settings["device"] = run.device
    if run.weights != DEFAULT_WEIGHTS:  # other weights, other rows: never resumed as these
        settings["weights"] = run.weights
    started = provenance()
    file = RowFile(run.out.with_suffix(".jsonl"), workload)
    # rows of other weights are other configurations: runs of each merge into one paired table
    suffix = "" if run.weights == DEFAULT_WEIGHTS else f" {run.weights} weights"
    label = {id(c): workload.config_name(c) + suffix for c in configs}
    keys = [(label[id(c)], c.budget, workload.case_id(x)) for c in configs for x in cases]
    done = {} if run.restart else file.resume(settings, set(keys))
    note = workload.note(len(cases))

    def write() -> list[Summary]:
        rows = [done[k] for k in keys if k in done]
        file.rewrite(rows)
        return write_report(run.out, workload, rows, started, settings, run.references, note)

    write()  # settings and provenance on disk before the first row
    if all(k in done for k in keys):
        return summarize_rows([done[k] for k in keys])  # a finished run: no model to load
    in_flight = min(len(cases), run.concurrency or len(cases)) * workload.requests_per_case()
    config = replace(
        runtime_config or RuntimeConfig(max_batch=max(16, in_flight), device=run.device),
        weights=run.weights,
    )
    async with Runtime.open(model, config=config) as rt, workload.session(rt) as session:
        for cfg in configs:
            name = label[id(cfg)]
            todo = [x for x in cases if (name, cfg.budget, workload.case_id(x)) not in done]

            def keep(row: Row) -> None:
                done[row.key] = row
                file.append(row)
                mark = "ok " if row.correct else "BAD"
                log(f"[{row.label}] {row.id}: {mark} B={row.measured.measured_b:.3f} {row.error}")

            start = time.perf_counter()
            await run_cases(workload, session, todo, cfg, concurrency=run.concurrency,
                            on_row=keep, run=started, name=name)  # fmt: skip
            write()
            (s,) = summarize_rows([done[k] for k in keys if k[:2] == (name, cfg.budget)])
            log(
                f"{name} B={cfg.budget:.2f}: acc {s.overall:.3f} valid {s.valid_rate:.3f} "
                f"measured B {s.measured_b:.3f} (mean {s.mean_b:.3f}, max {s.max_b:.3f}); "
                f"{len(todo)} of {len(cases)} cases run in {time.perf_counter() - start:.0f}s"
            )
    return summarize_rows([done[k] for k in keys if k in done])
