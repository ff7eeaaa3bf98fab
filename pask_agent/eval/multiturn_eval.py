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

The report (``eval/harness.py`` writes it, and resumes, shards and merges runs) pairs each
PASK variant against Full KV and against the other (bootstrap interval, exact McNemar), gives
measured B (prompt and answer) and counts the generated tokens per tag bucket: the census of
what a mixed turn actually generates.

``python -m pask_agent.eval.multiturn_eval --split dev --conversations 40 --out
results/multiturn_dev``
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import Any, ClassVar

from pask_agent.errors import ConfigError
from pask_agent.eval.bfcl import BfclCase, ast_check_result, ground_truth_calls
from pask_agent.eval.harness import Config, Measured, Row, Run, Scored, Workload, configurations
from pask_agent.eval.harness_args import Defaults, main_of, run_eval
from pask_agent.eval.harness_args import add_arguments as add_shared
from pask_agent.eval.harness_report import summarize_rows
from pask_agent.eval.splits import cases_in
from pask_agent.grammars.span_labels import label_prompt_spans
from pask_agent.grammars.tool_spec import ToolSpec, tool_specs

CATEGORIES = ("simple_python", "multiple")
CONFIGS = ("full", "pask", "pask_plain")
DEFAULTS = Defaults(
    out="results/multiturn_dev", policies=",".join(CONFIGS), max_new_tokens=160,
    reference="full,pask_plain", policy_flags=("--configs",),
)  # fmt: skip


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
class MultiturnWorkload(Workload):
    """Conversations' open turns; ``pask`` is the PASK policy (a name or a ``Policy``) that the
    two PASK configurations run. Configurations are ``CONFIGS``, not registered policies."""

    split: str = "dev"
    count: int = 40
    turns: int = 3
    max_new_tokens: int = 160
    pask: Any = "pask"

    name: ClassVar[str] = "multiturn"
    title: ClassVar[str] = (
        "Agent conversations from BFCL cases: history labelled by structure or not"
    )
    failed_detail: ClassVar[dict[str, Any]] = {
        "calls": [], "text": "", "mixed": False, "finish_reason": "error",
    }  # fmt: skip

    def cases(self) -> Sequence[Conversation]:
        return conversations(self.split, self.count, self.turns)

    def check(self, configs: Sequence[Config]) -> None:
        unknown = {c.policy_name for c in configs} - set(CONFIGS)
        if unknown:
            raise ConfigError(f"unknown configurations {sorted(unknown)}; choose from {CONFIGS}")

    async def run(self, rt: Any, conv: Conversation, config: Config) -> Any:
        tools = conv.tools()
        name = config.policy_name
        options: dict[str, Any] = {"policy": "full" if name == "full" else self.pask}
        if name != "full":
            options["budget"] = config.budget
        if name == "pask_plain":  # history as plain content: only the tool list is labelled
            options["label_spans"] = lambda text: label_prompt_spans(text, tools)
        return await rt.chat(
            conv.messages(), tools=tools, tool_choice="auto", parallel_tool_calls=False,
            max_new_tokens=self.max_new_tokens, **options,
        )  # fmt: skip

    def score(self, conv: Conversation, result: Any) -> Scored:
        calls = [{"name": c.name, "arguments": c.arguments} for c in result.tool_calls]
        correct, error = False, ""
        if calls:
            check = ast_check_result(conv.last, calls)
            correct = bool(check["valid"])
            if not correct:
                error = f"{check.get('error_type', '')}: {str(check.get('error', ''))[:200]}"
        detail = {
            "calls": calls, "text": result.text, "mixed": bool(calls and result.content),
            "finish_reason": result.finish_reason,
        }  # fmt: skip
        return Scored(correct, bool(calls), error, Measured.of([result.usage]), detail)

    def note(self, cases: int) -> str:
        return (
            f"{cases} conversations of {self.turns} BFCL cases ({', '.join(CATEGORIES)}, split "
            f"{self.split!r} of calibration_data/splits/bfcl.json); the last request is "
            "answered under tool_choice='auto' with every tool of the conversation, greedy, "
            f"max_new_tokens={self.max_new_tokens}; measured B over prompt + answer at the end "
            "of the turn; official BFCL AST checker on the last case; 'valid' = the turn "
            "called a tool."
        )

    def report(self, rows: Sequence[Row]) -> tuple[dict[str, Any], str]:
        turns = {
            s.label: {
                "mixed_turns": sum(r.detail.get("mixed", False) for r in mine),
                "prose_only": sum(not r.detail.get("calls") for r in mine),
                "mean_prompt_tokens": sum(r.measured.prompt_tokens for r in mine) / len(mine),
            }
            for s in summarize_rows(rows)
            if (mine := [r for r in rows if (r.config, r.budget) == (s.config, s.budget)])
        }
        tags = census(rows)
        md = [
            "## Turns: calls after prose (mixed), prose only, prompt length",
            "",
            "| configuration | mixed turns | prose only | prompt tokens |",
            "|---|---|---|---|",
        ]
        md += [f"| {n} | {t['mixed_turns']} | {t['prose_only']} | {t['mean_prompt_tokens']:.0f} |"
               for n, t in turns.items()]  # fmt: skip
        md += ["", "## Generated tokens per tag bucket (census of the answers)", ""]
        md += ["| bucket | " + " | ".join(tags) + " |", "|---" * (len(tags) + 1) + "|"]
        keys = sorted({k for v in tags.values() for k in v}, key=lambda k: -sum(
            v.get(k, 0) for v in tags.values()
        ))  # fmt: skip
        for k in keys:
            md.append(f"| {k} | " + " | ".join(str(v.get(k, 0)) for v in tags.values()) + " |")
        return {"turns": turns, "tag_census": tags}, "\n".join(md) + "\n"


def census(rows: Sequence[Row]) -> dict[str, dict[str, int]]:
    """Generated tokens per tag bucket and configuration."""
    counts: dict[str, Counter[str]] = {}
    for r in rows:
        counts.setdefault(r.label, Counter()).update(r.measured.tag_counts)
    return {c: dict(sorted(v.items(), key=lambda kv: -kv[1])) for c, v in counts.items()}


async def evaluate(
    *,
    split: str,
    count: int,
    turns: int,
    budget: float,
    configs: Sequence[str],
    out: Path,
    model: Any = "default",
    max_new_tokens: int = 160,
    log: Any = print,
    pask: Any = "pask",
) -> list[Any]:
    """Every configuration's open turns (the harness's ``evaluate``), paired against Full KV
    and against ``pask_plain``; returns the summaries."""
    from pask_agent.eval import harness

    workload = MultiturnWorkload(split, count, turns, max_new_tokens, pask)
    run = Run(out, references=("full", "pask_plain"))
    plan = configurations(list(configs), [budget])
    return await harness.evaluate(workload, plan, run, model=model, log=log)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_shared(p, DEFAULTS)
    p.add_argument("--conversations", type=int, default=40)
    p.add_argument("--turns", type=int, default=3)


def run(args: argparse.Namespace) -> int:
    workload = MultiturnWorkload(args.split, args.conversations, args.turns, args.max_new_tokens)
    return run_eval(args, workload, module=__spec__.name)


def main(argv: list[str] | None = None) -> int:
    return main_of(add_arguments, run, "python -m pask_agent.eval.multiturn_eval", __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
