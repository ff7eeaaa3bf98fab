"""Record BFCL cases as calibration traces at Full KV (``pask-agent traces record``).

Calibration replays what the model actually wrote under the reference cache, so the recorder
serves every case of one split partition at Full KV, in the runtime's default output format,
and stores the output ids with a ``reference`` the BFCL checker can score again and ``ok``,
its verdict on this output.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from pask_agent.errors import ConfigError
from pask_agent.eval.bfcl import NON_LIVE_CATEGORIES, BfclCase, ast_check
from pask_agent.eval.harness import run_ordered
from pask_agent.eval.splits import cases_in
from pask_agent.eval.sql_data import SqlQuestion, SqlQuestionSet
from pask_agent.record.traces import Trace, messages_json, write_traces

ALIASES = {"simple": "simple_python"}


def bfcl_categories(text: str) -> list[str]:
    """Parse ``simple,multiple,...`` (``simple`` means ``simple_python``).

    Raises
    ------
    ConfigError
        An unknown or empty category list.
    """
    names = [ALIASES.get(c.strip(), c.strip()) for c in text.split(",") if c.strip()]
    bad = [c for c in names if c not in NON_LIVE_CATEGORIES]
    if not names or bad:
        raise ConfigError(
            f"unknown BFCL categories {bad or text!r}; use any of simple, multiple, parallel, "
            "parallel_multiple"
        )
    return names


def case_trace(case: BfclCase, request: dict[str, Any], result: Any, model: Any) -> Trace:
    """One served BFCL case as a trace: its output ids, the checker's verdict and a reference
    to score a replayed output against."""
    calls = [{"name": c.name, "arguments": c.arguments} for c in result.tool_calls]
    ok = bool(calls) and result.finish_reason == "tool_calls" and ast_check(case, calls)
    return Trace(
        messages=tuple(messages_json(request["messages"])),
        output=result.text,
        output_token_ids=tuple(result.token_ids),
        model=model,
        tools=tuple(t.to_openai() for t in request["tools"]),
        tool_choice=request["tool_choice"],
        parallel_tool_calls=request["parallel_tool_calls"],
        ok=ok,
        reference={"checker": "bfcl_ast", "case_id": case.id, "category": case.category},
        id=case.id,
    )


async def record_cases(
    rt: Any, cases: Sequence[BfclCase], *, max_new_tokens: int = 200
) -> list[Trace]:
    """Serve ``cases`` at Full KV together (the runtime batches) and return their traces."""

    async def one(case: BfclCase) -> Trace:
        request = case.request()
        result = await rt.chat(**request, policy="full", max_new_tokens=max_new_tokens)
        return case_trace(case, request, result, rt.model_id)

    return await run_ordered(cases, one)


def record_bfcl(
    categories: Sequence[str],
    split: str,
    out: Path,
    *,
    model: str = "default",
    per_category: int | None = None,
    max_new_tokens: int = 200,
) -> list[Trace]:
    """Record one partition of the fixed split and write ``out`` (replacing it)."""

    cases = cases_in(split, per_category=per_category, categories=categories)
    return _record_and_write(
        model, len(cases), lambda rt: record_cases(rt, cases, max_new_tokens=max_new_tokens), out
    )


def _record_and_write(model: str, requests: int, record: Any, out: Path) -> list[Trace]:
    """Open a Full-KV runtime sized for ``requests`` at once, ``await record(rt)``, write."""
    from pask_agent.runtime.config import RuntimeConfig
    from pask_agent.runtime.runtime import Runtime

    async def main() -> list[Trace]:
        config = RuntimeConfig(max_batch=max(16, min(requests, 64)))
        async with Runtime.open(model, config=config) as rt:
            return await record(rt)

    traces = anyio.run(main)
    write_traces(out, traces)
    return traces


async def record_sql(
    rt: Any, questions: SqlQuestionSet, *, max_new_tokens: int = 160
) -> list[Trace]:
    """Serve every question of ``questions`` (a ``SqlQuestionSet``) at Full KV through the SQL
    assistant's own prompt and grammar; each trace's ``ok`` is execution accuracy against the
    gold query and its ``reference`` says how to score a replayed output again."""
    from pask_agent.eval.sql_scoring import gold_orders, results_match
    from pask_agent.integrations.sql import SQLiteAssistant
    from pask_agent.integrations.sql_db import SqlExecutionError

    assistants = {
        db: SQLiteAssistant(path, runtime=rt, candidates=1, max_new_tokens=max_new_tokens)
        for db, path in questions.databases
    }

    async def one(q: SqlQuestion) -> Trace:
        assistant = assistants[q.db]
        result = await assistant.complete(q.question, policy="full")
        try:
            predicted = assistant.run_sql(result.text.strip())
            gold = assistant.run_sql(q.gold_sql)
            ok = results_match(predicted, gold, ordered=gold_orders(q.gold_sql))
        except SqlExecutionError:
            ok = False
        return Trace(
            messages=tuple(messages_json(assistant.messages(q.question))),
            output=result.text,
            output_token_ids=tuple(result.token_ids),
            model=rt.model_id,
            sql_schema=assistant.schema.ddl(),
            tool_choice="none",
            parallel_tool_calls=False,
            ok=ok and result.finish_reason != "length",
            reference={
                "checker": "sql_exec",
                "db": q.db,
                "gold_sql": q.gold_sql,
                "category": q.difficulty,
            },  # fmt: skip
            id=q.id,
        )

    try:
        return await run_ordered(questions.questions, one)
    finally:
        for assistant in assistants.values():
            assistant.close()


def record_sql_split(
    split: str,
    out: Path,
    *,
    model: str = "default",
    limit: int | None = None,
    max_new_tokens: int = 160,
) -> list[Trace]:
    """Record the project's SQL questions of one split (``dev`` or ``test``) and write ``out``.

    Raises
    ------
    ConfigError
        A split the SQL questions do not have (they are split dev/test only).
    """
    from pask_agent.eval.sql_data import SPLITS, load_sample_questions

    if split not in SPLITS:
        raise ConfigError(
            f"the SQL questions have splits {', '.join(SPLITS)}, not {split!r} "
            "(record development traces with --split dev)"
        )
    data = load_sample_questions(split=split)
    if limit is not None:
        data = SqlQuestionSet(data.questions[:limit], data.databases)
    return _record_and_write(
        model, len(data.questions), lambda rt: record_sql(rt, data, max_new_tokens=max_new_tokens),
        out,
    )  # fmt: skip
