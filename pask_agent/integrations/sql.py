"""``SQLiteAssistant``: questions about a SQLite file → a grammar-bound SELECT → its rows.

Why: text-to-SQL is the other agent workload of the paper (§3.3, §3.6). The schema is read
from the file; the model writes SQL under a grammar compiled from that schema (only ``SELECT``,
only the file's table and column names), the prompt's DDL is labelled span by span for the KV
policy, and the query runs on a connection that cannot change the file (``sql_db.py``).
When SQLite refuses the query (a column on the wrong table is the usual slip of a small model:
the grammar cannot tie ``T2.col`` to the table ``T2`` names, since ``FROM`` comes after the
select list), the assistant shows the model its own query and SQLite's message and asks once
more (``repairs``), continuing the same conversation so the schema's KV is reused. Repairs
are off by default: on the sample dev split (22 questions) the default model turned 1 of 6
refused queries into one that ran, and none into a correct one, so an honest error is the
better default for this model; larger models may do better.

    async with Runtime.open("default") as rt:
        assistant = SQLiteAssistant("recipes/data/shop.sqlite", runtime=rt)
        answer = await assistant.ask("How many customers are there?")
        print(answer.sql, answer.rows)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from pask_agent.errors import ConfigError
from pask_agent.grammars.sql.grammar import compile_sql_grammar
from pask_agent.grammars.sql.schema import SqlSchema, quote_identifier
from pask_agent.grammars.sql.span_labels import label_ddl_spans
from pask_agent.grammars.sql.tagger import SqlTagger
from pask_agent.integrations.sql_db import QueryResult, ReadOnlyDatabase, SqlExecutionError
from pask_agent.runtime.results import Usage
from pask_agent.runtime.runtime import Runtime

INSTRUCTIONS = (
    "You are a SQLite expert. Answer each question about the database below with one SQLite "
    "SELECT query and nothing else. Use only the tables and columns in the schema, each "
    "column with the table that defines it."
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


@dataclass(frozen=True, slots=True)
class SqlAnswer:
    """The SQL the model wrote and what it returned.

    ``error`` is set (and ``rows`` empty) when SQLite refused or failed the final query;
    ``usage`` has the final request's tokens and measured KV statistics. ``failed`` lists the
    earlier attempts that SQLite refused, as ``(sql, error)``, oldest first.
    """

    question: str
    sql: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    truncated: bool
    error: str | None
    usage: Usage
    failed: tuple[tuple[str, str], ...] = ()

    def table(self, max_rows: int = 20) -> str:
        """The rows as a plain-text table (for terminals and logs)."""
        if self.error:
            return f"error: {self.error}"
        header = list(self.columns)
        body = [["NULL" if v is None else str(v) for v in row] for row in self.rows[:max_rows]]
        widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(header)]
        lines = [" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
        lines.append("-+-".join("-" * w for w in widths))
        lines += [" | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in body]
        more = len(self.rows) - len(body)
        if more > 0 or self.truncated:
            lines.append(f"... {more if more > 0 else 'more'} rows not shown")
        return "\n".join(lines)


class SQLiteAssistant:
    """Answers questions about one SQLite database with grammar-bound SQL.

    Parameters
    ----------
    path
        The database file; it is only ever opened read-only.
    runtime
        An open ``Runtime`` (then ``ask`` must run on its event loop), or ``None`` to use the
        process-wide shared runtime of ``model`` (then ``ask`` works from any asyncio loop).
    model
        Model name for the shared runtime when ``runtime`` is None.
    time_limit_s, row_limit
        Per-query execution limits.
    max_new_tokens
        Cap on the SQL's length in tokens.
    repairs
        How many times a query SQLite refuses is sent back to the model with the error.

    Raises
    ------
    ConfigError
        The file is missing or a limit is out of range.
    DDLError
        The file is not a SQLite database or has no tables.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        runtime: Runtime | None = None,
        model: str = "default",
        time_limit_s: float = 5.0,
        row_limit: int = 200,
        max_new_tokens: int = 160,
        repairs: int = 0,
    ) -> None:
        if repairs < 0:
            raise ConfigError(f"repairs must be >= 0, got {repairs}")
        self.path = Path(path)
        self.db = ReadOnlyDatabase(self.path, time_limit_s=time_limit_s, row_limit=row_limit)
        self.schema = SqlSchema.from_sqlite(self.path)
        self.grammar = compile_sql_grammar(self.schema)
        self.system_prompt = (
            f"{INSTRUCTIONS}{self._quoting_hint()}\n\n{self.schema.ddl()}\n{self._value_hints()}"
        )
        self.runtime = runtime
        self.model = model
        self.max_new_tokens = max_new_tokens
        self.repairs = repairs
        digest = hashlib.sha256(f"{self.path.resolve()}\n{self.system_prompt}".encode())
        self._conversation_prefix = f"sql-{digest.hexdigest()[:24]}"
        self._busy: set[str] = set()

    def _quoting_hint(self) -> str:
        """Names the model must quote, spelled out: it otherwise writes ``grade_level``."""
        names = [n for n in (*self.schema.table_names, *self.schema.column_names()) if " " in n]
        if not names:
            return ""
        quoted = ", ".join(quote_identifier(n) for n in names)
        return f" These names contain spaces and must always be written in quotes: {quoted}."

    def _value_hints(self) -> str:
        """A few distinct values of each text column: the model needs 'Books', not 'books'."""
        lines = []
        for table in self.schema.tables:
            for col in table.columns:
                textual = "CHAR" in col.type.upper() or "TEXT" in col.type.upper()
                if not textual or col.unique or col.primary_key:
                    continue  # unique values (emails, names) teach nothing about the column
                t, c = quote_identifier(table.name), quote_identifier(col.name)
                result = self.db.query(
                    f"SELECT DISTINCT {c} FROM {t} WHERE {c} IS NOT NULL LIMIT {_VALUE_HINTS}"
                )
                values = ", ".join(repr(row[0][:40]) for row in result.rows)
                if values:
                    lines.append(f"-- {table.name}.{col.name}: {values}, ...")
        return "-- Example values:\n" + "\n".join(lines) if lines else ""

    def messages(self, question: str) -> list[dict[str, str]]:
        """The chat messages for a question (the schema prompt first, so its KV is reused)."""
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": question.strip()},
        ]

    def label_spans(self, text: str) -> list[Any]:
        """Prompt span labels: the DDL's tables, columns, types and constraints (App. A.3)."""
        return label_ddl_spans(text, self.schema)

    async def ask(
        self, question: str, *, policy: str | None = None, budget: float | None = None
    ) -> SqlAnswer:
        """Write SQL for ``question`` under the schema's grammar, run it, return the rows.

        A query SQLite refuses goes back to the model with the error, up to ``repairs`` times.

        Raises
        ------
        ConfigError
            The question is empty.
        """
        if not question or not question.strip():
            raise ConfigError("the question is empty; ask something about the database")
        messages = self.messages(question)
        failed: list[tuple[str, str]] = []
        while True:
            result = await self._complete(messages, policy, budget)
            sql = result.text.strip()
            try:
                rows = await anyio.to_thread.run_sync(self.db.query, sql)
            except SqlExecutionError as exc:
                if len(failed) == self.repairs:
                    return SqlAnswer(
                        question, sql, (), (), False, str(exc), result.usage, tuple(failed)
                    )
                failed.append((sql, str(exc)))
                messages = [*messages, *repair_turn(sql, str(exc))]
                continue
            return SqlAnswer(
                question, sql, rows.columns, rows.rows, rows.truncated, None, result.usage,
                tuple(failed),
            )  # fmt: skip

    async def _complete(
        self, messages: list[dict[str, str]], policy: str | None, budget: float | None
    ) -> Any:
        if self.runtime is not None:
            return await self._generate(self.runtime, messages, policy, budget)
        from pask_agent.integrations._portal import runtime_registry

        host = runtime_registry().host(self.model)
        return await host.acall(lambda rt: self._generate(rt, messages, policy, budget))

    async def _generate(
        self, rt: Runtime, messages: list[dict[str, str]], policy: str | None, budget: float | None
    ) -> Any:
        spec = rt.outputs.ebnf(
            "sql", self.grammar, new_tagger=lambda: SqlTagger(self.schema), payload=self.schema
        )
        # Questions share the schema prompt; one conversation per (policy, budget) lets each
        # reuse its KV prefix (a conversation keeps the policy of its first turn).
        key = f"{self._conversation_prefix}-{policy}-{budget}"
        conversation = None
        if key not in self._busy:
            self._busy.add(key)
            conversation = rt.conversation(key)
        try:
            return await rt.chat(
                messages,
                spec=spec,
                policy=policy,
                budget=budget,
                max_new_tokens=self.max_new_tokens,
                conversation=conversation,
                label_spans=self.label_spans,
            )
        finally:
            if conversation is not None:
                self._busy.discard(key)

    def run_sql(self, sql: str) -> QueryResult:
        """Run SQL you wrote yourself under the same read-only guards and limits.

        Raises
        ------
        SqlExecutionError
            The statement is not a read, runs too long, or fails.
        """
        return self.db.query(sql)

    def close(self) -> None:
        self.db.close()
