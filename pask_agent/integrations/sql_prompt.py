"""The schema a text-to-SQL prompt shows: DDL, sample rows, column values, linked to the question.

Why: a small model writes ``WHERE category = 'books'`` when it has never seen the column's
values, and confuses columns whose names alone say little. BIRD-style prompts fix much of that
by showing each table's ``CREATE TABLE`` with a few example rows, and the distinct values of
short text columns (``'Books', 'Garden', ...``). On a large schema that text outgrows the
prompt, so only the tables and columns the question links to are shown, by name overlap
(``customers`` ~ "customer") and value overlap (the question says "Germany", a column holds
'Germany'), within a token budget the caller sets.

When the whole schema fits the budget it is shown whole, and the prompt is the same for every
question, so its KV is computed once and reused; a linked prompt changes with the question.

Each ``CREATE TABLE`` stays a complete statement (the span labeller and the policy read it as
schema); rows and values follow it as comments in a fixed format that the labeller
(``grammars/sql/span_labels.py``) reads back: names as names, complete value sets as
``enum_constraint``, example rows and example values as ``schema_description``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from pask_agent.grammars.sql.schema import SqlColumn, SqlSchema, SqlTable, quote_identifier
from pask_agent.integrations.sql_db import ReadOnlyDatabase

SAMPLE_ROWS = 3  # BIRD shows three rows per table
_CELL_CHARS = 30  # a sample cell longer than this is cut
_ENUM_MAX_VALUES = 24  # a text column with at most this many distinct values lists them all
_ENUM_MAX_CHARS = 40  # ...when none is longer than this
_EXAMPLE_VALUES = 3  # otherwise a few examples (non-unique columns only)
_LINK_VALUES = 400  # distinct values per column searched for in the question
_WORD = re.compile(r"[a-z0-9]+")


def is_text_column(col: SqlColumn) -> bool:
    kind = col.type.upper()
    return not kind or "CHAR" in kind or "TEXT" in kind or "CLOB" in kind


def singular(word: str) -> str:
    """Crude singular: enough to match 'customers' with 'customer' and 'categories'."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def _words(text: str) -> set[str]:
    return {singular(w) for w in _WORD.findall(text.lower()) if len(w) > 1}


@dataclass(frozen=True, slots=True)
class ColumnFacts:
    """What the prompt may say about one column beyond its DDL."""

    values: tuple[str, ...]  # distinct values to show (all of them when ``complete``)
    complete: bool
    searchable: tuple[str, ...]  # lower-cased distinct values matched against questions


@dataclass(frozen=True, slots=True)
class TableFacts:
    table: SqlTable
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    columns: dict[str, ColumnFacts]


def read_facts(schema: SqlSchema, db: ReadOnlyDatabase) -> tuple[TableFacts, ...]:
    """Sample rows and text-column values of every table, read once per database."""
    out = []
    for table in schema.tables:
        t = quote_identifier(table.name)
        sample = db.query(f"SELECT * FROM {t} LIMIT {SAMPLE_ROWS}")
        rows = tuple(tuple(_cell(v) for v in row) for row in sample.rows)
        facts: dict[str, ColumnFacts] = {}
        for col in table.columns:
            if not is_text_column(col) or col.primary_key:
                continue
            c = quote_identifier(col.name)
            found = db.query(
                f"SELECT DISTINCT {c} FROM {t} WHERE {c} IS NOT NULL LIMIT {_LINK_VALUES + 1}",
                row_limit=_LINK_VALUES + 1,
            )
            values = [str(r[0]) for r in found.rows]
            searchable = tuple(v.lower() for v in values[:_LINK_VALUES] if len(v) >= 3)
            complete = len(values) <= _ENUM_MAX_VALUES and all(
                len(v) <= _ENUM_MAX_CHARS for v in values
            )
            if complete:
                shown = tuple(values)
            elif col.unique:
                shown = ()  # unique values (emails, names) teach nothing about the column
            else:
                shown = tuple(v[:_ENUM_MAX_CHARS] for v in values[:_EXAMPLE_VALUES])
            facts[col.name] = ColumnFacts(shown, complete, searchable)
        out.append(TableFacts(table, sample.columns, rows, facts))
    return tuple(out)


def _cell(value: object) -> str:
    text = "NULL" if value is None else str(value).replace("\n", " ")
    return text if len(text) <= _CELL_CHARS else text[: _CELL_CHARS - 3] + "..."


def _quote_value(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def render_table(facts: TableFacts, columns: tuple[str, ...] | None, *, rows: bool) -> str:
    """One table's DDL (only ``columns`` when given), then its sample rows and values."""
    table = facts.table
    if columns is not None:
        keep = [c for c in table.columns if c.name in columns]
        key = table.primary_key if all(k in columns for k in table.primary_key) else ()
        table = replace(table, columns=tuple(keep), primary_key=key)
    parts = [table.ddl()]
    shown = {c.name for c in table.columns}
    if rows and facts.rows:
        idx = [i for i, h in enumerate(facts.header) if h in shown]
        lines = [" | ".join(facts.header[i] for i in idx)]
        lines += [" | ".join(r[i] for i in idx) for r in facts.rows]
        parts.append(
            f"/*\n{len(facts.rows)} example rows from {table.name}:\n" + "\n".join(lines) + "\n*/"
        )
    for name, col in facts.columns.items():
        if name not in shown or not col.values:
            continue
        values = ", ".join(_quote_value(v) for v in col.values)
        where = f"{quote_identifier(table.name)}.{quote_identifier(name)}"
        if col.complete:
            parts.append(f"-- {where} is one of: {values}")
        else:
            parts.append(f"-- {where} e.g.: {values}, ...")
    return "\n".join(parts)


def link_scores(facts: tuple[TableFacts, ...], question: str) -> dict[str, dict[str, int]]:
    """Per table, per column: 2 when a value of the column occurs in the question, 1 when the
    column's name shares a word with it, 0 otherwise; the key ``""`` scores the table's name."""
    words = _words(question)
    text = question.lower()
    scores: dict[str, dict[str, int]] = {}
    for f in facts:
        table_score = int(bool(_words(f.table.name.replace("_", " ")) & words))
        cols = {"": table_score}
        for col in f.table.columns:
            score = int(bool(_words(col.name.replace("_", " ")) & words))
            info = f.columns.get(col.name)
            if info is not None and any(_contains(text, v) for v in info.searchable):
                score = 2
            cols[col.name] = score
        scores[f.table.name] = cols
    return scores


def _contains(text: str, value: str) -> bool:
    start = text.find(value)
    while start >= 0:
        end = start + len(value)
        before = start == 0 or not text[start - 1].isalnum()
        after = end == len(text) or not text[end].isalnum()
        if before and after:
            return True
        start = text.find(value, start + 1)
    return False


def linked_schema_text(
    facts: tuple[TableFacts, ...],
    question: str,
    budget_tokens: int,
    count_tokens: Callable[[str], int],
) -> str:
    """The schema text for ``question`` within ``budget_tokens``.

    The whole schema with rows and values when it fits; otherwise the linked tables (a name or
    value match, plus any table that joins two linked ones), all their columns if that fits,
    else their keys, foreign keys and linked columns; sample rows go first when space is short.
    """
    whole = "\n\n".join(render_table(f, None, rows=True) for f in facts)
    if count_tokens(whole) <= budget_tokens:
        return whole
    scores = link_scores(facts, question)
    linked = linked_tables(facts, scores)
    attempts = [(None, True), (None, False), ("keys", True), ("keys", False)]
    best = ""
    for n in range(len(linked), 0, -1):
        chosen = linked[:n]
        for mode, rows in attempts:
            text = "\n\n".join(
                render_table(f, _columns(f, scores, mode, chosen), rows=rows) for f in chosen
            )
            if count_tokens(text) <= budget_tokens:
                return text
            best = text
    return best  # even one table's keys overrun the budget: show that and let it be long


def linked_tables(
    facts: tuple[TableFacts, ...], scores: dict[str, dict[str, int]]
) -> list[TableFacts]:
    """The tables a question links to, best first (a name or value match, then the tables
    that join two of them); every table, best first, when none links."""
    ranked = sorted(
        facts, key=lambda f: -(3 * scores[f.table.name][""] + sum(scores[f.table.name].values()))
    )
    linked = [f for f in ranked if any(scores[f.table.name].values())]
    linked += _bridges(facts, linked)
    return linked or ranked


def unlinked_tables(facts: tuple[TableFacts, ...], question: str) -> frozenset[str]:
    """Names of the tables ``question`` does not link to: neither it nor a value of it is
    mentioned, and it joins no two tables that are. On the dev split no gold query reads one,
    and they hold 43 % of the prompt's tokens (``results/dev_checks/sql_unlinked_dev.json``);
    the span labeller marks them ``unlinked_schema`` so a budget releases them first.
    """
    keep = {f.table.name for f in linked_tables(facts, link_scores(facts, question))}
    return frozenset(f.table.name for f in facts if f.table.name not in keep)


def _columns(
    f: TableFacts, scores: dict[str, dict[str, int]], mode: str | None, chosen: list[TableFacts]
) -> tuple[str, ...] | None:
    if mode is None:
        return None
    names = {t.table.name.lower() for t in chosen}
    keep = []
    for col in f.table.columns:
        joins = col.references is not None and col.references[0].lower() in names
        named = "name" in col.name.lower() or "title" in col.name.lower()  # what answers list
        if col.primary_key or joins or named or scores[f.table.name][col.name] > 0:
            keep.append(col.name)
    return tuple(keep) or tuple(c.name for c in f.table.columns[:3])


def _bridges(facts: tuple[TableFacts, ...], linked: list[TableFacts]) -> list[TableFacts]:
    """Tables not linked themselves whose foreign keys join two linked tables."""
    names = {f.table.name.lower() for f in linked}
    out = []
    for f in facts:
        if f.table.name.lower() in names:
            continue
        targets = {c.references[0].lower() for c in f.table.columns if c.references}
        if len(targets & names) >= 2:
            out.append(f)
    return out


INSTRUCTIONS = (
    "You are a SQLite expert. Answer each question about the database below with one SQLite "
    "SELECT query and nothing else. Use only the tables and columns in the schema, each "
    "column with the table that defines it."
)
UNALIASED = (
    " Never alias a table: in a query over several tables, write every column as "
    "table.column, e.g. customers.first_name."
)
_VALUE_HINTS = 4  # distinct example values shown per text column


def repair_turn(sql: str, error: str) -> list[dict[str, str]]:
    """The model's refused query and SQLite's message, as the next two chat turns."""
    return [
        {"role": "assistant", "content": sql},
        {
            "role": "user",
            "content": f"SQLite refused that query: {error}. Check which table defines each "
            "column, then write the corrected SQLite SELECT query.",
        },
    ]


def quoting_hint(schema: SqlSchema) -> str:
    """Names the model must quote, spelled out: it otherwise writes ``grade_level``."""
    names = [n for n in (*schema.table_names, *schema.column_names()) if " " in n]
    if not names:
        return ""
    quoted = ", ".join(quote_identifier(n) for n in names)
    return f" These names contain spaces and must always be written in quotes: {quoted}."


def value_hints(schema: SqlSchema, db: ReadOnlyDatabase) -> str:
    """A few distinct values of each text column: the model needs 'Books', not 'books'."""
    lines = []
    for table in schema.tables:
        for col in table.columns:
            textual = "CHAR" in col.type.upper() or "TEXT" in col.type.upper()
            if not textual or col.unique or col.primary_key:
                continue  # unique values (emails, names) teach nothing about the column
            t, c = quote_identifier(table.name), quote_identifier(col.name)
            result = db.query(
                f"SELECT DISTINCT {c} FROM {t} WHERE {c} IS NOT NULL LIMIT {_VALUE_HINTS}"
            )
            values = ", ".join(repr(row[0][:40]) for row in result.rows)
            if values:
                lines.append(f"-- {table.name}.{col.name}: {values}, ...")
    return "-- Example values:\n" + "\n".join(lines) if lines else ""
