"""Execution accuracy of ``SQLiteAssistant`` over the sample question set or a BIRD dev folder.

    python -m pask_agent.eval.sql_eval --split test                      # Full KV, defaults
    python -m pask_agent.eval.sql_eval --split test --policies full,pask,snapkv,mikv \\
        --budgets 0.33,0.5 --out results/sql_test
    python -m pask_agent.eval.sql_eval --split test --candidates 1 --no-linking  # old assistant
    python -m pask_agent.eval.sql_eval --bird PATH --limit 50            # a BIRD dev folder
    python -m pask_agent.eval.sql_eval --records A.jsonl --baseline B.jsonl,C.jsonl --out DIR
    python -m pask_agent.eval.sql_eval --records A.jsonl --revote 4 --out DIR  # first 4 of k

A question counts as correct when the chosen query's rows equal the gold query's rows: as sets
(BIRD's rule, duplicates ignored) unless the gold query orders its result (a top-level
``ORDER BY``), then as sequences. Floats are compared to 6 decimals. Every candidate is scored
too, so the accuracy of voting among the first k candidates can be read off one run for every
smaller k (``k_curve``); that is how the default k is chosen on the dev split.

Writes ``<out>/sql_eval.jsonl`` (one record per question and configuration),
``<out>/sql_eval.md`` (accuracy by difficulty per policy and budget, with measured B, shaped
like the paper's Table 12), ``<out>/sql_eval.png`` (accuracy against measured B) and
``<out>/sql_eval.json`` (summaries, settings, command, git commit, machine).

Inputs are checked before the model loads and before any file is written: a missing database,
a file that is not SQLite, a database without tables, a question over 4,000 characters or a
BIRD folder whose database is missing stop the run with a typed error and change no file.
Databases are only ever opened read-only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
import sqlglot
from sqlglot import exp

from pask_agent.errors import ConfigError, PaskError
from pask_agent.eval.sql_data import SqlQuestion, SqlQuestionSet
from pask_agent.grammars.sql.schema import SqlSchema
from pask_agent.integrations.sql import MAX_QUESTION_CHARS, SQLiteAssistant
from pask_agent.integrations.sql_answer import SqlAnswer
from pask_agent.integrations.sql_db import QueryResult, ReadOnlyDatabase, SqlExecutionError
from pask_agent.integrations.sql_examples import SqlExample
from pask_agent.integrations.sql_known import KnownQueries
from pask_agent.integrations.sql_vote import result_digest, tally

_ALL_ROWS = 1_000_000  # scoring compares whole results, not the assistant's row cap
_DIFFICULTIES = ("simple", "moderate", "challenging")


@dataclass(frozen=True, slots=True)
class SqlConfig:
    """One row of the results table: a KV policy at a budget, and how the assistant asks."""

    policy: str
    budget: float | None
    candidates: int
    linking: bool
    bind_columns: bool = True
    table_aliases: bool = False
    examples: int = 0
    shots: int = 0  # nearest known queries shown (sql_known.py), from ``evaluate``'s pool

    @property
    def name(self) -> str:
        b = "" if self.budget is None else f"@{self.budget:g}"
        plain = "" if self.linking else " plain"
        unbound = "" if self.bind_columns else " unbound"
        aliased = " aliased" if self.table_aliases else ""
        shown = f" ex={self.examples}" if self.examples else ""
        shots = f" shots={self.shots}" if self.shots else ""
        return f"{self.policy}{b} k={self.candidates}{plain}{unbound}{aliased}{shown}{shots}"


@dataclass(frozen=True, slots=True)
class SqlRecord:
    """One question under one configuration; ``candidates`` holds each candidate's SQL,
    result digest, votes, error and whether its rows match the gold rows."""

    config: str
    policy: str
    budget: float | None
    id: str
    db: str
    difficulty: str
    question: str
    gold_sql: str
    predicted_sql: str
    correct: bool
    error: str | None
    completion_tokens: int
    measured_b: float  # the worst candidate's: a budget holds per request
    pooled_b: float  # all candidates' KV bytes over their Full-KV bytes
    seconds: float
    repairs: int = 0
    candidates: list[dict[str, Any]] = field(default_factory=list)
    # the gold result equals one of the worked examples' the prompt showed (sql_examples.py)
    example_match: bool = False


def gold_orders(sql: str) -> bool:
    """Whether the query orders its result at the top level (then order is scored)."""
    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
    except sqlglot.errors.SqlglotError:
        return " ORDER BY " in sql.upper()
    return isinstance(tree, exp.Query) and tree.args.get("order") is not None


def _norm(rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    return [tuple(round(v, 6) + 0.0 if isinstance(v, float) else v for v in r) for r in rows]


def results_match(predicted: QueryResult, gold: QueryResult, *, ordered: bool) -> bool:
    """Rows equal as sequences when the gold query orders, else as sets (BIRD's rule)."""
    p, g = _norm(predicted.rows), _norm(gold.rows)
    return p == g if ordered else set(p) == set(g)


def check_inputs(questions: SqlQuestionSet) -> None:
    """Refuse what the run cannot use before the model loads and before any file is written.

    Raises
    ------
    ConfigError
        A database file is missing or a question is empty or over ``MAX_QUESTION_CHARS``.
    DDLError
        A database file is not SQLite or has no tables.
    """
    if not questions.questions:
        raise ConfigError("no questions to ask; check --split, --limit or the BIRD dev.json")
    for db, path in questions.databases:
        if not Path(path).is_file():
            raise ConfigError(f"database {db!r} is missing: {path}")
        SqlSchema.from_sqlite(path)
    for q in questions.questions:
        text = _question_text(q)
        if not text.strip() or len(text) > MAX_QUESTION_CHARS:
            raise ConfigError(
                f"question {q.id!r} has {len(text)} characters; each must have 1 to "
                f"{MAX_QUESTION_CHARS} (evidence included)"
            )


def _question_text(q: SqlQuestion) -> str:
    """BIRD's evidence (external knowledge) goes with the question, as BIRD's baselines do."""
    return f"{q.question} (Hint: {q.evidence})" if q.evidence.strip() else q.question


def configurations(
    policies: Sequence[str],
    budgets: Sequence[float],
    candidates: int,
    linking: bool,
    bind_columns: bool = True,
    table_aliases: bool = False,
    examples: int = 0,
    shots: int = 0,
) -> list[SqlConfig]:
    """Full KV once, every other policy at every budget."""
    out: list[SqlConfig] = []
    for p in policies:
        for b in [None] if p == "full" else budgets:
            cfg = SqlConfig(p, b, candidates, linking, bind_columns, table_aliases, examples, shots)
            if cfg not in out:
                out.append(cfg)
    return out


def example_digests(assistant: SQLiteAssistant, examples: Sequence[SqlExample]) -> frozenset[str]:
    """The result sets of the examples a prompt shows (to mark a question they answer)."""
    return frozenset(
        result_digest(assistant.db.query(ex.sql, row_limit=_ALL_ROWS)) for ex in examples
    )


def known_pool(known: SqlQuestionSet | None, db: str) -> list[SqlExample]:
    """The known queries for questions on ``db``: the pool's questions on that database with
    their gold queries (``evaluate`` leaves each question's own pair out when it asks it)."""
    if known is None:
        return []
    return [SqlExample(_question_text(k), k.gold_sql) for k in known.questions if k.db == db]


def score(
    db: ReadOnlyDatabase,
    q: SqlQuestion,
    answer: SqlAnswer,
    config: SqlConfig,
    seconds: float,
    shown: frozenset[str] = frozenset(),
) -> SqlRecord:
    """Compare the answer and each candidate with the gold rows; ``shown`` holds the digests
    of the examples' results, so a question the prompt already answered is marked."""
    ordered = gold_orders(q.gold_sql)
    gold = db.query(q.gold_sql, row_limit=_ALL_ROWS)
    right: dict[str, bool] = {}
    candidates = []
    for c in answer.candidates:
        ok = False
        if c.error is None:
            if c.sql not in right:
                try:
                    rows = db.query(c.sql, row_limit=_ALL_ROWS)
                    right[c.sql] = results_match(rows, gold, ordered=ordered)
                except SqlExecutionError:  # past the time limit once the row cap is lifted
                    right[c.sql] = False
            ok = right[c.sql]
        candidates.append(
            {"sql": c.sql, "digest": c.digest, "votes": c.votes, "error": c.error,
             "empty": c.empty, "correct": ok}
        )  # fmt: skip
    correct = answer.error is None and right.get(answer.sql, False)
    u = answer.usage
    return SqlRecord(
        config.name, config.policy, config.budget, q.id, q.db, q.difficulty, q.question,
        q.gold_sql, answer.sql, correct, answer.error, u.completion_tokens,
        round(u.max_measured_b, 4), round(u.measured_b, 4), round(seconds, 2),
        len(answer.failed), candidates, result_digest(gold) in shown,
    )  # fmt: skip


async def evaluate(
    questions: SqlQuestionSet,
    configs: Sequence[SqlConfig],
    *,
    model: Any = "default",
    repairs: int = 0,
    log: Callable[[str], None] = print,
    on_record: Callable[[list[SqlRecord]], None] | None = None,
    known: SqlQuestionSet | None = None,
) -> list[SqlRecord]:
    """Ask every question under every configuration (one assistant per database and prompt
    style) and score it; ``on_record`` sees all records so far after each question, so a run
    cut short still leaves its files. A configuration with ``shots`` shows the nearest of
    ``known``'s questions on the same database (never the question itself) with their gold
    queries."""
    from pask_agent.policy.registry import get_policy
    from pask_agent.runtime.runtime import Runtime

    for cfg in configs:
        get_policy(cfg.policy)  # an unknown name fails before the model loads
    check_inputs(questions)
    records: list[SqlRecord] = []
    async with Runtime.open(model) as rt:
        assistants: dict[tuple[str, bool, bool, bool, int, int], SQLiteAssistant] = {}
        pools: dict[tuple[str, bool, bool, bool, int, int], KnownQueries] = {}
        try:
            for cfg in configs:
                for q in questions.questions:
                    key = (
                        q.db, cfg.linking, cfg.bind_columns, cfg.table_aliases, cfg.examples,
                        cfg.shots,
                    )  # fmt: skip
                    if key not in assistants:
                        assistants[key] = SQLiteAssistant(
                            questions.db_path(q.db),
                            runtime=rt,
                            repairs=repairs,
                            linking=cfg.linking,
                            bind_columns=cfg.bind_columns,
                            table_aliases=cfg.table_aliases,
                            examples=cfg.examples,
                            shots=cfg.shots,
                        )
                        pools[key] = assistants[key].known(
                            known_pool(known, q.db) if cfg.shots else []
                        )  # checked (and rewritten) once per database
                    assistant = assistants[key]
                    pool = pools[key].leaving_out(_question_text(q))
                    shown = example_digests(
                        assistant, assistant.shown_examples(_question_text(q), pool)
                    )
                    start = time.perf_counter()
                    answer = await assistant.ask(
                        _question_text(q),
                        policy=cfg.policy,
                        budget=cfg.budget,
                        candidates=cfg.candidates,
                        known_queries=pool,
                    )
                    seconds = time.perf_counter() - start
                    record = score(assistant.db, q, answer, cfg, seconds, shown)
                    records.append(record)
                    mark = "ok " if record.correct else "BAD"
                    log(f"[{cfg.name}] {q.id}: {mark} B={record.measured_b:.3f} {answer.sql}")
                    if on_record is not None:
                        on_record(records)
        finally:
            for assistant in assistants.values():
                assistant.close()
    return records


_BINDING_ERRORS = ("no such column", "ambiguous column name")


def is_binding_error(error: str | None) -> bool:
    """SQLite's refusal of a column its query's tables do not have (or have twice)."""
    return error is not None and any(e in error for e in _BINDING_ERRORS)


def binding_errors(records: Sequence[SqlRecord]) -> dict[str, int]:
    """Candidates and chosen answers that SQLite refused for a column-to-table slip."""
    return {
        "candidates": sum(is_binding_error(c["error"]) for r in records for c in r.candidates),
        "candidates_total": sum(len(r.candidates) for r in records),
        "candidates_refused": sum(c["error"] is not None for r in records for c in r.candidates),
        "answers": sum(is_binding_error(r.error) for r in records),
    }


def k_curve(records: Sequence[SqlRecord], ks: Sequence[int]) -> dict[int, float]:
    """Accuracy had only the first k candidates voted (greedy first, seeds in order)."""
    return {
        k: round(sum(revote(r, k).correct for r in records) / len(records), 4) if records else 0.0
        for k in ks
    }


def vote_ceiling(records: Sequence[SqlRecord]) -> dict[str, Any]:
    """Questions where at least one candidate is right: what a perfect choice among the same
    candidates would score. No vote can beat it, so it tells whether an accuracy target is
    out of reach of the candidates themselves rather than of the way they are chosen."""
    return _accuracy(r.correct or any(c.get("correct") for c in r.candidates) for r in records)


def _accuracy(hits: Iterable[bool]) -> dict[str, Any]:
    hits = list(hits)
    ok = sum(hits)
    return {"n": len(hits), "correct": ok, "accuracy": round(ok / len(hits), 4) if hits else None}


def revote(record: SqlRecord, k: int) -> SqlRecord:
    """The record as a run with only its first ``k`` candidates would have scored it: the same
    vote (``tally``) over fewer candidates. ``measured_b`` stays the whole run's worst
    candidate's, an upper bound for the first ``k``."""
    cands = [dict(c) for c in record.candidates[:k]]
    votes, best = tally([c["digest"] for c in cands], [c.get("empty", False) for c in cands])
    for c, v in zip(cands, votes, strict=True):
        c["votes"] = v
    chosen = cands[0] if best is None else cands[best]
    config = re.sub(r"\bk=\d+", f"k={len(cands)}", record.config)
    return replace(
        record,
        config=config,
        predicted_sql=chosen["sql"],
        correct=best is not None and bool(chosen["correct"]),
        error=chosen["error"] if best is None else None,
        candidates=cands,
    )


def summarize(records: Sequence[SqlRecord]) -> list[dict[str, Any]]:
    """Per configuration: accuracy overall, by difficulty and by database; measured B."""
    by_config: dict[str, list[SqlRecord]] = defaultdict(list)
    for r in records:
        by_config[r.config].append(r)

    def acc(rs: list[SqlRecord]) -> dict[str, Any]:
        return _accuracy(r.correct for r in rs)

    out = []
    for name, rs in by_config.items():
        groups: dict[str, dict[str, list[SqlRecord]]] = {"difficulty": {}, "db": {}}
        for r in rs:
            groups["difficulty"].setdefault(r.difficulty, []).append(r)
            groups["db"].setdefault(r.db, []).append(r)
        k = max(len(r.candidates) for r in rs)
        out.append(
            {
                "config": name,
                "policy": rs[0].policy,
                "budget": rs[0].budget,
                "overall": acc(rs),
                "example_matches": sum(r.example_match for r in rs),
                "outside_examples": acc([r for r in rs if not r.example_match]),
                "by_difficulty": {d: acc(v) for d, v in sorted(groups["difficulty"].items())},
                "by_db": {d: acc(v) for d, v in sorted(groups["db"].items())},
                "errors": sum(r.error is not None for r in rs),
                "binding_errors": binding_errors(rs),
                "mean_measured_b": round(sum(r.measured_b for r in rs) / len(rs), 4),
                "max_measured_b": max(r.measured_b for r in rs),
                "k_curve": k_curve(rs, range(1, k + 1)),
                "vote_ceiling": vote_ceiling(rs),
                "seconds": round(sum(r.seconds for r in rs), 1),
            }
        )
    return out


def paired_against(
    records: Sequence[SqlRecord], baseline: Sequence[SqlRecord]
) -> list[tuple[str, Any]]:
    """Each configuration against the baseline run, paired by question id."""
    from pask_agent.eval.paired import compare_paired

    base = {r.id: r.correct for r in baseline}
    by_config: dict[str, dict[str, bool]] = defaultdict(dict)
    for r in records:
        by_config[r.config][r.id] = r.correct
    return [(name, compare_paired(hits, base)) for name, hits in by_config.items()]


def same_candidates(
    records: Sequence[SqlRecord], baseline: Sequence[SqlRecord]
) -> dict[str, tuple[int, int]]:
    """Per configuration: candidates whose SQL equals the baseline's candidate of the same
    question and index (the same seed), out of those both runs have. How closely a compressed
    cache follows Full KV, with far less noise than accuracy."""
    base = {r.id: [c["sql"] for c in r.candidates] for r in baseline}
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in records:
        theirs = base.get(r.id)
        if theirs is None:
            continue
        pairs = list(zip((c["sql"] for c in r.candidates), theirs, strict=False))
        out[r.config][0] += sum(a == b for a, b in pairs)
        out[r.config][1] += len(pairs)
    return {name: (v[0], v[1]) for name, v in out.items()}


def load_records(path: Path, *, first_config: bool = True) -> list[SqlRecord]:
    """Records of an earlier run's JSONL (only its first configuration when asked).

    Raises
    ------
    ConfigError
        The file is missing, empty, or not records written by this command.
    """
    if not path.is_file():
        raise ConfigError(f"{path} not found; pass a sql_eval.jsonl written by this command")
    try:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        records = [SqlRecord(**row) for row in rows]
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{path} is not a sql_eval.jsonl of this command ({exc})") from exc
    if not records:
        raise ConfigError(f"{path} holds no records")
    return [r for r in records if r.config == records[0].config] if first_config else records


def write_results(
    out: Path,
    records: Sequence[SqlRecord],
    settings: dict[str, Any],
    baselines: Sequence[Sequence[SqlRecord]] = (),
) -> dict[str, Any]:
    """Write the JSONL, Markdown, PNG and summary JSON; returns the summary object. Each run
    in ``baselines`` is paired with every configuration, by question id."""
    from pask_agent.eval.paired import paired_table
    from pask_agent.eval.plots import plot_accuracy_vs_budget
    from pask_agent.record.provenance import provenance

    out.mkdir(parents=True, exist_ok=True)
    summaries = summarize(records)
    with (out / "sql_eval.jsonl").open("w") as f:
        for r in records:
            f.write(json.dumps(asdict(r), ensure_ascii=False, default=str) + "\n")
    report = {**provenance(), "settings": settings, "configs": summaries}
    lines = [
        "# Text-to-SQL execution accuracy (SQLiteAssistant)",
        "",
        f"Command: `{report['command']}`; commit {report['git_commit']}; {report['machine']}.",
        f"Settings: {json.dumps(settings)}.",
        "",
        "Execution accuracy (%) by difficulty; measured B is the worst candidate's KV bytes over "
        "Full-KV bytes per question (prompt + generated, INT4 scales included).",
        "",
        "| configuration | simple | moderate | challenging | overall | n | mean B | max B | "
        "errors | s/question |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        cells = []
        for d in _DIFFICULTIES:
            a = s["by_difficulty"].get(d)
            cells.append(f"{100 * a['accuracy']:.1f}" if a else "-")
        o = s["overall"]
        lines.append(
            f"| {s['config']} | {' | '.join(cells)} | **{100 * o['accuracy']:.1f}** "
            f"({o['correct']}/{o['n']}) | {o['n']} | {s['mean_measured_b']:.3f} | "
            f"{s['max_measured_b']:.3f} | {s['errors']} | {s['seconds'] / o['n']:.1f} |"
        )
    lines += ["", "Candidates SQLite refused, and how many for a column not in its tables:", ""]
    for s in summaries:
        b = s["binding_errors"]
        lines.append(
            f"- {s['config']}: {b['candidates_refused']} of {b['candidates_total']} candidates "
            f"refused, {b['candidates']} for a column binding; {b['answers']} chosen answers"
        )
    lines += ["", "Questions whose gold result equals a worked example's the prompt showed:", ""]
    for s in summaries:
        o = s["outside_examples"]
        rest = f"{100 * o['accuracy']:.1f} % ({o['correct']}/{o['n']})" if o["n"] else "-"
        lines.append(f"- {s['config']}: {s['example_matches']}; accuracy on the others {rest}")
    lines += ["", "Voting among the first k candidates (accuracy %):", ""]
    for s in summaries:
        curve = ", ".join(f"k={k}: {100 * v:.1f}" for k, v in s["k_curve"].items())
        c = s["vote_ceiling"]
        lines.append(
            f"- {s['config']}: {curve}; any candidate right (no vote can do better): "
            f"{100 * c['accuracy']:.1f} ({c['correct']}/{c['n']})"
        )
    report["paired_vs_baseline"] = []
    for base in baselines:
        pairs = paired_against(records, base)
        name = base[0].config
        same = same_candidates(records, base)
        report["paired_vs_baseline"] += [
            {"baseline": name, "config": n, **asdict(c), "same_candidates": same.get(n, (0, 0))}
            for n, c in pairs
        ]
        (b,) = summarize(base)
        errors = b["binding_errors"]
        lines += [
            "",
            f"Paired against the baseline run ({name}: {100 * b['overall']['accuracy']:.1f} %, "
            f"{errors['candidates']} of {errors['candidates_total']} candidates refused for a "
            f"column binding):",
            "",
            paired_table(pairs, reference="baseline"),
        ]
        ratios = [
            f"{s['config']} {s['overall']['accuracy'] / b['overall']['accuracy']:.2f}x"
            for s in summaries
            if b["overall"]["accuracy"]
        ]
        lines += ["", "Accuracy over the baseline's: " + ", ".join(ratios) + "."]
        shown = ", ".join(f"{n} {v[0]} of {v[1]}" for n, v in same.items())
        lines += ["", f"Candidates with the baseline's SQL (same question and seed): {shown}."]
    lines += ["", "| config | id | ok | predicted SQL |", "|---|---|---|---|"]
    for r in records:
        sql = r.predicted_sql.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r.config} | {r.id} | {'yes' if r.correct else 'no'} | `{sql}` |")
    (out / "sql_eval.md").write_text("\n".join(lines) + "\n")
    (out / "sql_eval.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    points = [
        _Point(s["policy"], s["mean_measured_b"], s["overall"]["accuracy"]) for s in summaries
    ]
    plot_accuracy_vs_budget(points, out / "sql_eval.png", title="Text-to-SQL execution accuracy")
    return report


@dataclass(frozen=True, slots=True)
class _Point:
    policy: str
    measured_b: float
    overall: float


def _load(args: argparse.Namespace) -> SqlQuestionSet:
    from pask_agent.eval.sql_data import load_bird_dev, load_sample_questions

    if args.bird is not None:
        return load_bird_dev(args.bird, limit=args.limit)
    questions = load_sample_questions(split=args.split)
    if args.db is not None:
        questions = questions.select(db=args.db)
    if args.limit is not None:
        questions = SqlQuestionSet(questions.questions[: args.limit], questions.databases)
    if args.shard is not None:
        index, count = _shard(args.shard)
        picked = questions.questions[index::count]
        questions = SqlQuestionSet(picked, questions.databases)
    return questions


def _shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError as exc:
        raise ConfigError(f"--shard must look like 0/2, got {text!r}") from exc
    if not 0 <= index < count:
        raise ConfigError(f"--shard {text}: need 0 <= I < N")
    return index, count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pask_agent.eval.sql_eval", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--split", choices=("dev", "test"), default=None, help="sample split")
    parser.add_argument("--bird", type=Path, default=None, help="a BIRD dev folder instead")
    parser.add_argument("--limit", type=int, default=None, help="first N questions only")
    parser.add_argument("--model", default="default")
    parser.add_argument("--policies", default="full", help="comma-separated policy names")
    parser.add_argument("--budgets", default="0.33", help="comma-separated target budgets B")
    parser.add_argument("--candidates", type=int, default=None, help="k (default: assistant's)")
    parser.add_argument("--no-linking", action="store_true", help="the plain DDL prompt")
    parser.add_argument(
        "--no-binding", action="store_true", help="the grammar without column binding"
    )
    parser.add_argument(
        "--table-aliases",
        action="store_true",
        help="let queries alias tables (T1.col) as before; columns in joins stay unbound",
    )
    parser.add_argument(
        "--examples",
        type=int,
        default=None,
        help="worked examples written from each database (default: the assistant's; 0: none)",
    )
    parser.add_argument(
        "--known-queries",
        choices=("dev", "test"),
        default=None,
        help="show each question the nearest sample questions of this split on its database "
        "with their gold queries (never the question itself; see --shots)",
    )
    parser.add_argument(
        "--shots", type=int, default=None, help="known queries shown per question (default 3)"
    )
    parser.add_argument("--repairs", type=int, default=0, help="retries after a SQLite error")
    parser.add_argument(
        "--baseline",
        default=None,
        help="earlier runs' JSONL to pair against, comma-separated",
    )
    parser.add_argument(
        "--records", default=None, help="report earlier runs' JSONL files, comma-separated"
    )
    parser.add_argument(
        "--revote", type=int, default=None, help="with --records: vote among the first K only"
    )
    parser.add_argument("--shard", default=None, help="I/N: every N-th question from the I-th")
    parser.add_argument("--db", default=None, help="one sample database's questions only")
    parser.add_argument("--out", type=Path, default=Path("results/sql"))
    args = parser.parse_args(argv)
    try:
        from pask_agent.integrations.sql import (
            DEFAULT_CANDIDATES,
            DEFAULT_EXAMPLES,
            DEFAULT_SHOTS,
        )

        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        try:
            budgets = [float(b) for b in args.budgets.split(",") if b.strip()]
        except ValueError as exc:
            raise ConfigError(f"--budgets must be comma-separated numbers: {exc}") from exc
        k = DEFAULT_CANDIDATES if args.candidates is None else args.candidates
        if k < 1:
            raise ConfigError(f"--candidates must be >= 1, got {k}")
        n_examples = DEFAULT_EXAMPLES if args.examples is None else args.examples
        if n_examples < 0:
            raise ConfigError(f"--examples must be >= 0, got {n_examples}")
        shots = 0
        if args.known_queries is not None:
            shots = DEFAULT_SHOTS if args.shots is None else args.shots
            if shots < 1:
                raise ConfigError(f"--shots must be >= 1, got {shots}")
        elif args.shots is not None:
            raise ConfigError("--shots needs --known-queries SPLIT (the pool to show from)")
        baselines = [
            load_records(Path(part.strip()))
            for part in (args.baseline or "").split(",")
            if part.strip()
        ]
        if args.records is not None:  # re-report (shards merged, paired) without a model
            merged: dict[tuple[str, str], SqlRecord] = {}
            for part in args.records.split(","):  # shards; a question twice counts once
                for r in load_records(Path(part.strip()), first_config=False):
                    merged.setdefault((r.config, r.id), r)
            records = list(merged.values())
            if args.revote is not None:
                if args.revote < 1:
                    raise ConfigError(f"--revote must be >= 1, got {args.revote}")
                records = [revote(r, args.revote) for r in records]
            settings = {"records": args.records, "baseline": args.baseline, "revote": args.revote}
            write_results(args.out, records, settings, baselines)
            print(f"wrote {args.out}/sql_eval.{{jsonl,md,png,json}}")
            return 0
        configs = configurations(
            policies,
            budgets,
            k,
            not args.no_linking,
            not args.no_binding,
            args.table_aliases,
            n_examples,
            shots,
        )
        if not configs:
            raise ConfigError("name at least one policy (and a budget for policies but full)")
        questions = _load(args)
        check_inputs(questions)
        settings = {
            "data": str(args.bird) if args.bird else f"sample:{args.split or 'all'}",
            "model": args.model,
            "questions": len(questions.questions),
            "candidates": k,
            "linking": not args.no_linking,
            "bind_columns": not args.no_binding,
            "table_aliases": args.table_aliases,
            "examples": n_examples,
            "known_queries": args.known_queries,
            "shots": shots,
            "repairs": args.repairs,
        }
        known = None
        if args.known_queries is not None:
            from pask_agent.eval.sql_data import load_sample_questions

            known = load_sample_questions(split=args.known_queries)
        records = anyio.run(
            lambda: evaluate(
                questions,
                configs,
                model=args.model,
                repairs=args.repairs,
                on_record=lambda rs: write_results(args.out, rs, settings, baselines),
                known=known,
            )
        )
    except PaskError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for s in summarize(records):
        print(f"{s['config']}: {s['overall']} mean B {s['mean_measured_b']}")
    print(f"wrote {args.out}/sql_eval.{{jsonl,md,png,json}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
