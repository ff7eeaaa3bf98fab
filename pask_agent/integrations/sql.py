"""``SQLiteAssistant``: questions about a SQLite file → a grammar-bound SELECT → its rows.

Why: text-to-SQL is the other agent workload of the paper (§3.3, §3.6). The schema is read
from the file; the model writes SQL under a grammar compiled from that schema (only ``SELECT``,
only the file's table and column names), the prompt's DDL is labelled span by span for the KV
policy, and the query runs on a connection that cannot change the file (``sql_db.py``).
Each question gets several candidate queries decoded in one batch (greedy plus seeded samples);
each runs read-only and the answer is the result set most of them return (``sql_vote.py``):
a small model's samples agree on the right rows more often than its greedy query finds them.
``examples=N`` shows the model N worked examples (question, query) that the assistant wrote
from the database's own schema and data (``sql_examples.py``) before the question; off by
default, since on the dev split they moved as many answers one way as the other.
``known_queries`` are question/query pairs the user has checked; the ``shots`` nearest to
each question are shown before it (``sql_known.py``).
The grammar binds columns to tables where it can (``grammar.py``). When SQLite still refuses
a query, ``repairs`` shows the model its query and SQLite's message and asks once more, in the
same conversation so the schema's KV is reused; off by default: on the sample dev split the
default model turned 1 of 6 refused queries into one that ran and none into a correct one.

    async with Runtime.open("default") as rt:
        assistant = SQLiteAssistant("recipes/data/shop.sqlite", runtime=rt)
        answer = await assistant.ask("How many customers are there?")
        print(answer.sql, answer.rows)
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio

from pask_agent.errors import ConfigError
from pask_agent.grammars.sql.grammar import compile_sql_grammar
from pask_agent.grammars.sql.schema import SqlSchema
from pask_agent.grammars.sql.span_labels import label_ddl_spans
from pask_agent.grammars.sql.tagger import SqlTagger
from pask_agent.integrations.sql_answer import SqlAnswer, SqlUsage
from pask_agent.integrations.sql_db import QueryResult, ReadOnlyDatabase, SqlExecutionError
from pask_agent.integrations.sql_examples import SqlExample, example_turns, write_examples
from pask_agent.integrations.sql_known import KnownQueries, known_pool
from pask_agent.integrations.sql_prompt import (
    INSTRUCTIONS,
    UNALIASED,
    linked_schema_text,
    quoting_hint,
    read_facts,
    repair_turn,
    unlinked_tables,
    value_hints,
)
from pask_agent.integrations.sql_vote import SqlCandidate, is_empty, result_digest, tally
from pask_agent.policy.registry import get_policy
from pask_agent.runtime.runtime import Runtime

MAX_QUESTION_CHARS = 4000  # a question is a sentence or a paragraph, not a document
# Chosen on the dev split (results/sql_dev_full_k5: voting among the first k of 5 candidates,
# Full KV, bound grammar): k = 1..5 gave 47.7, 47.7, 44.6, 49.2, 49.2 %; the smallest best k.
DEFAULT_CANDIDATES = 4
# Worked examples written from the database (sql_examples.py): off by default. On the dev
# split (results/sql_dev_examples_full, 5 examples) Full KV answered 35 of 65 against 34
# without them, but 3 of the 35 were questions an example had already answered; on the other
# 62 it answered 32 against 34 (5 gained, 7 lost).
DEFAULT_EXAMPLES = 0
DEFAULT_SHOTS = 3  # known queries shown per question, when the user gives some (sql_known.py)
DEFAULT_SCHEMA_TOKENS = 2048  # the sample databases fit whole; BIRD's larger ones are linked
_CHARS_PER_TOKEN = 3.0  # schema text runs 3.3-4 characters per token with the bundled models


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
        How many times a query SQLite refuses is sent back to the model with the error
        (per candidate).
    candidates
        Queries decoded per question (greedy plus ``candidates - 1`` samples at
        ``temperature``/``top_p``, seeds ``seed + i``); the answer is their majority result.
    linking, schema_tokens
        Show sample rows and column values, and on a schema larger than ``schema_tokens``
        (prompt tokens for instructions and schema) only the tables and columns the question
        links to; ``linking=False`` gives the plain DDL prompt of earlier versions.
    label_unlinked
        Label the tables a question does not link to (by name, by value, or as the join of
        two that it does) ``unlinked_schema`` in that question's prompt, so a policy that
        reads labels releases them before any other schema text (``sql_prompt.unlinked_tables``;
        needs ``linking``). ``False`` labels every table by its own structure alone.
    bind_columns
        Keep each column with its table in the grammar (``grammar.py``): a query over one
        table names only its columns, and ``table.col`` only that table's. ``False`` gives
        the unbound grammar of earlier versions, kept to measure what binding changes.
    table_aliases
        ``False`` (default) has the model write ``table.column`` instead of aliasing tables,
        and the grammar then binds every qualified column to its table, joins included
        (``grammar.py``). Chosen on the dev split (``results/sql_dev_unaliased2``): the same
        Full-KV accuracy as with aliases (32 of 65 both), 28 candidates SQLite refused for a
        misplaced column instead of 72 of 325, and PASK at B = 0.33 one question behind Full
        KV. ``True`` allows ``FROM customers AS T1`` as earlier versions did.
    examples
        How many worked examples (question, query) written from the database's own schema
        and data precede the question (``sql_examples.py``); 0 for none.
    known_queries, shots
        Question/query pairs you have checked on this database (``SqlExample``); before each
        question the model sees the ``shots`` whose questions read most like it
        (``sql_known.py``). Each must run read-only, or ``ConfigError`` names it.

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
        candidates: int = DEFAULT_CANDIDATES,
        temperature: float = 0.7,
        top_p: float = 0.95,
        seed: int = 0,
        linking: bool = True,
        label_unlinked: bool = True,
        schema_tokens: int = DEFAULT_SCHEMA_TOKENS,
        bind_columns: bool = True,
        table_aliases: bool = False,
        examples: int = DEFAULT_EXAMPLES,
        known_queries: Sequence[SqlExample] = (),
        shots: int = DEFAULT_SHOTS,
    ) -> None:
        if repairs < 0:
            raise ConfigError(f"repairs must be >= 0, got {repairs}")
        if candidates < 1:
            raise ConfigError(f"candidates must be >= 1, got {candidates}")
        if temperature <= 0 or not 0 < top_p <= 1:
            raise ConfigError("need temperature > 0 and 0 < top_p <= 1 for the sampled candidates")
        if examples < 0:
            raise ConfigError(f"examples must be >= 0, got {examples}")
        if shots < 0:
            raise ConfigError(f"shots must be >= 0, got {shots}")
        if schema_tokens < 64:
            raise ConfigError(f"schema_tokens must be >= 64, got {schema_tokens}")
        self.path = Path(path)
        self.db = ReadOnlyDatabase(self.path, time_limit_s=time_limit_s, row_limit=row_limit)
        self.schema = SqlSchema.from_sqlite(self.path)
        self.grammar = compile_sql_grammar(
            self.schema, bind_columns=bind_columns, table_aliases=table_aliases
        )
        self.table_aliases = table_aliases
        self.runtime = runtime
        self.linking = linking
        self.label_unlinked = label_unlinked
        self.schema_tokens = schema_tokens
        self._facts = read_facts(self.schema, self.db) if linking or examples else ()
        self.examples = write_examples(self._facts, self.db, examples) if examples else ()
        self.known_queries = self.known(known_queries)
        self.shots = shots
        # The whole schema's prompt; with linking on, a large schema's questions each get their
        # own (``system_prompt_for``).
        self.system_prompt = self.system_prompt_for("")
        self.model = model
        self.max_new_tokens = max_new_tokens
        self.repairs = repairs
        self.candidates = candidates
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        shown = "".join(f"\n{e.question}\n{e.sql}" for e in self.examples)
        digest = hashlib.sha256(f"{self.path.resolve()}\n{self.system_prompt}{shown}".encode())
        self._conversation_prefix = f"sql-{digest.hexdigest()[:24]}"
        self._busy: set[str] = set()

    def _count_tokens(self, text: str) -> int:
        if self.runtime is not None:
            return len(self.runtime.tokenizer(text, add_special_tokens=False)["input_ids"])
        return math.ceil(len(text) / _CHARS_PER_TOKEN)  # no tokenizer at hand: an upper bound

    def system_prompt_for(self, question: str) -> str:
        """The system prompt for ``question``: instructions and the (linked) schema.

        With ``linking`` off this is the plain prompt: DDL and four example values of each
        non-unique text column, the same for every question. With it on, each table comes
        with sample rows and its short text columns' values, within ``schema_tokens``; a
        schema larger than that shows only what the question links to (``sql_prompt.py``).
        """
        unaliased = "" if self.table_aliases else UNALIASED
        head = f"{INSTRUCTIONS}{unaliased}{quoting_hint(self.schema)}\n\n"
        if not self.linking:
            return f"{head}{self.schema.ddl()}\n{value_hints(self.schema, self.db)}"
        budget = self.schema_tokens - self._count_tokens(head)
        return head + linked_schema_text(self._facts, question, budget, self._count_tokens)

    def known(self, examples: Sequence[SqlExample]) -> KnownQueries:
        """A pool of checked question/query pairs for this database (``sql_known.known_pool``).

        Raises
        ------
        ConfigError
            A pair is not an ``SqlExample``, is empty, or its query does not run here.
        """
        return known_pool(examples, self.db, table_aliases=self.table_aliases)

    def shown_examples(
        self, question: str, known_queries: KnownQueries | None = None
    ) -> tuple[SqlExample, ...]:
        """The worked examples and the nearest known queries shown before ``question``."""
        known = self.known_queries if known_queries is None else known_queries
        return (*self.examples, *known.nearest(question.strip(), self.shots))

    def messages(
        self, question: str, known_queries: KnownQueries | None = None
    ) -> list[dict[str, str]]:
        """The chat messages for a question (the schema prompt first, so its KV is reused);
        ``known_queries`` stands in for the assistant's pool for this question only."""
        return [
            {"role": "system", "content": self.system_prompt_for(question.strip())},
            *example_turns(self.shown_examples(question, known_queries)),
            {"role": "user", "content": question.strip()},
        ]

    def label_spans(self, text: str, question: str = "") -> list[Any]:
        """Prompt span labels: the DDL's tables, columns, types and constraints (App. A.3);
        with ``label_unlinked``, the blocks of the tables ``question`` does not link to are
        ``unlinked_schema``, what a budget releases first."""
        return label_ddl_spans(text, self.schema, unlinked=self.unlinked_for(question))

    def unlinked_for(self, question: str) -> frozenset[str]:
        """The tables labelled ``unlinked_schema`` in ``question``'s prompt (none without
        ``label_unlinked`` or ``linking``)."""
        if not (self.label_unlinked and self._facts and question.strip()):
            return frozenset()
        return unlinked_tables(self._facts, question.strip())

    async def ask(
        self,
        question: str,
        *,
        policy: str | None = None,
        budget: float | None = None,
        candidates: int | None = None,
        known_queries: KnownQueries | None = None,
    ) -> SqlAnswer:
        """Write candidate queries for ``question``, run them, answer with the majority result.

        ``candidates`` (default: the assistant's) queries are decoded in one batch: greedy plus
        seeded samples, all under the schema's grammar. Each runs read-only under the time and
        row limits; a refused one goes back to the model with SQLite's message, up to
        ``repairs`` times, on its own conversation. The answer is the result set most
        candidates return (``sql_vote.py``). ``known_queries`` replaces the assistant's pool
        for this question (a benchmark leaves the question's own pair out this way).

        Raises
        ------
        ConfigError
            The question is empty or longer than ``MAX_QUESTION_CHARS``, or ``candidates`` < 1.
        """
        if not question or not question.strip():
            raise ConfigError("the question is empty; ask something about the database")
        if len(question) > MAX_QUESTION_CHARS:
            raise ConfigError(
                f"the question has {len(question)} characters; at most {MAX_QUESTION_CHARS} "
                "are accepted (put long context in the database, not the question)"
            )
        k = self.candidates if candidates is None else candidates
        if k < 1:
            raise ConfigError(f"candidates must be >= 1, got {k}")
        start = time.perf_counter()
        messages = self.messages(question, known_queries)
        outcomes: list[Any] = [None] * k

        async def run(i: int) -> None:
            outcomes[i] = await self._candidate(i, question, messages, policy, budget)

        try:
            async with anyio.create_task_group() as tg:  # submitted together: one decode batch
                for i in range(k):
                    tg.start_soon(run, i)
        except BaseExceptionGroup as group:  # a request's own typed error, not a group of them
            raise group.exceptions[0] from group
        votes, best = tally([c.digest for c, _ in outcomes], [c.empty for c, _ in outcomes])
        chosen = [replace(c, votes=v) for (c, _), v in zip(outcomes, votes, strict=True)]
        usage = SqlUsage.of([c.usage for c in chosen], time.perf_counter() - start)
        if best is None:
            c = chosen[0]
            return SqlAnswer(
                question, c.sql, (), (), False, c.error, usage, tuple(chosen), c.failed
            )
        c, rows = chosen[best], outcomes[best][1]
        return SqlAnswer(
            question, c.sql, rows.columns, rows.rows, rows.truncated, None, usage,
            tuple(chosen), c.failed,
        )  # fmt: skip

    async def complete(
        self, question: str, *, policy: str | None = None, budget: float | None = None
    ) -> Any:
        """One greedy query for ``question`` under the schema's grammar, not run: the runtime's
        ``ChatResult`` (text, token ids, usage). What ``pask-agent traces record --sql``
        stores; ``ask`` is the call that answers questions."""
        if not question or not question.strip():
            raise ConfigError("the question is empty; ask something about the database")
        return await self._complete(question, self.messages(question), policy, budget, 0, None)

    async def _candidate(
        self,
        i: int,
        question: str,
        messages: list[dict[str, str]],
        policy: str | None,
        budget: float | None,
    ) -> tuple[SqlCandidate, QueryResult | None]:
        """Decode candidate ``i`` (0 greedy, else seeded sampling), run it, repair if asked."""
        seed = None if i == 0 else self.seed + i
        failed: list[tuple[str, str]] = []
        while True:
            result = await self._complete(question, messages, policy, budget, i, seed)
            sql = result.text.strip()
            try:
                rows = await anyio.to_thread.run_sync(self.db.query, sql)
            except SqlExecutionError as exc:
                if len(failed) == self.repairs:
                    cand = SqlCandidate(sql, None, 0, str(exc), seed, result.usage, tuple(failed))
                    return cand, None
                failed.append((sql, str(exc)))
                messages = [*messages, *repair_turn(sql, str(exc))]
                continue
            cand = SqlCandidate(
                sql, result_digest(rows), 0, None, seed, result.usage, tuple(failed), is_empty(rows)
            )
            return cand, rows

    async def _complete(
        self,
        question: str,
        messages: list[dict[str, str]],
        policy: str | None,
        budget: float | None,
        slot: int,
        seed: int | None,
    ) -> Any:
        args = (question, messages, policy, budget, slot, seed)
        if self.runtime is not None:
            return await self._generate(self.runtime, *args)
        from pask_agent.integrations._portal import runtime_registry

        host = runtime_registry().host(self.model)
        return await host.acall(lambda rt: self._generate(rt, *args))

    async def _generate(
        self,
        rt: Runtime,
        question: str,
        messages: list[dict[str, str]],
        policy: str | None,
        budget: float | None,
        slot: int,
        seed: int | None,
    ) -> Any:
        spec = rt.outputs.ebnf(
            "sql", self.grammar, new_tagger=lambda: SqlTagger(self.schema), payload=self.schema
        )
        # Questions share the schema prompt; one conversation per (policy, budget, candidate
        # slot) lets each candidate reuse its KV prefix (a conversation keeps the policy of its
        # first turn). Under a policy that reads labels the schema's labels must match as
        # well: a table one question released as unlinked is gone for one that links it.
        chosen = rt.default_policy if policy is None else get_policy(policy)
        labelled = chosen.needs_labels
        labels = ",".join(sorted(self.unlinked_for(question))) if labelled else ""
        key = f"{self._conversation_prefix}-{policy}-{budget}-{slot}-{labels}"
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
                temperature=0.0 if seed is None else self.temperature,
                top_p=self.top_p,
                seed=seed,
                conversation=conversation,
                label_spans=lambda text: self.label_spans(text, question),
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
