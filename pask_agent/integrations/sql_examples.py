"""Worked examples written from the database itself, shown to the model before the question.

Why: the default 0.5B model does not follow written conventions. Told in its instructions to
round only when asked with ``ROUND(x, 2)``, to return names rather than ids, to test a missing
value with ``IS NULL``, it answered the dev split exactly as before (34 of 65 both,
``results/sql_dev_conventions_full``). Small models copy demonstrations far more readily than
they follow rules, but a user's database comes without question/SQL pairs. So the assistant
writes a few itself, from templates over the schema and its data: a count per parent that
returns the parent's name through a join, a grouped average rounded to two decimals, a
missing value, a percentage, the days between two dates. Each example is a question in plain
words and its query, run read-only before it is shown: one that fails or returns nothing is
dropped. The examples depend only on the schema and data, never on the question asked, so
the prompt stays the same for every question and its KV is computed once.

Measured on the dev split (``results/sql_dev_examples_full``, five examples, Full KV): the
default model did copy the shapes. It rounded, took the days between two dates with
``JULIANDAY`` and returned names through a join where it had not before (5 questions gained),
but it also picked up the examples' columns where they did not belong (7 lost), so on the 62
questions no example answered it scored 32 against 34. Three more questions were answered
by an example outright. That is why the assistant shows none by default (``examples=0``).

Questions are phrased from column and table names (``shipping_cost`` → "shipping cost"), so
they read like a user's only as far as the names do; they teach the shape of the SQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pask_agent.grammars.sql.schema import SqlColumn, SqlTable, quote_identifier
from pask_agent.integrations.sql_db import ReadOnlyDatabase, SqlExecutionError
from pask_agent.integrations.sql_prompt import TableFacts, is_text_column, singular

_NAME_WORDS = ("name", "title", "label")
_DATE_WORDS = ("date", "_on", "_at", "time")


@dataclass(frozen=True, slots=True)
class SqlExample:
    """One demonstration: a question and the query that answers it on this database."""

    question: str
    sql: str


def _words(name: str) -> str:
    """``shipping_cost`` → "shipping cost", ``teacher_id`` → "teacher"."""
    words = name.replace("_", " ").strip()
    return words[:-3] if words.lower().endswith(" id") else words


def _q(name: str) -> str:
    return quote_identifier(name)


def _numeric(col: SqlColumn) -> bool:
    kind = col.type.upper()
    plain = not col.primary_key and col.references is None and not col.name.endswith("_id")
    return plain and any(k in kind for k in ("INT", "REAL", "NUM", "DEC", "FLOA", "DOUB"))


def _is_date(col: SqlColumn) -> bool:
    return "DATE" in col.type.upper() or any(w in col.name.lower() for w in _DATE_WORDS)


def _name_column(table: SqlTable) -> SqlColumn | None:
    """The column a person would call the row by (``name``, ``title``, ``last_name``)."""
    for word in _NAME_WORDS:
        for col in table.columns:
            if is_text_column(col) and word in col.name.lower():
                return col
    return None


def _categories(facts: TableFacts) -> Iterator[tuple[SqlColumn, tuple[str, ...]]]:
    """Text columns whose complete value set is short: what questions group and filter by."""
    name = _name_column(facts.table)
    for col in facts.table.columns:
        f = facts.columns.get(col.name)
        distinct = f is not None and not col.unique and (name is None or col.name != name.name)
        if distinct and f.complete and 2 <= len(f.values) <= 12:
            yield col, f.values


def _count_per_parent(facts: TableFacts, by_name: dict[str, TableFacts]) -> Iterator[SqlExample]:
    child = facts.table
    for col in child.columns:
        if col.references is None or col.references[0] not in by_name:
            continue
        parent = by_name[col.references[0]].table
        name = _name_column(parent)
        key = col.references[1] or (parent.primary_key[0] if parent.primary_key else "")
        if name is None or not key or parent.name == child.name:
            continue
        p, c, n = _q(parent.name), _q(child.name), f"{_q(parent.name)}.{_q(name.name)}"
        role = _words(col.name)
        as_role = "" if col.name.lower().endswith("_id") else f" as {role}"
        yield SqlExample(
            f"How many {_words(child.name)} does each {singular(_words(parent.name))} have"
            f"{as_role}?",
            f"SELECT {n}, COUNT(*) FROM {c} JOIN {p} ON {c}.{_q(col.name)} = {p}.{_q(key)} "
            f"GROUP BY {p}.{_q(key)}",
        )


def _average_per_category(facts: TableFacts, _: dict[str, TableFacts]) -> Iterator[SqlExample]:
    t = _q(facts.table.name)
    for group, _values in _categories(facts):
        for col in facts.table.columns:
            if _numeric(col):
                g, x = _q(group.name), _q(col.name)
                yield SqlExample(
                    f"What is the average {_words(col.name)} of the {_words(facts.table.name)} "
                    f"in each {_words(group.name)}, rounded to two decimals?",
                    f"SELECT {g}, ROUND(AVG({x}), 2) FROM {t} GROUP BY {g}",
                )


def _missing_value(facts: TableFacts, _: dict[str, TableFacts]) -> Iterator[SqlExample]:
    table = facts.table
    name = _name_column(table)
    if name is None:
        return
    for col in table.columns:
        if not (col.not_null or col.primary_key or col.name == name.name):
            yield SqlExample(
                f"Which {_words(table.name)} have no {_words(col.name)}? "
                f"List their {_words(name.name)}.",
                f"SELECT {_q(name.name)} FROM {_q(table.name)} WHERE {_q(col.name)} IS NULL",
            )


def _percentage(facts: TableFacts, _: dict[str, TableFacts]) -> Iterator[SqlExample]:
    t = _q(facts.table.name)
    for group, values in _categories(facts):
        value = values[0].replace("'", "''")
        yield SqlExample(
            f"What percentage of the {_words(facts.table.name)} have {_words(group.name)} "
            f"'{values[0]}', to one decimal?",
            f"SELECT ROUND(100.0 * SUM(CASE WHEN {_q(group.name)} = '{value}' THEN 1 ELSE 0 "
            f"END) / COUNT(*), 1) FROM {t}",
        )


def _days_between(facts: TableFacts, _: dict[str, TableFacts]) -> Iterator[SqlExample]:
    dates = [c for c in facts.table.columns if _is_date(c) and not c.primary_key]
    for i, a in enumerate(dates):
        for b in dates[i + 1 :]:
            t, qa, qb = _q(facts.table.name), _q(a.name), _q(b.name)
            yield SqlExample(
                f"On average, how many days pass between {_words(a.name)} and "
                f"{_words(b.name)} in {_words(facts.table.name)}, to one decimal?",
                f"SELECT ROUND(AVG(JULIANDAY({qb}) - JULIANDAY({qa})), 1) FROM {t}",
            )


Template = Callable[[TableFacts, dict[str, TableFacts]], Iterator[SqlExample]]
TEMPLATES: tuple[Template, ...] = (
    _count_per_parent,
    _average_per_category,
    _missing_value,
    _percentage,
    _days_between,
)


def _answers(db: ReadOnlyDatabase, sql: str) -> bool:
    """The query runs and returns something other than nothing or NULLs."""
    try:
        rows = db.query(sql).rows
    except SqlExecutionError:
        return False
    return any(v is not None for row in rows for v in row)


def write_examples(
    facts: tuple[TableFacts, ...], db: ReadOnlyDatabase, count: int
) -> tuple[SqlExample, ...]:
    """Up to ``count`` examples, one template after another (then again from the first), each
    from the next table that yields one that runs, so they spread over the schema."""
    by_name = {f.table.name: f for f in facts}
    out: list[SqlExample] = []
    used_tables: list[str] = []
    while len(out) < count:
        before = len(out)
        for template in TEMPLATES:
            if len(out) == count:
                break
            order = sorted(facts, key=lambda f: used_tables.count(f.table.name))
            found = next(
                (
                    (f, ex)
                    for f in order
                    for ex in template(f, by_name)
                    if ex not in out and _answers(db, ex.sql)
                ),
                None,
            )
            if found is not None:
                out.append(found[1])
                used_tables.append(found[0].table.name)
        if len(out) == before:
            break  # no template yields another example on this schema
    return tuple(out)


def example_turns(examples: tuple[SqlExample, ...]) -> list[dict[str, str]]:
    """The examples as earlier turns of the chat, question then query."""
    turns: list[dict[str, str]] = []
    for ex in examples:
        turns += [
            {"role": "user", "content": ex.question},
            {"role": "assistant", "content": ex.sql},
        ]
    return turns
