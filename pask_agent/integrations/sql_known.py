"""Known queries: question/SQL pairs the user has already checked, shown when they resemble
the question asked.

Why: the default 0.5B model copies demonstrations far more readily than it follows written
rules, but generic demonstrations mislead it as often as they help: shown five examples the
assistant wrote from the schema, it took their columns and filters into questions they did not
fit (``sql_examples.py``). Teams that query a database usually have queries they trust
already (a dashboard's, an analyst's, answers they checked). Shown the few whose questions
read most like the new one, the model sees the tables, joins and conventions (rounding, names
rather than ids, how a percentage is written) of questions of the same kind. This is the
example selection of DAIL-SQL-style prompting: nearest pairs by question text.

Similarity is TF-IDF cosine over lower-cased words, with IDF taken over the pool itself, so
words every known question shares ("how", "many", the database's main noun) weigh little and
the words that tell questions apart (a column, a value, "average") weigh most. It is cheap,
deterministic and needs no model. Ties keep the pool's order.

Measured with the dev split as the pool (3 shots, k = 5): on the dev split itself (each
question leaving itself out) Full KV answered 37 of 65 (32-34 in earlier runs without); on
the test split 51.6 % against 52.6 % without (``results/sql_test_shots``): a pool of 16 dev
questions per database holds few questions of a test question's shape, and the model copies
a near question's join where it does not belong as readily as it copies a fitting one. A
pool with questions of the same kind helps (``tests/integrations/test_sql_known.py``).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import sqlglot
from sqlglot import exp

from pask_agent.errors import ConfigError
from pask_agent.integrations.sql_db import ReadOnlyDatabase, SqlExecutionError
from pask_agent.integrations.sql_examples import SqlExample
from pask_agent.integrations.sql_vote import result_digest
from pask_agent.record.jsonl import json_lines

_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass(frozen=True, slots=True)
class KnownQueries:
    """A pool of checked question/query pairs for one database, searchable by question."""

    examples: tuple[SqlExample, ...]
    _idf: dict[str, float]
    _vectors: tuple[dict[str, float], ...]
    unshown: tuple[SqlExample, ...] = ()  # pairs the assistant's grammar could not follow

    @classmethod
    def of(cls, examples: Sequence[SqlExample], unshown: Sequence[SqlExample] = ()) -> KnownQueries:
        docs = [Counter(_words(e.question)) for e in examples]
        df = Counter(w for d in docs for w in d)
        n = len(docs)
        idf = {w: math.log((1 + n) / (1 + c)) + 1.0 for w, c in df.items()}
        return cls(tuple(examples), idf, tuple(_unit(d, idf) for d in docs), tuple(unshown))

    def leaving_out(self, question: str) -> KnownQueries:
        """The pool without the pairs for ``question`` (a benchmark's own questions serve as
        each other's pool this way, checked once); IDF is recomputed on what is left."""
        keep = [e for e in self.examples if e.question != question]
        return KnownQueries.of(keep, [e for e in self.unshown if e.question != question])

    def nearest(self, question: str, count: int) -> tuple[SqlExample, ...]:
        """The ``count`` known pairs whose questions read most like ``question``, most alike
        last (nearest the question in the prompt, where a small model copies from)."""
        if count <= 0 or not self.examples:
            return ()
        q = _unit(Counter(_words(question)), self._idf)
        scores = [sum(q.get(w, 0.0) * v for w, v in vec.items()) for vec in self._vectors]
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[:count]
        return tuple(self.examples[i] for i in reversed(order))


def _unit(counts: Counter[str], idf: dict[str, float]) -> dict[str, float]:
    """TF-IDF weights scaled to unit length (words outside the pool weigh nothing)."""
    vec = {w: c * idf[w] for w, c in counts.items() if w in idf}
    norm = math.sqrt(sum(v * v for v in vec.values()))
    return {w: v / norm for w, v in vec.items()} if norm else {}


def check_known_queries(examples: Sequence[SqlExample], db: ReadOnlyDatabase) -> None:
    """Refuse a pool the model must not copy from: an empty question or a query that fails.

    Raises
    ------
    ConfigError
        Naming the pair and SQLite's message, so the user can fix or drop it.
    """
    for i, ex in enumerate(examples):
        if not isinstance(ex, SqlExample):
            raise ConfigError(
                f"known_queries[{i}] is {type(ex).__name__}; pass SqlExample(question, sql)"
            )
        if not ex.question.strip() or not ex.sql.strip():
            raise ConfigError(f"known_queries[{i}] has an empty question or query")
        try:
            db.query(ex.sql)
        except SqlExecutionError as exc:
            raise ConfigError(
                f"known_queries[{i}] ({ex.question!r}) does not run on this database: {exc}"
            ) from exc


def without_table_aliases(sql: str) -> str | None:
    """``sql`` with each aliased table written by its name (``T1.name`` → ``products.name``),
    or ``None`` when that cannot be done: a table read twice (a self-join, a correlated
    subquery over the same table) or a derived table's columns need their alias.

    Why: the default grammar forbids table aliases (``grammar.py``), and a demonstration the
    grammar cannot follow teaches the model to start what it may not finish. Known queries are
    often written with aliases (BIRD's gold queries are), so they are shown rewritten; the
    caller checks that the rewrite returns what the original did. The text is edited in
    place rather than regenerated, so the query reads as its author wrote it.
    """
    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
    except sqlglot.errors.SqlglotError:
        return None
    tables = list(tree.find_all(exp.Table))
    if not any(t.alias for t in tables):
        return sql
    names = [t.name.lower() for t in tables]
    if len(set(names)) != len(names):
        return None
    out = sql
    for table in tables:
        alias = table.alias
        if not alias:
            continue
        name = table.name
        declared = re.compile(rf"\b{re.escape(name)}\s+(?:AS\s+)?{re.escape(alias)}\b", re.I)
        if len(declared.findall(out)) != 1:
            return None
        out = declared.sub(name, out)
        out = re.sub(rf"(?<![\w.'\"]){re.escape(alias)}\.", f"{name}.", out)
    try:
        rewritten = sqlglot.parse_one(out, read="sqlite")
    except sqlglot.errors.SqlglotError:
        return None
    for col in rewritten.find_all(exp.Column):
        if col.table and col.table.lower() not in names:
            return None  # a derived table's alias: the unaliased grammar cannot name it
    return out


def load_known_queries(path: str | Path) -> list[SqlExample]:
    """Known queries from a JSON Lines file, one ``{"question": ..., "sql": ...}`` per line
    (blank lines skipped).

    Raises
    ------
    ConfigError
        The file is missing, or a line is not such an object (its number is named).
    """
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"known queries file {file} does not exist")
    out: list[SqlExample] = []
    for where, item in json_lines(file, ConfigError):
        if not isinstance(item, dict) or not all(
            isinstance(item.get(k), str) for k in ("question", "sql")
        ):
            raise ConfigError(f'{where} needs {{"question": "...", "sql": "..."}}')
        out.append(SqlExample(item["question"], item["sql"]))
    return out


def known_pool(
    examples: Sequence[SqlExample], db: ReadOnlyDatabase, *, table_aliases: bool
) -> KnownQueries:
    """A pool of checked question/query pairs, each run read-only first.

    Without table aliases (the default grammar) each query is shown with its tables'
    names in place of their aliases, provided it then returns what it did; one that
    cannot be written so (a self-join, a derived table's columns) is kept out of the
    prompt and listed in ``unshown``.

    Raises
    ------
    ConfigError
        A pair is not an ``SqlExample``, is empty, or its query does not run here.
    """
    check_known_queries(examples, db)
    if table_aliases:
        return KnownQueries.of(examples)
    shown: list[SqlExample] = []
    unshown: list[SqlExample] = []
    for ex in examples:
        sql = without_table_aliases(ex.sql)
        same = sql is not None and _same_result(db, sql, ex.sql)
        (shown if same else unshown).append(replace(ex, sql=sql) if same else ex)
    return KnownQueries.of(shown, unshown)


def _same_result(db: ReadOnlyDatabase, a: str, b: str) -> bool:
    try:
        return result_digest(db.query(a)) == result_digest(db.query(b))
    except SqlExecutionError:
        return False
