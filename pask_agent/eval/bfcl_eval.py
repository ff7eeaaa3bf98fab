"""BFCL non-live accuracy and measured KV budget for every policy (paper §4.1, App. C, D).

Cases come from the installed ``bfcl_eval`` data and are scored by BFCL's official AST checker.
All cases of one (policy, budget) configuration are submitted at once, so the runtime batches
their prefill and decode steps. Every result records the store's measured budget at the end of
its request (``Usage.measured_b``, prompt + generated, scales included, App. B.3); the summary
aggregates it as ``Σ live bytes / Σ Full-KV bytes`` over cases and also as a per-case mean.

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
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio

from pask_agent.errors import ConfigError, PaskError
from pask_agent.eval.bfcl import NON_LIVE_CATEGORIES, BfclCase, ast_check_result
from pask_agent.eval.paired import PairedComparison, compare_paired, paired_table
from pask_agent.eval.plots import plot_accuracy_vs_budget
from pask_agent.eval.splits import PARTITIONS, cases_in
from pask_agent.record.provenance import provenance


def load_split(
    split: str, per_category: int | None, categories: Sequence[str] = NON_LIVE_CATEGORIES
) -> tuple[BfclCase, ...]:
    """The first ``per_category`` cases (all when ``None``) of one partition of the fixed split
    file (``calibration_data/splits/bfcl.json``), category by category."""
    return cases_in(split, per_category=per_category, categories=categories)


@dataclass(frozen=True, slots=True)
class CaseResult:
    """One case under one configuration. ``valid_call``: a complete, parseable tool call."""

    id: str
    category: str
    policy: str
    budget: float
    correct: bool
    valid_call: bool
    calls: tuple[dict[str, Any], ...]
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    kv_bytes: int
    full_kv_bytes: int
    measured_b: float
    error: str = ""
    tagger_fallbacks: int = 0  # generated tokens the structural tagger could not place
    prompt_kv_bytes: int = 0  # the prompt's part of kv_bytes / full_kv_bytes (0: not recorded)
    prompt_full_kv_bytes: int = 0


@dataclass(frozen=True, slots=True)
class ConfigSummary:
    """Accuracy per category and overall, valid-call rate and measured ``B`` of one config."""

    policy: str
    budget: float
    cases: int
    accuracy: dict[str, float]
    overall: float
    valid_rate: float
    measured_b: float  # Σ live / Σ full over cases
    mean_b: float  # mean of per-case measured B
    max_b: float
    seconds: float
    measured_b_prompt: float | None = None  # Σ prompt live / Σ prompt full (realized B_P)
    measured_b_answer: float | None = None  # the same over generated tokens (realized B_D)


async def run_config(
    rt: Any,
    cases: Sequence[BfclCase],
    policy: str,
    budget: float,
    *,
    max_new_tokens: int = 200,
    system: str | None = None,
    output: Any = None,
    traces: list[Any] | None = None,
    parallel: bool | None = None,
) -> list[CaseResult]:
    """All ``cases`` under one policy and budget, submitted together (the runtime batches).

    ``system`` replaces the chat template's default system line (the tool list is still
    rendered by the template after it). ``output(case)``, if given, returns another output
    format for a case: ``(OutputSpec, parse)`` where ``parse(text)`` gives call dicts.
    ``traces``, if given, receives one calibration trace per case (default output format).
    ``parallel`` overrides the category's ``parallel_tool_calls`` (True: every case may answer
    with an array of calls, as a chat app would allow; extra calls then fail the checker)."""
    results: list[CaseResult | None] = [None] * len(cases)

    async def one(i: int, case: BfclCase) -> None:
        spec = output(case) if output is not None else None
        results[i] = await _run_case(
            rt, case, policy, budget, max_new_tokens, system, spec, traces, parallel
        )

    async with anyio.create_task_group() as tg:
        for i, case in enumerate(cases):
            tg.start_soon(one, i, case)
    return [r for r in results if r is not None]


async def _run_case(
    rt: Any,
    case: BfclCase,
    policy: str,
    budget: float,
    max_new_tokens: int,
    system: str | None,
    output: Any = None,
    traces: list[Any] | None = None,
    parallel: bool | None = None,
) -> CaseResult:
    request = case.request()
    if parallel is not None:
        request["parallel_tool_calls"] = parallel
    if system is not None:
        request["messages"] = [{"role": "system", "content": system}, *request["messages"]]
    if output is not None:  # another output format: (OutputSpec, text -> calls)
        request["spec"] = output[0]
    try:
        result = await rt.chat(
            **request,
            policy=policy,
            budget=budget,
            max_new_tokens=max_new_tokens,
        )
    except PaskError as exc:
        return CaseResult(
            case.id, case.category, policy, budget, False, False, (), "", "error",
            0, 0, 0, 0, 0.0, f"{type(exc).__name__}: {exc}",
        )  # fmt: skip
    if traces is not None and output is None:
        from pask_agent.eval.trace_recording import case_trace

        traces.append(case_trace(case, request, result, rt.model_id))
    if output is None:
        calls = tuple({"name": c.name, "arguments": c.arguments} for c in result.tool_calls)
        valid = bool(calls) and result.finish_reason == "tool_calls"
    else:
        calls = tuple(output[1](result.text))
        valid = bool(calls) and result.finish_reason != "length"
    error = ""
    correct = False
    if valid:
        check = ast_check_result(case, calls)
        correct = bool(check["valid"])
        if not correct:
            error = f"{check.get('error_type', '')}: {str(check.get('error', ''))[:300]}"
    u = result.usage
    return CaseResult(
        case.id,
        case.category,
        policy,
        budget,
        correct,
        valid,
        calls,
        result.text,
        result.finish_reason,
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


def summarize(results: Sequence[CaseResult], seconds: float = 0.0) -> ConfigSummary:
    """Aggregate one configuration's case results.

    Raises
    ------
    ConfigError
        No results, or results from more than one configuration.
    """
    if not results:
        raise ConfigError("nothing to summarize: no case results")
    configs = {(r.policy, r.budget) for r in results}
    if len(configs) != 1:
        raise ConfigError(f"results mix configurations {sorted(configs)}; summarize each alone")
    by_cat: dict[str, list[bool]] = {}
    for r in results:
        by_cat.setdefault(r.category, []).append(r.correct)
    full = sum(r.full_kv_bytes for r in results)
    per_case = [r.measured_b for r in results if r.full_kv_bytes]
    return ConfigSummary(
        policy=results[0].policy,
        budget=results[0].budget,
        cases=len(results),
        accuracy={c: sum(v) / len(v) for c, v in by_cat.items()},
        overall=sum(r.correct for r in results) / len(results),
        valid_rate=sum(r.valid_call for r in results) / len(results),
        measured_b=sum(r.kv_bytes for r in results) / full if full else 0.0,
        mean_b=sum(per_case) / len(per_case) if per_case else 0.0,
        max_b=max(per_case, default=0.0),
        seconds=seconds,
        **_stage_budgets(results),
    )


def _stage_budgets(results: Sequence[CaseResult]) -> dict[str, float | None]:
    """Realized B_P and B_D over the cases that recorded the prompt's bytes."""
    split = [r for r in results if r.prompt_full_kv_bytes]
    if not split:
        return {"measured_b_prompt": None, "measured_b_answer": None}
    prompt_full = sum(r.prompt_full_kv_bytes for r in split)
    answer_full = sum(r.full_kv_bytes - r.prompt_full_kv_bytes for r in split)
    answer_kept = sum(r.kv_bytes - r.prompt_kv_bytes for r in split)
    return {
        "measured_b_prompt": sum(r.prompt_kv_bytes for r in split) / prompt_full,
        "measured_b_answer": answer_kept / answer_full if answer_full else None,
    }


def markdown_table(summaries: Sequence[ConfigSummary], *, title: str = "") -> str:
    """Accuracy (%) per category and overall, valid-call rate and measured ``B`` per config."""
    cats = [c for c in NON_LIVE_CATEGORIES if any(c in s.accuracy for s in summaries)]
    head = ["policy", "target B", *cats, "overall", "valid calls", "measured B", "mean B", "max B",
            "B_P", "B_D"]  # fmt: skip
    lines = [f"# {title}", ""] if title else []
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        row = [s.policy, f"{s.budget:.2f}"]
        row += [f"{100 * s.accuracy[c]:.1f}" if c in s.accuracy else "–" for c in cats]
        row += [f"{100 * s.overall:.1f}", f"{100 * s.valid_rate:.1f}"]
        row += [f"{s.measured_b:.3f}", f"{s.mean_b:.3f}", f"{s.max_b:.3f}"]
        row += [f"{b:.3f}" if b is not None else "–"
                for b in (s.measured_b_prompt, s.measured_b_answer)]  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def paired_against_full(results: Sequence[CaseResult]) -> list[tuple[str, PairedComparison]]:
    """Each configuration against Full KV on the cases both answered (empty without Full KV)."""
    reference = {r.id: r.correct for r in results if r.policy == "full"}
    if not reference:
        return []
    configs: dict[tuple[str, float], dict[str, bool]] = {}
    for r in results:
        if r.policy != "full":
            configs.setdefault((r.policy, r.budget), {})[r.id] = r.correct
    return [
        (f"{policy} @ {budget:.2f}", compare_paired(correct, reference))
        for (policy, budget), correct in configs.items()
    ]


def write_results(
    out: Path,
    results: Sequence[CaseResult],
    summaries: Sequence[ConfigSummary],
    note: str,
    *,
    title: str = "BFCL non-live: accuracy and measured KV budget",
    rows: Sequence[dict[str, Any]] | None = None,
    extra_json: dict[str, Any] | None = None,
    extra_markdown: str = "",
    run: dict[str, Any] | None = None,
) -> None:
    """Write ``<out>.jsonl``, ``<out>.json``, ``<out>.md`` and the plot ``<out>.png``.

    ``rows`` replaces the JSONL rows (default: the results); ``extra_json`` and
    ``extra_markdown`` add sections another eval reports; ``run`` is the provenance taken when
    the run started (default: now; taken later, the commit could be one others made since)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.with_suffix(".jsonl").open("w", encoding="utf-8") as f:
        for row in rows if rows is not None else [asdict(r) for r in results]:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    paired = paired_against_full(results)
    run = run or provenance()
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "note": note,
                **run,
                "summaries": [asdict(s) for s in summaries],
                **(extra_json or {}),
                "paired_vs_full": {name: asdict(c) for name, c in paired},
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    table = markdown_table(summaries, title=title) + extra_markdown
    if paired:
        table += "\n## Against Full KV on the same cases (paired)\n\n" + paired_table(paired)
    image = plot_accuracy_vs_budget(summaries, out.with_suffix(".png"), title=title)
    out.with_suffix(".md").write_text(
        f"{table}\n![accuracy vs measured B]({image.name})\n\n{note}\n\n"
        f"Command: `{run['command']}` at commit `{run['git_commit']}` on {run['machine']}.\n",
        encoding="utf-8",
    )


def configurations(policies: Sequence[str], budgets: Sequence[float]) -> list[tuple[str, float]]:
    """(policy, budget) pairs, budget by budget in the order given; ``full`` once, at ``B = 1``.

    Raises
    ------
    ConfigError
        A budget outside ``(0, 1]``.
    """
    out: list[tuple[str, float]] = []
    for b in budgets:
        if not 0 < b <= 1:
            raise ConfigError(f"budget {b} must lie in (0, 1] (a share of Full-KV bytes)")
        for p in policies:
            pair = (p, 1.0 if p == "full" else b)
            if pair not in out:
                out.append(pair)
    return out


async def evaluate(
    policies: Sequence[str],
    budgets: Sequence[float],
    *,
    per_category: int | None,
    split: str,
    out: Path,
    model: str = "default",
    max_new_tokens: int = 200,
    log: Any = print,
    categories: Sequence[str] = NON_LIVE_CATEGORIES,
    traces_out: Path | None = None,
) -> list[ConfigSummary]:
    """Run every configuration and rewrite the result files after each one.

    ``traces_out`` writes the Full-KV run's cases as calibration traces (in case order)."""
    from pask_agent.policy.registry import get_policy
    from pask_agent.runtime.config import RuntimeConfig
    from pask_agent.runtime.runtime import Runtime

    for p in policies:
        get_policy(p)  # unknown names and budgets fail before the model loads
    plan = configurations(policies, budgets)
    cases = load_split(split, per_category, categories)
    note = (
        f"{len(cases)} BFCL v4 non-live cases ({per_category or 'all'} per category, split "
        f"{split!r} of calibration_data/splits/bfcl.json), "
        f"model {model!r}, greedy, max_new_tokens={max_new_tokens}, official AST checker. "
        "measured B = Σ live KV bytes / Σ Full-KV bytes at the end of each request (prompt + "
        "generated, INT4 scales included); mean B and max B are per case; B_P and B_D are the "
        "same ratio over prompt tokens and over generated tokens (realized stage budgets)."
    )
    config = RuntimeConfig(max_batch=max(16, len(cases)))
    results: list[CaseResult] = []
    summaries: list[ConfigSummary] = []
    async with Runtime.open(model, config=config) as rt:
        for policy, budget in plan:
            start = time.perf_counter()
            traces: list[Any] | None = [] if traces_out and policy == "full" else None
            batch = await run_config(
                rt, cases, policy, budget, max_new_tokens=max_new_tokens, traces=traces
            )
            if traces is not None and traces_out is not None:
                from pask_agent.record.traces import write_traces

                order = {c.id: i for i, c in enumerate(cases)}
                write_traces(traces_out, sorted(traces, key=lambda t: order[t.id]))
            summary = summarize(batch, time.perf_counter() - start)
            results += batch
            summaries.append(summary)
            write_results(out, results, summaries, note)
            log(
                f"{policy} B={budget:.2f}: acc {summary.overall:.3f} valid {summary.valid_rate:.3f}"
                f" measured B {summary.measured_b:.3f} (mean {summary.mean_b:.3f}, max "
                f"{summary.max_b:.3f}) in {summary.seconds:.0f}s"
            )
    return summaries


def merge_results(parts: Sequence[Path], out: Path) -> list[ConfigSummary]:
    """Join the case results of runs made in separate processes (``<part>.jsonl``) into one
    set of result files, with summaries and paired comparisons over all of them.

    Raises
    ------
    ConfigError
        A part is missing, or two parts hold the same (policy, budget, case).
    """
    results: list[CaseResult] = []
    notes: list[str] = []
    seen: set[tuple[str, float, str]] = set()
    for part in parts:
        lines = part.with_suffix(".jsonl")
        if not lines.is_file():
            raise ConfigError(f"no results at {lines}")
        for line in lines.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            row["calls"] = tuple(row["calls"])
            r = CaseResult(**row)
            key = (r.policy, r.budget, r.id)
            if key in seen:
                raise ConfigError(f"{part}: {key} appears in two parts")
            seen.add(key)
            results.append(r)
        meta = part.with_suffix(".json")
        if meta.is_file():
            info = json.loads(meta.read_text(encoding="utf-8"))
            notes.append(f"{part.name}: {info.get('command', '')} at {info.get('git_commit', '')}")
    order: list[tuple[str, float]] = []
    for r in results:
        if (r.policy, r.budget) not in order:
            order.append((r.policy, r.budget))
    order.sort(key=lambda c: c[0] != "full")
    summaries = [summarize([r for r in results if (r.policy, r.budget) == c]) for c in order]
    write_results(out, results, summaries, "Merged from: " + "; ".join(notes))
    return summaries


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policies", default="full,pask", help="comma-separated policy names")
    p.add_argument("--budgets", default="0.33", help="comma-separated target total budgets B")
    p.add_argument(
        "--cases-per-category", type=int, default=None, help="first n per category (default all)"
    )
    p.add_argument("--split", default="dev", choices=PARTITIONS)
    p.add_argument("--out", default="results/bfcl_dev", help="output path without extension")
    p.add_argument("--model", default="default")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument(
        "--traces-out", type=Path, default=None, help="write the Full-KV run as traces (JSONL)"
    )
    p.add_argument(
        "--merge", type=Path, nargs="+", default=None,
        help="join earlier runs' results (paths without extension) into --out; runs nothing",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    if getattr(args, "merge", None):
        merge_results(args.merge, Path(args.out))
        return 0
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    try:
        budgets = [float(b) for b in args.budgets.split(",") if b.strip()]
    except ValueError as exc:
        raise ConfigError(f"--budgets must be comma-separated numbers: {exc}") from exc
    if not policies or not budgets:
        raise ConfigError("name at least one policy and one budget")
    anyio.run(
        lambda: evaluate(
            policies,
            budgets,
            per_category=args.cases_per_category,
            split=args.split,
            out=Path(args.out),
            model=args.model,
            max_new_tokens=args.max_new_tokens,
            traces_out=getattr(args, "traces_out", None),
        )
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pask_agent.eval.bfcl_eval")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
