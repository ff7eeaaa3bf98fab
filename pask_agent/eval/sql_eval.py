"""Execution accuracy of ``SQLiteAssistant`` over the sample question set or a BIRD dev folder.

    python -m pask_agent.eval.sql_eval --split test                      # Full KV, defaults
    python -m pask_agent.eval.sql_eval --split test --policies full,pask,snapkv,mikv \\
        --budgets 0.33,0.5 --out results/sql_test
    python -m pask_agent.eval.sql_eval --split test --candidates 1 --no-linking  # old assistant
    python -m pask_agent.eval.sql_eval --bird PATH --limit 50            # a BIRD dev folder
    python -m pask_agent.eval.sql_eval --records A.jsonl --baseline B.jsonl,C.jsonl --out DIR
    python -m pask_agent.eval.sql_eval --records A.jsonl --revote 4 --out DIR  # first 4 of k

Scoring is execution accuracy (``sql_scoring.py``); every candidate is scored too, so the
report (``sql_report.py``) gives the vote's accuracy for every smaller k, which is how the
default k is chosen on the dev split. The harness (``harness.py``) runs the questions, resumes a
stopped run, shards (``--shard``, ``--workers``) and merges (``--merge``; ``--records`` is the
same with a question counted once and an optional re-vote).

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
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

from pask_agent.errors import ConfigError
from pask_agent.eval.harness import Config, Row, Scored, Workload
from pask_agent.eval.harness_args import Defaults, main_of, names, run_eval
from pask_agent.eval.harness_args import add_arguments as add_shared
from pask_agent.eval.harness_report import merge, write_files
from pask_agent.eval.harness_rows import read_rows
from pask_agent.eval.sql_data import SqlQuestion, SqlQuestionSet
from pask_agent.eval.sql_report import sections
from pask_agent.eval.sql_scoring import ALL_ROWS, revote, score_answer

DEFAULTS = Defaults(
    out="results/sql", policies="full", split=None, splits=("dev", "test"),
    max_new_tokens=160, concurrency=1,
)  # fmt: skip


def question_text(q: SqlQuestion) -> str:
    """BIRD's evidence (external knowledge) goes with the question, as BIRD's baselines do."""
    return f"{q.question} (Hint: {q.evidence})" if q.evidence.strip() else q.question


def check_inputs(questions: SqlQuestionSet) -> None:
    """Refuse what the run cannot use before the model loads and before any file is written.

    Raises
    ------
    ConfigError
        A database file is missing or a question is empty or over ``MAX_QUESTION_CHARS``.
    DDLError
        A database file is not SQLite or has no tables.
    """
    from pask_agent.grammars.sql.schema import SqlSchema
    from pask_agent.integrations.sql import MAX_QUESTION_CHARS

    if not questions.questions:
        raise ConfigError("no questions to ask; check --split, --limit or the BIRD dev.json")
    for db, path in questions.databases:
        if not Path(path).is_file():
            raise ConfigError(f"database {db!r} is missing: {path}")
        SqlSchema.from_sqlite(path)
    for q in questions.questions:
        text = question_text(q)
        if not text.strip() or len(text) > MAX_QUESTION_CHARS:
            raise ConfigError(
                f"question {q.id!r} has {len(text)} characters; each must have 1 to "
                f"{MAX_QUESTION_CHARS} (evidence included)"
            )


def known_pool(known: SqlQuestionSet | None, db: str) -> list[Any]:
    """The known queries for questions on ``db``: the pool's questions on that database with
    their gold queries (a run leaves each question's own pair out when it asks it)."""
    from pask_agent.integrations.sql_examples import SqlExample

    if known is None:
        return []
    return [SqlExample(question_text(k), k.gold_sql) for k in known.questions if k.db == db]


@dataclass(frozen=True)
class SqlWorkload(Workload):
    """Questions asked through one ``SQLiteAssistant`` per database; ``shots`` shows the
    nearest of ``known``'s questions on the same database (never the question itself) with
    their gold queries. ``baselines`` are earlier runs every configuration is paired with."""

    questions: SqlQuestionSet | None = None  # these questions instead of --split/--bird's
    split: str | None = None
    bird: Path | None = None
    limit: int | None = None
    db: str | None = None
    candidates: int = 4
    linking: bool = True
    bind_columns: bool = True
    table_aliases: bool = False
    examples: int = 0
    shots: int = 0
    known: SqlQuestionSet | None = None
    known_name: str | None = None
    repairs: int = 0
    max_new_tokens: int = 160
    baselines: tuple[tuple[Row, ...], ...] = ()
    label_unlinked: bool = True

    name: ClassVar[str] = "sql"
    title: ClassVar[str] = "Text-to-SQL execution accuracy (SQLiteAssistant)"
    group_key: ClassVar[str] = "difficulty"
    groups: ClassVar[tuple[str, ...]] = ("simple", "moderate", "challenging")
    failed_detail: ClassVar[dict[str, Any]] = {"predicted_sql": "", "candidates": []}

    @cached_property
    def question_set(self) -> SqlQuestionSet:
        from pask_agent.eval.sql_data import load_bird_dev, load_sample_questions

        if self.questions is not None:
            return self.questions
        if self.bird is not None:
            return load_bird_dev(self.bird, limit=self.limit)
        questions = load_sample_questions(split=self.split)
        if self.db is not None:
            questions = questions.select(db=self.db)
        if self.limit is not None:
            questions = SqlQuestionSet(questions.questions[: self.limit], questions.databases)
        return questions

    def cases(self) -> Sequence[SqlQuestion]:
        return self.question_set.questions

    def group(self, q: SqlQuestion) -> str:
        return q.difficulty

    def stem(self, out: Path) -> Path:
        return out / "sql_eval"

    def config_name(self, config: Config) -> str:
        plain = "" if self.linking else " plain"
        unbound = "" if self.bind_columns else " unbound"
        aliased = " aliased" if self.table_aliases else ""
        shown = f" ex={self.examples}" if self.examples else ""
        shots = f" shots={self.shots}" if self.shots else ""
        every = "" if self.label_unlinked else " no-unlinked"
        return (
            f"{config.policy_name} k={self.candidates}{plain}{unbound}{aliased}{shown}{shots}"
            f"{every}"
        )

    def check(self, configs: Sequence[Config]) -> None:
        super().check(configs)
        check_inputs(self.question_set)

    def requests_per_case(self) -> int:
        return self.candidates

    @asynccontextmanager
    async def session(self, rt: Any) -> AsyncIterator[dict[str, Any]]:
        """One assistant per database (its schema and known-query pool built once)."""
        from pask_agent.integrations.sql import SQLiteAssistant

        assistants: dict[str, Any] = {}
        try:
            for db, _ in self.question_set.databases:
                if any(q.db == db for q in self.cases()):
                    a = SQLiteAssistant(
                        self.question_set.db_path(db), runtime=rt, repairs=self.repairs,
                        linking=self.linking, bind_columns=self.bind_columns,
                        table_aliases=self.table_aliases, examples=self.examples,
                        shots=self.shots, max_new_tokens=self.max_new_tokens,
                        label_unlinked=self.label_unlinked,
                    )  # fmt: skip
                    assistants[db] = (a, a.known(known_pool(self.known, db) if self.shots else []))
            yield assistants
        finally:
            for assistant, _ in assistants.values():
                assistant.close()

    async def run(self, assistants: dict[str, Any], q: SqlQuestion, config: Config) -> Any:
        from pask_agent.integrations.sql_vote import result_digest

        assistant, pool = assistants[q.db]
        text = question_text(q)
        pool = pool.leaving_out(text)
        shown = frozenset(
            result_digest(assistant.db.query(ex.sql, row_limit=ALL_ROWS))
            for ex in assistant.shown_examples(text, pool)
        )  # the examples' results, so a question the prompt already answered is marked
        answer = await assistant.ask(
            text, policy=config.policy, budget=None if config.policy_name == "full" else
            config.budget, candidates=self.candidates, known_queries=pool,
        )  # fmt: skip
        return assistant.db, answer, shown

    def score(self, q: SqlQuestion, answer: Any) -> Scored:
        db, answer, shown = answer
        detail = {"db": q.db, "question": q.question, "gold_sql": q.gold_sql}
        return score_answer(db, q.gold_sql, answer, detail, shown)

    def settings(self) -> dict[str, Any]:
        return {
            "data": str(self.bird) if self.bird else f"sample:{self.split or 'all'}",
            "questions": len(self.cases()), "candidates": self.candidates,
            "linking": self.linking, "bind_columns": self.bind_columns,
            "table_aliases": self.table_aliases, "examples": self.examples,
            "known_queries": self.known_name, "shots": self.shots, "repairs": self.repairs,
            "max_new_tokens": self.max_new_tokens, "label_unlinked": self.label_unlinked,
        }  # fmt: skip

    def note(self, cases: int) -> str:
        return (
            f"{cases} questions; execution accuracy (rows as sets, as sequences when the gold "
            "query orders). measured B is the worst candidate's KV bytes over Full-KV bytes per "
            "question (prompt + generated, INT4 scales included)."
        )

    def report(self, rows: Sequence[Row]) -> tuple[dict[str, Any], str]:
        return sections(rows, self.baselines)

    def upgrade_row(self, data: dict[str, Any]) -> dict[str, Any]:
        """Rows written before the harness: ``budget`` null for Full KV, the budget inside the
        configuration's name (``pask@0.33 k=5``), ``error`` null when the answer ran."""
        if "valid_call" not in data:
            data["valid_call"] = data.get("error") is None
            data["error"] = data.get("error") or ""
            data["config"] = re.sub(r"^(\S+?)@[0-9.]+", r"\1", data.get("config", ""))
            if data.get("budget") is None:
                data["budget"] = 1.0
        return data


def write_results(
    out: Path, rows: Sequence[Row], settings: dict[str, Any], baselines: Sequence[Any] = ()
) -> dict[str, Any]:
    """Write ``<out>/sql_eval.{jsonl,json,md,png}`` for ``rows`` (paired with each run in
    ``baselines``); returns the JSON written."""
    workload = SqlWorkload(baselines=tuple(tuple(b) for b in baselines))
    return write_files(workload.stem(out), workload, rows, settings, ("full",))


def load_records(path: Path, *, first_config: bool = True) -> list[Row]:
    """Rows of an earlier run's JSONL (only its first configuration when asked).

    Raises
    ------
    ConfigError
        The file is missing, empty, or not rows written by this command.
    """
    if not path.is_file():
        raise ConfigError(f"{path} not found; pass a sql_eval.jsonl written by this command")
    rows = read_rows(path, SqlWorkload())
    if not rows:
        raise ConfigError(f"{path} holds no records")
    first = rows[0].key[:2]
    return [r for r in rows if r.key[:2] == first] if first_config else rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_shared(p, DEFAULTS)
    p.add_argument("--bird", type=Path, default=None, help="a BIRD dev folder instead")
    p.add_argument("--limit", type=int, default=None, help="first N questions only")
    p.add_argument("--db", default=None, help="one sample database's questions only")
    p.add_argument("--candidates", type=int, default=None, help="k (default: assistant's)")
    p.add_argument("--no-linking", action="store_true", help="the plain DDL prompt")
    p.add_argument("--no-binding", action="store_true", help="the grammar without column binding")
    p.add_argument(
        "--no-unlinked-label", action="store_true",
        help="label every table by its structure alone (no unlinked_schema for the tables the "
        "question does not link to)",
    )  # fmt: skip
    p.add_argument(
        "--table-aliases", action="store_true",
        help="let queries alias tables (T1.col) as before; columns in joins stay unbound",
    )  # fmt: skip
    p.add_argument(
        "--examples", type=int, default=None,
        help="worked examples written from each database (default: the assistant's; 0: none)",
    )  # fmt: skip
    p.add_argument(
        "--known-queries", choices=("dev", "test"), default=None,
        help="show each question the nearest sample questions of this split on its database "
        "with their gold queries (never the question itself; see --shots)",
    )  # fmt: skip
    p.add_argument("--shots", type=int, default=None, help="known queries shown (default 3)")
    p.add_argument("--repairs", type=int, default=0, help="retries after a SQLite error")
    p.add_argument("--baseline", default=None, help="earlier runs' JSONL to pair against, a,b")
    p.add_argument("--records", default=None, help="report earlier runs' JSONL files, a,b")
    p.add_argument("--revote", type=int, default=None, help="with --records: first K vote")


def workload_from(args: argparse.Namespace) -> SqlWorkload:
    """The workload the flags describe.

    Raises
    ------
    ConfigError
        ``--candidates`` or ``--examples`` below their minimum, ``--shots`` without a pool.
    """
    from pask_agent.integrations.sql import DEFAULT_CANDIDATES, DEFAULT_EXAMPLES, DEFAULT_SHOTS

    k = DEFAULT_CANDIDATES if args.candidates is None else args.candidates
    if k < 1:
        raise ConfigError(f"--candidates must be >= 1, got {k}")
    n_examples = DEFAULT_EXAMPLES if args.examples is None else args.examples
    if n_examples < 0:
        raise ConfigError(f"--examples must be >= 0, got {n_examples}")
    shots, known = 0, None
    if args.known_queries is not None:
        from pask_agent.eval.sql_data import load_sample_questions

        shots = DEFAULT_SHOTS if args.shots is None else args.shots
        if shots < 1:
            raise ConfigError(f"--shots must be >= 1, got {shots}")
        known = load_sample_questions(split=args.known_queries)
    elif args.shots is not None:
        raise ConfigError("--shots needs --known-queries SPLIT (the pool to show from)")
    baselines = tuple(tuple(load_records(Path(b))) for b in names(args.baseline or ""))
    return SqlWorkload(
        None, args.split, args.bird, args.limit, args.db, k, not args.no_linking,
        not args.no_binding, args.table_aliases, n_examples, shots, known, args.known_queries,
        args.repairs, args.max_new_tokens, baselines, not args.no_unlinked_label,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    workload = workload_from(args)
    if args.records is None:
        return run_eval(args, workload, module=__spec__.name)
    if args.revote is not None and args.revote < 1:  # re-report (shards, pairs) without a model
        raise ConfigError(f"--revote must be >= 1, got {args.revote}")
    k = args.revote

    def again(rows: Sequence[Row]) -> list[Row]:
        return [revote(r, k) for r in rows] if k is not None else list(rows)

    parts = [Path(p) for p in names(args.records)]
    out = workload.stem(Path(args.out))
    merge(workload, parts, out, references=tuple(names(args.reference)), keep_first=True,
          transform=again)  # fmt: skip
    print(f"wrote {out}.{{jsonl,md,png,json}}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return main_of(add_arguments, run, "python -m pask_agent.eval.sql_eval", __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
