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
paired comparisons, command, commit, machine), ``<out>.md`` and ``<out>.png`` through the
harness (``eval/harness.py``), which also resumes, shards and merges.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from pask_agent.errors import ConfigError
from pask_agent.eval.bfcl import BfclCase, ast_check_result
from pask_agent.eval.bfcl_eval import add_case_arguments
from pask_agent.eval.harness import Config, Measured, Row, Run, Scored, Workload, configurations
from pask_agent.eval.harness_args import Defaults, main_of, names, run_eval
from pask_agent.eval.harness_args import add_arguments as add_shared
from pask_agent.eval.harness_report import summarize_rows
from pask_agent.eval.splits import cases_in
from pask_agent.eval.tag_buckets import bucket_summary, bucket_table, buckets_of
from pask_agent.grammars.tool_spec import ToolSpec

CATEGORIES: tuple[str, ...] = ("simple_python", "multiple")
DEFAULTS = Defaults(out="results/structured_dev", max_new_tokens=256)


@dataclass(frozen=True, slots=True)
class StructuredTask:
    """One BFCL case asked as a structured output: ``runtime.call(task.schema, task.prompt)``."""

    case: BfclCase
    function: ToolSpec  # the gold function; its normalized parameters are the schema
    prompt: str
    system: str | None = None

    @property
    def id(self) -> str:
        return self.case.id

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


@dataclass(frozen=True)
class StructuredWorkload(Workload):
    """BFCL single-call cases asked through ``Runtime.call``; a row's one call is the task's
    function with the answer as arguments, and its tag counts give the structural buckets."""

    split: str = "dev"
    per_category: int | None = None
    categories: tuple[str, ...] = CATEGORIES
    max_new_tokens: int = 256

    name: ClassVar[str] = "structured"
    title: ClassVar[str] = (
        "BFCL as structured outputs (runtime.call): accuracy and measured KV budget"
    )
    groups: ClassVar[tuple[str, ...]] = CATEGORIES
    failed_detail: ClassVar[dict[str, Any]] = {
        "calls": [], "text": "", "finish_reason": "error", "buckets": 0,
    }  # fmt: skip

    def cases(self) -> Sequence[StructuredTask]:
        return structured_tasks(self.split, self.per_category, self.categories)

    def group(self, task: StructuredTask) -> str:
        return task.case.category

    async def run(self, rt: Any, task: StructuredTask, config: Config) -> Any:
        # a cut or invalid answer raises ValidationFailedError: the harness's invalid row
        return await rt.call(
            task.schema, task.prompt, policy=config.policy, budget=config.budget,
            max_new_tokens=self.max_new_tokens, system=task.system, with_usage=True,
        )  # fmt: skip

    def score(self, task: StructuredTask, answer: Any) -> Scored:
        value, usage = answer
        check = check_arguments(task, value)
        correct = bool(check["valid"])
        error = (
            "" if correct else f"{check.get('error_type', '')}: {str(check.get('error', ''))[:300]}"
        )
        detail = {
            "calls": [{"name": task.function.name, "arguments": value}],
            "text": json.dumps(value, ensure_ascii=False), "finish_reason": "stop",
            "buckets": buckets_of(usage.tag_counts),
        }  # fmt: skip
        # valid: Runtime.call returned complete JSON that validates against the schema
        return Scored(correct, True, error, Measured.of([usage]), detail)

    def note(self, cases: int) -> str:
        return (
            f"{cases} BFCL v4 single-function cases ({self.per_category or 'all'} per category "
            f"of {', '.join(self.categories)}; split {self.split!r} of "
            "calibration_data/splits/bfcl.json) asked as structured outputs: schema = the gold "
            "function's normalized parameters, prompt = the question + one line naming the "
            "function and its description (+ Runtime.call's field list). Greedy, "
            f"max_new_tokens={self.max_new_tokens}; the answer is scored by BFCL's AST checker "
            "as a call of that function; 'valid' = Runtime.call returned an answer that "
            "validates against the schema. measured B = Σ live KV bytes / Σ Full-KV bytes at "
            "the end of each request (prompt + generated, INT4 scales included); B_P / B_D "
            "split it over prompt and generated tokens. Buckets: usage.tag_counts keys other "
            "than untagged/tagger_fallback."
        )

    def report(self, rows: Sequence[Row]) -> tuple[dict[str, Any], str]:
        buckets = [
            bucket_summary(s.config, s.budget, [
                r.measured.tag_counts if r.valid_call else None
                for r in rows if (r.config, r.budget) == (s.config, s.budget)
            ])
            for s in summarize_rows(rows)
        ]  # fmt: skip
        md = "## Structural buckets of the generated tokens\n\n" + bucket_table(buckets)
        return {"buckets": [asdict(b) for b in buckets]}, md


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
) -> list[Any]:
    """Run every policy (names or ``Policy`` objects; ``full`` at ``B = 1``) on the same tasks
    and rewrite the result files after each one. ``model`` is a name or a ``LoadedModel``."""
    from pask_agent.eval import harness

    workload = StructuredWorkload(split, per_category, tuple(categories), max_new_tokens)
    configs = configurations(policies, [budget])
    return await harness.evaluate(workload, configs, Run(out), model=model, log=log)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_shared(p, DEFAULTS)
    add_case_arguments(p, CATEGORIES)


def run(args: argparse.Namespace) -> int:
    workload = StructuredWorkload(
        args.split, args.cases_per_category, tuple(names(args.categories)), args.max_new_tokens
    )
    return run_eval(args, workload, module=__spec__.name)


def main(argv: list[str] | None = None) -> int:
    return main_of(add_arguments, run, "python -m pask_agent.eval.structured_eval", __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
