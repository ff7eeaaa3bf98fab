"""Execution accuracy of ``SQLiteAssistant`` over the sample question set (or BIRD dev).

    python -m pask_agent.eval.sql_eval --split test            # the project's sample set
    python -m pask_agent.eval.sql_eval --bird PATH --limit 50  # a user-supplied BIRD dev
    python -m pask_agent.eval.sql_eval --split test --repairs 1  # refused queries go back once

A question counts as correct when the predicted SQL's rows equal the gold SQL's rows as sets
(BIRD's rule: order and duplicates ignored). Writes ``results/sql_accuracy.json`` (summary and
one record per question) and ``results/sql_accuracy.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio

from pask_agent.eval.sql_data import SqlQuestionSet, load_bird_dev, load_sample_questions
from pask_agent.integrations.sql import SQLiteAssistant
from pask_agent.integrations.sql_db import SqlExecutionError
from pask_agent.runtime.runtime import Runtime

_ALL_ROWS = 1_000_000  # scoring compares whole results, not the assistant's row cap


@dataclass(frozen=True, slots=True)
class SqlRecord:
    id: str
    db: str
    difficulty: str
    question: str
    gold_sql: str
    predicted_sql: str
    correct: bool
    error: str | None
    completion_tokens: int
    measured_b: float
    seconds: float
    repairs: int = 0  # refused queries sent back to the model before the final one


async def evaluate(
    questions: SqlQuestionSet,
    *,
    model: str = "default",
    policy: str | None = None,
    budget: float | None = None,
    repairs: int = 0,
) -> list[SqlRecord]:
    """Ask every question (one assistant per database) and score it against the gold rows."""
    records = []
    async with Runtime.open(model) as rt:
        assistants = {
            db: SQLiteAssistant(path, runtime=rt, repairs=repairs)
            for db, path in questions.databases
        }
        for q in questions.questions:
            assistant = assistants[q.db]
            start = time.perf_counter()
            answer = await assistant.ask(q.question, policy=policy, budget=budget)
            correct = False
            if answer.error is None:
                try:
                    predicted = assistant.db.query(answer.sql, row_limit=_ALL_ROWS)
                    gold = assistant.db.query(q.gold_sql, row_limit=_ALL_ROWS)
                    correct = set(predicted.rows) == set(gold.rows)
                except SqlExecutionError:
                    correct = False  # the time limit or a gold query outside SQLite's reach
            records.append(
                SqlRecord(
                    q.id,
                    q.db,
                    q.difficulty,
                    q.question,
                    q.gold_sql,
                    answer.sql,
                    correct,
                    answer.error,
                    answer.usage.completion_tokens,
                    round(answer.usage.measured_b, 4),
                    round(time.perf_counter() - start, 2),
                    len(answer.failed),
                )
            )
            print(f"{q.id}: {'ok ' if correct else 'BAD'} {answer.sql}", flush=True)
        for assistant in assistants.values():
            assistant.close()
    return records


def summarize(records: list[SqlRecord]) -> dict[str, Any]:
    """Overall, per-difficulty and per-database execution accuracy."""

    def acc(rs: list[SqlRecord]) -> dict[str, Any]:
        n = len(rs)
        ok = sum(r.correct for r in rs)
        return {"n": n, "correct": ok, "accuracy": round(ok / n, 4) if n else None}

    by_difficulty: dict[str, list[SqlRecord]] = defaultdict(list)
    by_db: dict[str, list[SqlRecord]] = defaultdict(list)
    for r in records:
        by_difficulty[r.difficulty].append(r)
        by_db[r.db].append(r)
    return {
        "overall": acc(records),
        "by_difficulty": {k: acc(v) for k, v in sorted(by_difficulty.items())},
        "by_db": {k: acc(v) for k, v in sorted(by_db.items())},
        "errors": sum(r.error is not None for r in records),
        "repaired": sum(r.repairs > 0 and r.error is None for r in records),
        "repaired_correct": sum(r.repairs > 0 and r.correct for r in records),
        "mean_measured_b": round(sum(r.measured_b for r in records) / len(records), 4)
        if records
        else None,
        "max_measured_b": max((r.measured_b for r in records), default=None),
    }


def write_results(
    records: list[SqlRecord], settings: dict[str, Any], out_dir: Path, seconds: float
) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(records)
    record = {
        "settings": settings,
        "wall_seconds": round(seconds, 1),
        **summary,
        "questions": [asdict(r) for r in records],
    }
    path = out_dir / "sql_accuracy.json"
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    o = summary["overall"]
    lines = [
        "# Text-to-SQL execution accuracy (SQLiteAssistant)",
        "",
        f"Settings: {json.dumps(settings)}. Execution accuracy **{o['correct']}/{o['n']}"
        f" = {o['accuracy']:.1%}**; {summary['errors']} final queries failed in SQLite; "
        f"{summary['repaired']} ran after a repair ({summary['repaired_correct']} correct); "
        f"measured KV budget B per question: mean {summary['mean_measured_b']}, "
        f"max {summary['max_measured_b']}; "
        f"{seconds / 60:.1f} min.",
        "",
        "| group | n | correct | accuracy |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, group in [("difficulty", "by_difficulty"), ("db", "by_db")]:
        for key, a in summary[group].items():
            lines.append(f"| {name}={key} | {a['n']} | {a['correct']} | {a['accuracy']:.1%} |")
    lines += ["", "| id | ok | repairs | predicted SQL |", "| --- | --- | ---: | --- |"]
    for r in records:
        sql = r.predicted_sql.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r.id} | {'yes' if r.correct else 'no'} | {r.repairs} | `{sql}` |")
    (out_dir / "sql_accuracy.md").write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=("dev", "test"), default=None, help="sample split")
    parser.add_argument("--bird", type=Path, default=None, help="a BIRD dev folder instead")
    parser.add_argument("--limit", type=int, default=None, help="first N questions only")
    parser.add_argument("--model", default="default")
    parser.add_argument("--policy", default=None, help="KV policy (default: full)")
    parser.add_argument("--budget", type=float, default=None, help="KV budget B")
    parser.add_argument("--repairs", type=int, default=0, help="retries after a SQLite error")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    if args.bird is not None:
        questions = load_bird_dev(args.bird, limit=args.limit)
    else:
        questions = load_sample_questions(split=args.split)
        if args.limit is not None:
            questions = SqlQuestionSet(questions.questions[: args.limit], questions.databases)
    settings = {
        "data": str(args.bird) if args.bird else f"sample:{args.split or 'all'}",
        "model": args.model,
        "policy": args.policy or "full",
        "budget": args.budget,
        "questions": len(questions.questions),
        "repairs": args.repairs,
    }
    start = time.perf_counter()
    records = anyio.run(
        lambda: evaluate(
            questions,
            model=args.model,
            policy=args.policy,
            budget=args.budget,
            repairs=args.repairs,
        )
    )
    path = write_results(records, settings, args.out, time.perf_counter() - start)
    print(f"wrote {path}: {summarize(records)['overall']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
