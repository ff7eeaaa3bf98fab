"""Agent conversations that must read their history (issue 31 item 1).

Each case is one conversation of the sandbox (``eval/agent_sandbox/``): 15-20 user turns over
travel, shared-file and shop tools, whose later requests name earlier results in words ("of
the flights you found, book DL 225", "email the owner of budget_v2.xlsx", "cancel the order you
placed first"), so the right call needs ids and addresses that only the history holds; by the
last turn the history is 6,000-8,000 tokens of the default model's tokenizer. The turns run in
order through one ``rt.conversation``, so each turn reuses the KV the earlier turns left (prefix
reuse), as an agent's would. The history a turn sees is the gold
trajectory (the gold calls and the results the tools gave them), not the model's own earlier
answers: teacher forcing, so every turn is scored on its own and per-turn accuracy measures how
well the model reads its (compressed) history.

A turn is right when its calls equal the gold calls after normalisation and leave the sandbox
in the gold state (``agent_sandbox/scoring.py``); a conversation is right when all its turns
are. One row per conversation and configuration: ``correct`` is the conversation's verdict, and
``turns`` lists every turn's verdict, calls, gold calls, error and prompt/reuse counts; the JSON
and Markdown add per-turn accuracy overall, by request kind and by how far back the needed
result lies. Conversations come from the committed files ``calibration_data/splits/agent/``
(``python -m pask_agent.eval.agent_sandbox.split_files`` writes them).

``python -m pask_agent.eval.agent_eval --split dev --conversations 4 --policies full,pask
--budgets 0.33 --out results/agent_dev``
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from pask_agent.errors import ConfigError, PaskError
from pask_agent.eval.agent_sandbox.conversations import AgentConversation
from pask_agent.eval.agent_sandbox.scoring import score_turn
from pask_agent.eval.agent_sandbox.split_files import load_split
from pask_agent.eval.agent_sandbox.tools import Call, openai_tools
from pask_agent.eval.harness import Config, Measured, Row, Scored, Workload
from pask_agent.eval.harness_args import Defaults, main_of, run_eval
from pask_agent.eval.harness_args import add_arguments as add_shared
from pask_agent.eval.harness_report import summarize_rows

DEFAULTS = Defaults(
    out="results/agent_dev", policies="full,pask", max_new_tokens=96, splits=("dev", "test"),
    concurrency=4,
)  # fmt: skip
DISTANCES = ((0, "opens a thread"), (1, "previous turn"), (4, "2-4 turns back"),
             (99, "5+ turns back"))  # fmt: skip


@dataclass(frozen=True)
class Answer:
    """What ``run`` hands the scorer: each turn's result, or the error its request raised."""

    conversation: AgentConversation
    results: tuple[Any, ...]


@dataclass(frozen=True)
class AgentWorkload(Workload):
    """The sandbox's conversations, the first ``count`` of the split (all when ``None``), each
    cut to its first ``turns`` turns (all when ``None``). ``data`` is a folder of split files
    in place of the shipped one; ``given`` replaces the split altogether (tests)."""

    split: str = "dev"
    count: int | None = None
    turns: int | None = None
    max_new_tokens: int = 96
    tool_choice: str = "required"
    data: str | None = None
    given: tuple[AgentConversation, ...] | None = None

    name: ClassVar[str] = "agent"
    title: ClassVar[str] = (
        "Agent conversations that must read their history: conversations right (all turns)"
    )
    failed_detail: ClassVar[dict[str, Any]] = {
        "turns_asked": 0, "turns_right": 0, "turn_accuracy": 0.0, "turns": [],
    }  # fmt: skip

    def cases(self) -> Sequence[AgentConversation]:
        if self.count is not None and self.count < 1 or self.turns is not None and self.turns < 1:
            raise ConfigError(f"need conversations >= 1 and turns >= 1, got {self.count}, "
                              f"{self.turns}")  # fmt: skip
        convs = self.given
        if convs is None:
            convs = load_split(self.split, Path(self.data) if self.data else None)
        convs = convs[: self.count] if self.count is not None else convs
        if self.turns is None:
            return tuple(convs)
        return tuple(replace(c, turns=c.turns[: self.turns]) for c in convs)

    def settings(self) -> dict[str, Any]:
        out = super().settings()
        if self.given is not None:
            out["given"] = [c.id for c in self.given]
        return out

    async def run(self, rt: Any, conv: AgentConversation, config: Config) -> Answer:
        """Every turn in order through one runtime conversation (the KV of turn ``k``'s prompt
        is reused by turn ``k + 1``), ended afterwards so its KV is freed."""
        label = f"{conv.id}|{config.policy_name}@{config.budget}"
        handle = rt.conversation(label)
        tools = openai_tools(conv.tool_names())
        results: list[Any] = []
        try:
            for k in range(len(conv.turns)):
                try:
                    results.append(await rt.chat(
                        conv.messages(k), tools=tools, tool_choice=self.tool_choice,
                        parallel_tool_calls=False, policy=config.policy, budget=config.budget,
                        max_new_tokens=self.max_new_tokens, conversation=handle,
                    ))  # fmt: skip
                except PaskError as exc:  # this turn is wrong; the next still runs
                    results.append(f"{type(exc).__name__}: {str(exc)[:200]}")
        finally:
            rt.end_conversation(label)
        return Answer(conv, tuple(results))

    def score(self, conv: AgentConversation, answer: Answer) -> Scored:
        turns: list[dict[str, Any]] = []
        usages = []
        for k, (turn, result) in enumerate(zip(conv.turns, answer.results, strict=True)):
            row: dict[str, Any] = {"turn": k, "kind": turn.kind, "distance": distance(k, turn)}
            if isinstance(result, str):
                predicted: list[Call] = []
                row |= {"text": "", "prompt_tokens": 0, "prefilled_tokens": 0}
            else:
                usages.append(result.usage)
                predicted = [Call(c.name, c.arguments) for c in result.tool_calls]
                row |= {
                    "text": result.text, "prompt_tokens": result.usage.prompt_tokens,
                    "prefilled_tokens": result.usage.prefilled_tokens,
                    "measured_b": round(result.usage.measured_b, 4),
                }  # fmt: skip
            verdict = score_turn(conv.world_before(k), predicted, turn.gold)
            row |= {
                "correct": verdict.correct, "calls_match": verdict.calls_match,
                "state_match": verdict.state_match,
                "error": result if isinstance(result, str) else verdict.error,
                "calls": [c.to_json() for c in predicted], "gold": [c.to_json() for c in turn.gold],
            }  # fmt: skip
            turns.append(row)
        right = sum(t["correct"] for t in turns)
        wrong = next((t for t in turns if not t["correct"]), None)
        error = f"turn {wrong['turn']} ({wrong['kind']}): {wrong['error']}" if wrong else ""
        detail = {
            "turns_asked": len(turns), "turns_right": right,
            "turn_accuracy": right / len(turns) if turns else 0.0, "turns": turns,
        }  # fmt: skip
        valid = all(t["calls"] for t in turns)
        return Scored(right == len(turns), valid, error, Measured.of(usages), detail)

    def note(self, cases: int) -> str:
        return (
            f"{cases} conversations of split {self.split!r} (calibration_data/splits/agent/), "
            f"{self.turns or 'all'} turns each, asked in order through one runtime conversation "
            "(prefix reuse) with the gold trajectory as history (teacher forcing); "
            f"tool_choice={self.tool_choice!r}, greedy, max_new_tokens={self.max_new_tokens}. "
            "A turn is right when its calls equal the gold calls after normalisation and leave "
            "the sandbox in the gold state; acc = conversations with every turn right; per-turn "
            "accuracy below. measured B: the worst turn's live KV bytes / Full-KV bytes."
        )

    def report(self, rows: Sequence[Row]) -> tuple[dict[str, Any], str]:
        out: dict[str, Any] = {}
        for s in summarize_rows(rows):
            mine = [r for r in rows if (r.config, r.budget) == (s.config, s.budget)]
            turns = [t for r in mine for t in r.detail.get("turns", [])]
            out[s.label] = {
                "turns": len(turns),
                "turn_accuracy": _rate(turns),
                "conversation_accuracy": s.overall,
                "by_kind": {k: _rate([t for t in turns if t["kind"] == k])
                            for k in sorted({t["kind"] for t in turns})},
                "by_distance": {name: _rate([t for t in turns if _bucket(t["distance"]) == name])
                                for _, name in DISTANCES},
                "last_prompt_tokens": max((t["prompt_tokens"] for t in turns), default=0),
                "reused_share": _reused(turns),
            }  # fmt: skip
        md = ["## Per-turn accuracy", "",
              "| configuration | turns | turn acc | conversations right | reused prompt share |"
              " longest prompt |", "|---|---|---|---|---|---|"]  # fmt: skip
        md += [f"| {n} | {v['turns']} | {_fmt(v['turn_accuracy'])} | "
               f"{_fmt(v['conversation_accuracy'])} | {v['reused_share']:.3f} | "
               f"{v['last_prompt_tokens']} |" for n, v in out.items()]  # fmt: skip
        for key, title in (("by_kind", "request kind"), ("by_distance", "needed result")):
            cols = sorted({k for v in out.values() for k in v[key]}, key=str)
            if key == "by_distance":
                cols = [name for _, name in DISTANCES]
            md += [
                "",
                f"## Per-turn accuracy by {title}",
                "",
                "| configuration | " + " | ".join(cols) + " |",
                "|---" * (len(cols) + 1) + "|",
            ]
            md += [f"| {n} | " + " | ".join(_fmt(v[key].get(c)) for c in cols) + " |"
                   for n, v in out.items()]  # fmt: skip
        return {"per_turn": out}, "\n".join(md) + "\n"


def distance(k: int, turn: Any) -> int:
    """How many turns back the farthest result a turn needs lies (0: it needs none)."""
    return k - min(turn.depends_on) if turn.depends_on else 0


def _bucket(d: int) -> str:
    return next(name for top, name in DISTANCES if d <= top)


def _rate(turns: Sequence[dict[str, Any]]) -> float | None:
    return sum(t["correct"] for t in turns) / len(turns) if turns else None


def _reused(turns: Sequence[dict[str, Any]]) -> float:
    prompt = sum(t["prompt_tokens"] for t in turns)
    return 1 - sum(t["prefilled_tokens"] for t in turns) / prompt if prompt else 0.0


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_shared(p, DEFAULTS)
    p.add_argument("--conversations", type=int, default=None, help="first n (default all)")
    p.add_argument("--turns", type=int, default=None, help="first n turns of each (default all)")
    p.add_argument("--tool-choice", default="required", choices=("required", "auto"))
    p.add_argument(
        "--data",
        default=None,
        help="folder of dev.jsonl/test.jsonl (default calibration_data/splits/agent)",
    )


def run(args: argparse.Namespace) -> int:
    workload = AgentWorkload(
        args.split, args.conversations, args.turns, args.max_new_tokens, args.tool_choice,
        args.data,
    )  # fmt: skip
    return run_eval(args, workload, module=__spec__.name)


def main(argv: list[str] | None = None) -> int:
    return main_of(add_arguments, run, "python -m pask_agent.eval.agent_eval", __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
