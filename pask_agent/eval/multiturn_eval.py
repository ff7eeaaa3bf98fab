"""Agent conversations built from BFCL cases: does labelling the history by structure help?

An agent's prompt is mostly history: earlier requests, the calls the assistant made, tool
results and prose. This eval chains ``--turns`` BFCL single-call cases (simple and multiple,
from one partition of the fixed split) into one conversation. Every case but the last is a
finished exchange: the user's request, the assistant's "I will call X." with the reference call,
the tool's result, and a one-line prose answer. The last case's request is open, and the model
answers it with every tool of the conversation offered under ``tool_choice="auto"``, so it may
write prose, prose then a call (a mixed turn), or a call. BFCL's own checker scores the calls
against the last case's reference.

Configurations, all on the same conversations:

* ``full``: Full KV;
* ``pask``: PASK at ``--budget`` with the prompt labelled as the runtime does by default, the
  earlier calls by structure (``grammars/json/history_spans.py``);
* ``pask_plain``: the same, but with every history token labelled as plain content (what the
  prompt labeller did before mixed turns were tagged).

The report pairs each PASK variant against Full KV and against the other (bootstrap interval,
exact McNemar), gives measured B (prompt and answer) and counts the generated tokens per tag
bucket: the census of what a mixed turn actually generates.

``python -m pask_agent.eval.multiturn_eval --split dev --conversations 40 --out
results/multiturn_dev``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Any

import anyio

from pask_agent.errors import ConfigError, PaskError
from pask_agent.eval.bfcl import BfclCase, ast_check_result, ground_truth_calls
from pask_agent.eval.paired import compare_paired, paired_table
from pask_agent.eval.splits import cases_in
from pask_agent.grammars.span_labels import label_prompt_spans
from pask_agent.grammars.tool_spec import ToolSpec, tool_specs
from pask_agent.record.provenance import provenance

CATEGORIES = ("simple_python", "multiple")
CONFIGS = ("full", "pask", "pask_plain")


@dataclass(frozen=True)
class Conversation:
    """``history`` cases are finished exchanges; ``last`` is the open request."""

    history: tuple[BfclCase, ...]
    last: BfclCase

    @property
    def id(self) -> str:
        return "+".join(c.id for c in (*self.history, self.last))

    def tools(self) -> tuple[ToolSpec, ...]:
        seen: dict[str, ToolSpec] = {}
        for case in (*self.history, self.last):
            for spec in tool_specs(case.functions):
                seen.setdefault(spec.name, spec)
        return tuple(seen.values())

    def messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for k, case in enumerate(self.history):
            call = ground_truth_calls(case)[0]
            call_id = f"call_{k}"
            out += [
                *(dict(m) for m in case.messages),
                {
                    "role": "assistant",
                    "content": f"I will call {call['name']}.",
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": call["name"], "arguments": call["arguments"]},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": call_id, "content": '{"status": "ok"}'},
                {"role": "assistant", "content": f"Done: {call['name']} succeeded."},
            ]
        return out + [dict(m) for m in self.last.messages]


def conversations(split: str, count: int, turns: int) -> list[Conversation]:
    """``count`` conversations of ``turns`` cases each, taken in order from the split's simple
    and multiple cases, interleaved so that most conversations mix the two categories.

    Raises
    ------
    ConfigError
        Fewer than ``turns`` >= 2, or not enough single-call cases.
    """
    if turns < 2 or count < 1:
        raise ConfigError(f"need turns >= 2 and conversations >= 1, got {turns} and {count}")
    by_cat = [list(cases_in(split, per_category=None, categories=(c,))) for c in CATEGORIES]
    mixed = [c for pair in zip_longest(*by_cat) for c in pair if c is not None]
    pool = [c for c in mixed if len(c.ground_truth) == 1]
    if len(pool) < count * turns:
        raise ConfigError(
            f"{count} conversations of {turns} turns need {count * turns} cases; the {split!r} "
            f"split has {len(pool)} single-call simple/multiple cases"
        )
    return [
        Conversation(tuple(pool[i * turns : (i + 1) * turns - 1]), pool[(i + 1) * turns - 1])
        for i in range(count)
    ]


@dataclass(frozen=True)
class TurnResult:
    id: str
    config: str
    correct: bool
    calls: tuple[dict[str, Any], ...]
    text: str
    mixed: bool  # prose before the calls
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    measured_b: float
    measured_b_prompt: float | None
    measured_b_answer: float | None
    tag_counts: dict[str, int] = field(default_factory=dict)
    error: str = ""


async def run_config(
    rt: Any,
    convs: Sequence[Conversation],
    config: str,
    budget: float,
    max_new_tokens: int,
    pask: Any = "pask",
) -> list[TurnResult]:
    """Every conversation's open turn under one configuration, submitted together; ``pask``
    is the PASK policy (a name or a ``Policy``) the two PASK configurations run."""
    out: list[TurnResult | None] = [None] * len(convs)

    async def one(i: int, conv: Conversation) -> None:
        out[i] = await _turn(rt, conv, config, budget, max_new_tokens, pask)

    async with anyio.create_task_group() as tg:
        for i, conv in enumerate(convs):
            tg.start_soon(one, i, conv)
    return [r for r in out if r is not None]


async def _turn(
    rt: Any, conv: Conversation, config: str, budget: float, max_new_tokens: int, pask: Any
) -> TurnResult:
    tools = conv.tools()
    options: dict[str, Any] = {"policy": "full" if config == "full" else pask}
    if config != "full":
        options["budget"] = budget
    if config == "pask_plain":  # history as plain content: only the tool list is labelled
        options["label_spans"] = lambda text: label_prompt_spans(text, tools)
    try:
        result = await rt.chat(
            conv.messages(), tools=tools, tool_choice="auto", parallel_tool_calls=False,
            max_new_tokens=max_new_tokens, **options,
        )  # fmt: skip
    except PaskError as exc:
        return TurnResult(
            conv.id, config, False, (), "", False, "error", 0, 0, 0.0, None, None,
            error=f"{type(exc).__name__}: {exc}",
        )  # fmt: skip
    calls = tuple({"name": c.name, "arguments": c.arguments} for c in result.tool_calls)
    correct, error = False, ""
    if calls:
        check = ast_check_result(conv.last, calls)
        correct = bool(check["valid"])
        if not correct:
            error = f"{check.get('error_type', '')}: {str(check.get('error', ''))[:200]}"
    u = result.usage
    return TurnResult(
        conv.id, config, correct, calls, result.text, bool(calls and result.content),
        result.finish_reason, u.prompt_tokens, u.completion_tokens, u.measured_b,
        u.measured_b_prompt, u.measured_b_answer, dict(u.tag_counts), error,
    )  # fmt: skip


def summarize(results: Sequence[TurnResult]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for config in CONFIGS:
        rows = [r for r in results if r.config == config]
        if not rows:
            continue
        out[config] = {
            "n": len(rows),
            "accuracy": sum(r.correct for r in rows) / len(rows),
            "called": sum(bool(r.calls) for r in rows) / len(rows),
            "mixed_turns": sum(r.mixed for r in rows),
            "prose_only": sum(not r.calls for r in rows),
            "mean_b": sum(r.measured_b for r in rows) / len(rows),
            "max_b": max(r.measured_b for r in rows),
            "mean_b_prompt": _mean([r.measured_b_prompt for r in rows]),
            "mean_b_answer": _mean([r.measured_b_answer for r in rows]),
            "mean_prompt_tokens": sum(r.prompt_tokens for r in rows) / len(rows),
        }
    return out


def census(results: Sequence[TurnResult]) -> dict[str, dict[str, int]]:
    """Generated tokens per tag bucket and configuration."""
    counts: dict[str, Counter[str]] = {}
    for r in results:
        counts.setdefault(r.config, Counter()).update(r.tag_counts)
    return {c: dict(sorted(v.items(), key=lambda kv: -kv[1])) for c, v in counts.items()}


def paired(results: Sequence[TurnResult]) -> list[tuple[str, Any]]:
    by = {c: {r.id: r.correct for r in results if r.config == c} for c in CONFIGS}
    rows = []
    for a, b in (("pask", "full"), ("pask_plain", "full"), ("pask", "pask_plain")):
        if by[a] and by[b]:
            rows.append((f"{a} vs {b}", compare_paired(by[a], by[b])))
    return rows


def write(
    out: Path, results: Sequence[TurnResult], note: str, run: dict[str, Any] | None = None
) -> None:
    """Write ``<out>.jsonl``, ``.json`` and ``.md``; ``run`` is the provenance taken when the
    run started (taken later, the commit could be one others made while it ran)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.with_suffix(".jsonl").open("w", encoding="utf-8") as f:
        for r in results:
            f.write(json.dumps(asdict(r), ensure_ascii=False) + "\n")
    run = run or provenance()
    summary, tags, pairs = summarize(results), census(results), paired(results)
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "note": note,
                **run,
                "summaries": summary,
                "paired": {name: asdict(c) for name, c in pairs},
                "tag_census": tags,
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    lines = [
        "# Agent conversations from BFCL cases: history labelled by structure or not\n",
        "| configuration | n | accuracy % | called % | mixed turns | prose only | mean B | max B "
        "| B_P | B_D | prompt tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in summary.items():
        lines.append(
            f"| {name} | {s['n']} | {100 * s['accuracy']:.1f} | {100 * s['called']:.1f} | "
            f"{s['mixed_turns']} | {s['prose_only']} | {s['mean_b']:.3f} | {s['max_b']:.3f} | "
            f"{_fmt(s['mean_b_prompt'])} | {_fmt(s['mean_b_answer'])} | "
            f"{s['mean_prompt_tokens']:.0f} |"
        )
    if pairs:
        lines += ["", "## Paired (same conversations)", "", paired_table(pairs, reference="b")]
    lines += ["## Generated tokens per tag bucket (census of the answers)", ""]
    lines += ["| bucket | " + " | ".join(tags) + " |", "|---" * (len(tags) + 1) + "|"]
    keys = sorted({k for v in tags.values() for k in v}, key=lambda k: -sum(
        v.get(k, 0) for v in tags.values()
    ))  # fmt: skip
    for k in keys:
        lines.append(f"| {k} | " + " | ".join(str(v.get(k, 0)) for v in tags.values()) + " |")
    lines += [
        "",
        note,
        "",
        f"Command: `{run['command']}` at commit `{run['git_commit']}` on {run['machine']}.",
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


async def evaluate(
    *,
    split: str,
    count: int,
    turns: int,
    budget: float,
    configs: Sequence[str],
    out: Path,
    model: str = "default",
    max_new_tokens: int = 160,
    log: Any = print,
    pask: Any = "pask",
) -> dict[str, dict[str, Any]]:
    from pask_agent.runtime.config import RuntimeConfig
    from pask_agent.runtime.runtime import Runtime

    unknown = set(configs) - set(CONFIGS)
    if unknown:
        raise ConfigError(f"unknown configurations {sorted(unknown)}; choose from {CONFIGS}")
    if not 0 < budget <= 1:
        raise ConfigError(f"budget {budget} must lie in (0, 1]")
    convs = conversations(split, count, turns)
    note = (
        f"{len(convs)} conversations of {turns} BFCL cases ({', '.join(CATEGORIES)}, split "
        f"{split!r} of calibration_data/splits/bfcl.json); the last request is answered under "
        f"tool_choice='auto' with every tool of the conversation, model {model!r}, greedy, "
        f"max_new_tokens={max_new_tokens}, PASK at B = {budget}; measured B over prompt + "
        "answer at the end of the turn; official BFCL AST checker on the last case."
    )
    results: list[TurnResult] = []
    run = provenance()
    async with Runtime.open(model, config=RuntimeConfig(max_batch=16)) as rt:
        for config in configs:
            start = time.perf_counter()
            batch = await run_config(rt, convs, config, budget, max_new_tokens, pask)
            results += batch
            write(out, results, note, run)
            s = summarize(batch)[config]
            log(
                f"{config}: acc {s['accuracy']:.3f} mean B {s['mean_b']:.3f} max B "
                f"{s['max_b']:.3f} mixed {s['mixed_turns']} in {time.perf_counter() - start:.0f}s"
            )
    return summarize(results)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--split", default="dev", choices=("calibration", "dev", "test"))
    p.add_argument("--conversations", type=int, default=40)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--budget", type=float, default=0.33)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--model", default="default")
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--out", type=Path, default=Path("results/multiturn_dev"))
    args = p.parse_args(argv)
    asyncio.run(
        evaluate(
            split=args.split, count=args.conversations, turns=args.turns, budget=args.budget,
            configs=[c for c in args.configs.split(",") if c], out=args.out, model=args.model,
            max_new_tokens=args.max_new_tokens,
        )
    )  # fmt: skip
    print(f"wrote {args.out}.jsonl, .json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
