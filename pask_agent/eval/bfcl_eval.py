"""BFCL non-live accuracy and measured KV budget for every policy (paper §4.1, App. C, D).

Cases come from the installed ``bfcl_eval`` data and are scored by BFCL's official AST checker.
All cases of one (policy, budget) configuration are submitted at once, so the runtime batches
their prefill and decode steps. Every row records the store's measured budget at the end of
its request (``Usage.measured_b``, prompt + generated, scales included, App. B.3); the summary
aggregates it as ``Σ live bytes / Σ Full-KV bytes`` over cases and also per case (mean, max).
The harness (``eval/harness.py``) runs, resumes, shards, merges and writes the files.

Splits come from the fixed file ``calibration_data/splits/bfcl.json`` (``eval/splits.py``):
``calibration`` and ``dev`` (1:1 of the 2/5 not in test) are for calibrating and choosing knobs,
``test`` (3/5) only for reporting. Cases sharing a tool schema never straddle two partitions.

Usage::

    python -m pask_agent.eval.bfcl_eval --policies full,pask,streaming,h2o,snapkv,mikv,position \\
        --budgets 0.33,0.5 --cases-per-category 10 --split dev --out results/bfcl_dev

Any registered policy name works (``pask_agent.policy.POLICIES``), including the parser-free
baselines ``int4`` and ``position_both``.

writes ``results/bfcl_dev.jsonl`` (one line per case and configuration),
``results/bfcl_dev.json`` (the summaries), ``results/bfcl_dev.md`` (the table) and
``results/bfcl_dev.png`` (accuracy against measured ``B``). ``full`` keeps
everything whatever the budget, so it runs once, at ``B = 1``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pask_agent.errors import ConfigError
from pask_agent.eval.bfcl import NON_LIVE_CATEGORIES, BfclCase, ast_check_result
from pask_agent.eval.harness import Config, Measured, Run, Scored, Workload, configurations
from pask_agent.eval.harness_args import Defaults, main_of, names, run_eval
from pask_agent.eval.harness_args import add_arguments as add_shared
from pask_agent.eval.splits import cases_in

DEFAULTS = Defaults(out="results/bfcl_dev")


def load_split(
    split: str,
    per_category: int | None,
    categories: Sequence[str] = NON_LIVE_CATEGORIES,
    skip: int = 0,
) -> tuple[BfclCase, ...]:
    """The first ``per_category`` cases (all when ``None``) after the first ``skip`` of each
    category, in one partition of the fixed split file (``calibration_data/splits/bfcl.json``)."""
    return cases_in(split, per_category=per_category, categories=categories, skip_per_category=skip)


@dataclass(frozen=True)
class BfclWorkload(Workload):
    """BFCL cases asked as chat turns with their tools; the official checker scores the calls.

    ``system`` replaces the chat template's default system line (the tool list is still
    rendered by the template after it). ``output(case)``, if given, returns another output
    format for a case: ``(OutputSpec, parse)`` where ``parse(text)`` gives call dicts, named
    ``output_name`` in the settings. ``parallel`` overrides the category's
    ``parallel_tool_calls`` (True: every case may answer with an array of calls, as a chat app
    would allow; extra calls then fail the checker). ``tool_choice`` overrides the required call
    (``"auto"``: the model may answer in text, as a client that omits it gets). ``traces``, if
    given, receives one calibration trace per Full-KV case run (default output format)."""

    split: str = "dev"
    per_category: int | None = None
    categories: tuple[str, ...] = NON_LIVE_CATEGORIES
    max_new_tokens: int = 200
    system: str | None = None
    output: Callable[[BfclCase], tuple[Any, Any]] | None = None
    output_name: str = "json"
    parallel: bool | None = None
    tool_choice: str = "required"
    traces: list[Any] | None = None
    given: tuple[BfclCase, ...] | None = None  # these cases instead of the split's
    skip_per_category: int = 0  # start after the first n of each category

    name: ClassVar[str] = "bfcl"
    title: ClassVar[str] = "BFCL non-live: accuracy and measured KV budget"
    groups: ClassVar[tuple[str, ...]] = NON_LIVE_CATEGORIES
    failed_detail: ClassVar[dict[str, Any]] = {"calls": [], "text": "", "finish_reason": "error"}

    def cases(self) -> Sequence[BfclCase]:
        if self.given is not None:
            return self.given
        return load_split(self.split, self.per_category, self.categories, self.skip_per_category)

    def settings(self) -> dict[str, Any]:
        out = super().settings()
        if not self.skip_per_category:  # runs written before the option resume as they were
            out.pop("skip_per_category", None)
        return out

    def group(self, case: BfclCase) -> str:
        return case.category

    async def run(self, rt: Any, case: BfclCase, config: Config) -> Any:
        request = case.request()
        if self.parallel is not None:
            request["parallel_tool_calls"] = self.parallel
        request["tool_choice"] = self.tool_choice
        if self.system is not None:
            request["messages"] = [{"role": "system", "content": self.system}, *request["messages"]]
        spec = self.output(case) if self.output is not None else None
        if spec is not None:
            request["spec"] = spec[0]
        result = await rt.chat(
            **request,
            policy=config.policy,
            budget=config.budget,
            max_new_tokens=self.max_new_tokens,
        )
        if self.traces is not None and spec is None and config.policy_name == "full":
            from pask_agent.eval.trace_recording import case_trace

            self.traces.append(case_trace(case, request, result, rt.model_id))
        return result, spec

    def score(self, case: BfclCase, answer: Any) -> Scored:
        result, spec = answer
        if spec is None:
            calls = [{"name": c.name, "arguments": c.arguments} for c in result.tool_calls]
            valid = bool(calls) and result.finish_reason == "tool_calls"
        else:  # another output format: its parser reads the calls from the text
            calls = list(spec[1](result.text))
            valid = bool(calls) and result.finish_reason != "length"
        correct, error = False, ""
        if valid:
            check = ast_check_result(case, calls)
            correct = bool(check["valid"])
            if not correct:
                error = f"{check.get('error_type', '')}: {str(check.get('error', ''))[:300]}"
        detail = {"calls": calls, "text": result.text, "finish_reason": result.finish_reason}
        return Scored(correct, valid, error, Measured.of([result.usage]), detail)

    def note(self, cases: int) -> str:
        return (
            f"{cases} BFCL v4 non-live cases ({self.per_category or 'all'} per category"
            f"{f' after the first {self.skip_per_category}' if self.skip_per_category else ''}"
            f", split {self.split!r} of calibration_data/splits/bfcl.json), greedy, "
            f"max_new_tokens={self.max_new_tokens}, official AST checker. measured B = Σ live "
            "KV bytes / Σ Full-KV bytes at the end of each request (prompt + generated, INT4 "
            "scales included); mean B and max B are per case; B_P and B_D are the same ratio "
            "over prompt tokens and over generated tokens (realized stage budgets)."
        )


async def evaluate(
    policies: Sequence[Any],
    budgets: Sequence[float],
    *,
    per_category: int | None,
    split: str,
    out: Path,
    model: Any = "default",
    max_new_tokens: int = 200,
    log: Any = print,
    categories: Sequence[str] = NON_LIVE_CATEGORIES,
    traces_out: Path | None = None,
) -> list[Any]:
    """Run every configuration and rewrite the result files after each one (the harness's
    ``evaluate`` for BFCL). ``traces_out``: see ``write_traces``."""
    from pask_agent.eval import harness

    traces: list[Any] | None = [] if traces_out is not None else None
    workload = BfclWorkload(split, per_category, tuple(categories), max_new_tokens, traces=traces)
    run = Run(out, restart=traces_out is not None)
    summaries = await harness.evaluate(
        workload, configurations(policies, budgets), run, model=model, log=log
    )
    write_traces(workload, traces_out)
    return summaries


def write_traces(workload: BfclWorkload, path: Path | None) -> None:
    """Write the Full-KV cases the workload ran as calibration traces, in case order. A run
    that records traces starts afresh (no resume), so the file holds every case."""
    if path is None or workload.traces is None:
        return
    from pask_agent.record.traces import write_traces as write

    order = {c.id: i for i, c in enumerate(workload.cases())}
    write(path, sorted(workload.traces, key=lambda t: order[t.id]))


def add_case_arguments(
    p: argparse.ArgumentParser, categories: Sequence[str], *, skip: bool = False
) -> None:
    """Which BFCL cases of the split: the first n of each category (BFCL-shaped evals), after
    the first ``--skip-per-category`` when ``skip`` (the workloads that read it)."""
    p.add_argument(
        "--cases-per-category", "--cases", dest="cases_per_category", type=int, default=None,
        help="first n per category (default all)",
    )  # fmt: skip
    if skip:
        p.add_argument(
            "--skip-per-category", type=int, default=0,
            help="start after the first n of each category (cases no earlier run scored)",
        )  # fmt: skip
    p.add_argument("--categories", default=",".join(categories))


def add_peer_arguments(p: argparse.ArgumentParser, out: str) -> None:
    """What every peer's BFCL run takes (``kvpress_peer``, ``llamacpp_bfcl``): the cases, the
    model, the answer length, where to write, and whether to resume."""
    p.add_argument("--split", default="test", choices=("calibration", "dev", "test"))
    add_case_arguments(p, NON_LIVE_CATEGORIES, skip=True)
    p.add_argument("--model", default="default")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--out", type=Path, default=Path(out))
    p.add_argument("--restart", action="store_true", help="ignore rows an earlier run left")


def peer_workload(kind: type[BfclWorkload], args: argparse.Namespace) -> Any:
    """A peer's workload over the cases ``add_peer_arguments`` parsed."""
    categories = tuple(names(args.categories))
    return kind(
        args.split, args.cases_per_category, categories, args.max_new_tokens,
        skip_per_category=args.skip_per_category,
    )  # fmt: skip


def print_summaries(summaries: Sequence[Any], out: Path) -> None:
    for s in summaries:
        print(f"{s.label}: acc {s.overall:.3f} ({s.correct}/{s.cases}) valid "
              f"{s.valid_rate:.3f} measured B {s.measured_b:.3f} B_P "
              f"{s.measured_b_prompt or 0:.3f}")  # fmt: skip
    print(f"wrote {out}.{{jsonl,json,md,png}}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_shared(p, DEFAULTS)
    add_case_arguments(p, NON_LIVE_CATEGORIES, skip=True)
    p.add_argument(
        "--traces-out", type=Path, default=None, help="write the Full-KV run as traces (JSONL)"
    )


def run(args: argparse.Namespace) -> int:
    traces: list[Any] | None = None
    if args.traces_out is not None:
        if args.workers > 1:
            raise ConfigError("--traces-out records in one process; drop --workers")
        traces, args.restart = [], True  # the traces need every Full-KV output: run afresh
    workload = BfclWorkload(
        args.split, args.cases_per_category, tuple(names(args.categories)), args.max_new_tokens,
        traces=traces, skip_per_category=args.skip_per_category,
    )  # fmt: skip
    code = run_eval(args, workload, module=__spec__.name)
    write_traces(workload, args.traces_out)
    return code


def main(argv: list[str] | None = None) -> int:
    return main_of(add_arguments, run, "python -m pask_agent.eval.bfcl_eval", __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
