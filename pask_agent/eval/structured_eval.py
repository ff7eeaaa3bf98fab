"""BFCL single-function cases as structured outputs: ``await runtime.call(schema, prompt)``
scored by BFCL's own AST checker (issue 13 item 3).

Each case of ``simple_python`` and ``multiple`` becomes one extraction task. The JSON Schema is
the gold function's parameters, normalized as :class:`~pask_agent.grammars.tool_spec.ToolSpec`
normalizes them (BFCL's ``dict``/``float``/``tuple`` become JSON Schema, objects are closed); in
``multiple`` the gold function is the one the ground truth calls, and the other functions are
not shown. The prompt is the BFCL question plus one line naming what to extract (the function's
name and description); ``Runtime.call`` appends its field list after it. The answer, a dict of
arguments, is scored as a call of that function with those arguments by the official checker,
so a structured answer passes exactly when the same arguments in a tool call would.

Every configuration answers the same cases; policies are compared with Full KV paired (bootstrap
interval and exact McNemar, ``eval/paired.py``). Per case the run records the measured ``B``
(never the configured one), the generated tokens per structural bucket (``usage.tag_counts``)
and the tokens the tagger could not place (``tagger_fallbacks``; anything but 0 is a bug).

Usage::

    python -m pask_agent.eval.structured_eval --split test --cases-per-category 40 \\
        --policies full,pask,mikv --budget 0.33 --out results/structured_test

writes ``<out>.jsonl`` (one line per case and policy), ``<out>.json`` (summaries, bucket counts,
paired comparisons, command, commit, machine), ``<out>.md`` and ``<out>.png``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio

from pask_agent.errors import ConfigError, PaskError
from pask_agent.eval.bfcl import BfclCase, ast_check_result
from pask_agent.eval.bfcl_eval import CaseResult, ConfigSummary, summarize
from pask_agent.eval.bfcl_eval import write_results as bfcl_write_results
from pask_agent.eval.splits import PARTITIONS, cases_in
from pask_agent.eval.tag_buckets import BucketSummary, bucket_summary, bucket_table, buckets_of
from pask_agent.grammars.tool_spec import ToolSpec
from pask_agent.record.provenance import provenance

CATEGORIES: tuple[str, ...] = ("simple_python", "multiple")


@dataclass(frozen=True, slots=True)
class StructuredTask:
    """One BFCL case asked as a structured output: ``runtime.call(task.schema, task.prompt)``."""

    case: BfclCase
    function: ToolSpec  # the gold function; its normalized parameters are the schema
    prompt: str
    system: str | None = None

    @property
    def schema(self) -> dict[str, Any]:
        return dict(self.function.parameters)


def structured_task(case: BfclCase) -> StructuredTask:
    """The extraction task for a single-call case (the gold function's schema).

    Raises
    ------
    ConfigError
        The case expects more or fewer than one call, or its gold function is not listed.
    """
    if len(case.ground_truth) != 1:
        raise ConfigError(f"{case.id}: {len(case.ground_truth)} expected calls; need exactly 1")
    ((name, _),) = case.ground_truth[0].items()
    specs = {spec.name: spec for spec in case.tools()}
    if name not in specs:
        raise ConfigError(f"{case.id}: the ground truth calls unknown function {name!r}")
    spec = specs[name]
    system = "\n".join(m["content"] for m in case.messages if m["role"] == "system") or None
    question = "\n".join(m["content"] for m in case.messages if m["role"] != "system")
    what = spec.description.strip().rstrip(".")
    line = f"Extract the arguments of a call of {spec.name}" + (f" ({what})." if what else ".")
    return StructuredTask(case, spec, f"{question}\n\n{line}", system)


def structured_tasks(
    split: str, per_category: int | None, categories: Sequence[str] = CATEGORIES
) -> tuple[StructuredTask, ...]:
    """The first ``per_category`` cases of each category of one partition of the fixed split
    (``calibration_data/splits/bfcl.json``) as tasks."""
    return tuple(structured_task(c) for c in cases_in(split, per_category=per_category,
                                                      categories=categories))  # fmt: skip


def check_arguments(task: StructuredTask, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """BFCL's checker result (``valid``, ``error``, ``error_type``) for the answer read as a
    call of the task's function with ``arguments``."""
    return ast_check_result(task.case, [{"name": task.function.name, "arguments": arguments}])


@dataclass(frozen=True, slots=True)
class StructuredResult:
    """One task under one configuration: the BFCL-shaped result (its one call is the task's
    function with the answer as arguments) and the generated tokens per structural bucket."""

    result: CaseResult
    tag_counts: dict[str, int] = field(default_factory=dict)

    @property
    def buckets(self) -> int:
        """Structural buckets the generated tokens spread over."""
        return buckets_of(self.tag_counts)

    def row(self) -> dict[str, Any]:
        return {**asdict(self.result), "tag_counts": self.tag_counts, "buckets": self.buckets}


async def run_policy(
    rt: Any,
    tasks: Sequence[StructuredTask],
    policy: Any,
    budget: float,
    *,
    max_new_tokens: int = 256,
) -> list[StructuredResult]:
    """All ``tasks`` under one policy (a name or a ``Policy``) and budget, submitted together
    so the runtime batches them; results come back in task order."""
    results: list[StructuredResult | None] = [None] * len(tasks)

    async def one(i: int, task: StructuredTask) -> None:
        results[i] = await _run_task(rt, task, policy, budget, max_new_tokens)

    async with anyio.create_task_group() as tg:
        for i, task in enumerate(tasks):
            tg.start_soon(one, i, task)
    return [r for r in results if r is not None]


async def _run_task(
    rt: Any, task: StructuredTask, policy: Any, budget: float, max_new_tokens: int
) -> StructuredResult:
    label = policy if isinstance(policy, str) else policy.name
    case = task.case
    try:
        value, usage = await rt.call(
            task.schema,
            task.prompt,
            policy=policy,
            budget=budget,
            max_new_tokens=max_new_tokens,
            system=task.system,
            with_usage=True,
        )
    except PaskError as exc:  # a cut or invalid answer (ValidationFailedError), a refused request
        return StructuredResult(CaseResult(
            case.id, case.category, label, budget, False, False, (), "", "error",
            0, 0, 0, 0, 0.0, f"{type(exc).__name__}: {str(exc)[:300]}",
        ))  # fmt: skip
    check = check_arguments(task, value)
    correct = bool(check["valid"])
    error = "" if correct else f"{check.get('error_type', '')}: {str(check.get('error', ''))[:300]}"
    u = usage
    result = CaseResult(
        case.id,
        case.category,
        label,
        budget,
        correct,
        True,  # Runtime.call returned: complete JSON that validates against the schema
        ({"name": task.function.name, "arguments": value},),
        json.dumps(value, ensure_ascii=False),
        "stop",
        u.prompt_tokens,
        u.completion_tokens,
        u.kv_bytes,
        u.full_kv_bytes,
        u.measured_b,
        error,
        u.tagger_fallbacks,
        u.prompt_kv_bytes,
        u.prompt_full_kv_bytes,
    )
    return StructuredResult(result, dict(u.tag_counts))


def write_results(
    out: Path,
    results: Sequence[StructuredResult],
    summaries: Sequence[ConfigSummary],
    buckets: Sequence[BucketSummary],
    note: str,
    run: dict[str, Any] | None = None,
) -> None:
    """Write ``<out>.jsonl``, ``<out>.json``, ``<out>.md`` and the plot ``<out>.png``.

    ``run`` is the provenance taken when the run started (default: now); taken later, the
    commit could be one that others made while the run was going."""
    bfcl_write_results(
        out,
        [r.result for r in results],
        summaries,
        note,
        title="BFCL as structured outputs (runtime.call): accuracy and measured KV budget",
        rows=[r.row() for r in results],
        extra_json={"buckets": [asdict(b) for b in buckets]},
        extra_markdown="\n## Structural buckets of the generated tokens\n\n"
        + bucket_table(buckets),
        run=run,
    )


async def evaluate(
    policies: Sequence[Any],
    budget: float,
    *,
    per_category: int | None,
    split: str,
    out: Path,
    model: Any = "default",
    max_new_tokens: int = 256,
    categories: Sequence[str] = CATEGORIES,
    log: Any = print,
) -> list[ConfigSummary]:
    """Run every policy (names or ``Policy`` objects; ``full`` at ``B = 1``) on the same tasks
    and rewrite the result files after each one. ``model`` is a name or a ``LoadedModel``.

    Raises
    ------
    ConfigError
        An unknown policy name, a budget outside ``(0, 1]``, or no policy.
    """
    from pask_agent.policy.registry import get_policy
    from pask_agent.runtime.config import RuntimeConfig
    from pask_agent.runtime.runtime import Runtime

    if not policies:
        raise ConfigError("name at least one policy")
    if not 0 < budget <= 1:
        raise ConfigError(f"budget {budget} must lie in (0, 1] (a share of Full-KV bytes)")
    for p in policies:
        if isinstance(p, str):
            get_policy(p)  # unknown names fail before the model loads
    tasks = structured_tasks(split, per_category, categories)
    model_name = model if isinstance(model, str) else model.name
    note = (
        f"{len(tasks)} BFCL v4 single-function cases ({per_category or 'all'} per category of "
        f"{', '.join(categories)}; split {split!r} of calibration_data/splits/bfcl.json) asked "
        "as structured outputs: schema = the gold function's normalized parameters, prompt = "
        "the question + one line naming the function and its description (+ Runtime.call's "
        f"field list). Model {model_name!r}, greedy, max_new_tokens={max_new_tokens}; the "
        "answer is scored by BFCL's AST checker as a call of that function; 'valid calls' = "
        "Runtime.call returned an answer that validates against the schema. measured B = "
        "Σ live KV bytes / Σ Full-KV bytes at the end of each request (prompt + generated, "
        "INT4 scales included); B_P / B_D split it over prompt and generated tokens. Buckets: "
        "usage.tag_counts keys other than untagged/tagger_fallback."
    )
    run = provenance()
    config = RuntimeConfig(max_batch=max(16, len(tasks)))
    results: list[StructuredResult] = []
    summaries: list[ConfigSummary] = []
    buckets: list[BucketSummary] = []
    async with Runtime.open(model, config=config) as rt:
        for policy in policies:
            label = policy if isinstance(policy, str) else policy.name
            b = 1.0 if label == "full" else budget
            start = time.perf_counter()
            batch = await run_policy(rt, tasks, policy, b, max_new_tokens=max_new_tokens)
            summary = summarize([r.result for r in batch], time.perf_counter() - start)
            results += batch
            summaries.append(summary)
            counts = [r.tag_counts if r.result.valid_call else None for r in batch]
            buckets.append(bucket_summary(label, b, counts))
            write_results(out, results, summaries, buckets, note, run)
            spread = buckets[-1]
            log(
                f"{label} B={b:.2f}: acc {summary.overall:.3f} measured B "
                f"{summary.measured_b:.3f} buckets/case {spread.mean_buckets:.2f} fallbacks "
                f"{spread.tagger_fallbacks} errors {spread.errors} in {summary.seconds:.0f}s"
            )
    return summaries


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pask_agent.eval.structured_eval")
    p.add_argument("--policies", default="full,pask", help="comma-separated policy names")
    p.add_argument("--budget", type=float, default=0.33, help="target total B (full runs at 1)")
    p.add_argument("--cases-per-category", type=int, default=None, help="first n (default all)")
    p.add_argument("--categories", default=",".join(CATEGORIES))
    p.add_argument("--split", default="dev", choices=PARTITIONS)
    p.add_argument("--out", default="results/structured_dev", help="path without extension")
    p.add_argument("--model", default="default")
    p.add_argument("--max-new-tokens", type=int, default=256)
    args = p.parse_args(argv)
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    categories = [x.strip() for x in args.categories.split(",") if x.strip()]
    anyio.run(
        lambda: evaluate(
            policies,
            args.budget,
            per_category=args.cases_per_category,
            split=args.split,
            out=Path(args.out),
            model=args.model,
            max_new_tokens=args.max_new_tokens,
            categories=categories,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
