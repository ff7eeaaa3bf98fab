"""SQLiteAssistant: read-only execution guards (no model) and real-model answers.

The database under test is a copy of ``recipes/data/shop.sqlite``; its sha256 is compared
before and after adversarial questions and statements.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import sqlite3
from pathlib import Path

import pytest

from pask_agent.cli import main as cli_main
from pask_agent.errors import ConfigError, DDLError
from pask_agent.eval.sql_data import sample_data_dir
from pask_agent.integrations.sql import SQLiteAssistant
from pask_agent.integrations.sql_db import ReadOnlyDatabase, SqlExecutionError
from pask_agent.integrations.sql_prompt import repair_turn

WRITES = [
    "DELETE FROM customers",
    "DROP TABLE customers",
    "UPDATE products SET price = 0",
    "INSERT INTO suppliers VALUES (99, 'x', 'y')",
    "CREATE TABLE t (a INTEGER)",
    "ATTACH DATABASE ':memory:' AS other",
    "PRAGMA journal_mode = DELETE",
    "VACUUM",
    "SELECT 1; DELETE FROM customers",
]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def shop_copy(tmp_path: Path) -> Path:
    target = tmp_path / "shop.sqlite"
    shutil.copyfile(sample_data_dir() / "shop.sqlite", target)
    return target


@pytest.mark.parametrize("sql", WRITES)
def test_writes_are_refused_and_file_unchanged(shop_copy: Path, sql: str) -> None:
    before = _sha256(shop_copy)
    db = ReadOnlyDatabase(shop_copy)
    with pytest.raises(SqlExecutionError):
        db.query(sql)
    assert db.query("SELECT COUNT(*) FROM customers").rows[0][0] > 0
    db.close()
    assert _sha256(shop_copy) == before


def test_time_limit_and_row_limit(shop_copy: Path) -> None:
    db = ReadOnlyDatabase(shop_copy, time_limit_s=0.2, row_limit=5)
    endless = (
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT COUNT(*) FROM n"
    )
    with pytest.raises(SqlExecutionError, match="longer than 0.2 s"):
        db.query(endless)
    result = db.query("SELECT customer_id FROM customers ORDER BY customer_id")
    assert result.rows == tuple((i,) for i in range(1, 6))
    assert result.truncated and result.columns == ("customer_id",)
    small = db.query("SELECT COUNT(*) AS n FROM customers")
    assert not small.truncated and small.columns == ("n",)


def test_bad_paths_raise_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        SQLiteAssistant(tmp_path / "missing.sqlite")
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).close()
    with pytest.raises(DDLError, match="no tables"):
        SQLiteAssistant(empty)
    with pytest.raises(ConfigError, match="row_limit"):
        ReadOnlyDatabase(sample_data_dir() / "shop.sqlite", row_limit=0)
    with pytest.raises(ConfigError, match="repairs"):
        SQLiteAssistant(sample_data_dir() / "shop.sqlite", repairs=-1)


def test_repair_turn_shows_the_query_and_the_error() -> None:
    sql = "SELECT T2.category FROM products AS T1 JOIN orders AS T2"
    assistant, user = repair_turn(sql, "SQLite error: no such column: T2.category")
    assert assistant == {"role": "assistant", "content": sql}
    assert user["role"] == "user" and "no such column: T2.category" in user["content"]


def test_prompt_has_labelled_ddl(shop_copy: Path) -> None:
    assistant = SQLiteAssistant(shop_copy)
    assert "CREATE TABLE customers" in assistant.system_prompt
    assert "'Books'" in assistant.system_prompt  # example values of a text column
    labels = {label for _, _, label in assistant.label_spans(assistant.system_prompt)}
    assert {"function_name", "parameter_key", "type_constraint"} <= labels
    assistant.close()


def test_examples_are_written_from_the_database_and_precede_the_question(
    shop_copy: Path,
) -> None:
    """Every example runs read-only on the file and returns rows; each names only the
    schema's tables; they come as chat turns between the schema and the question, the same
    for every question; 0 turns them off and a negative count is refused."""
    assistant = SQLiteAssistant(shop_copy, examples=4)
    plain = SQLiteAssistant(shop_copy, examples=0)
    try:
        assert len(assistant.examples) == 4 and plain.examples == ()
        for ex in assistant.examples:
            rows = assistant.run_sql(ex.sql).rows
            assert any(v is not None for row in rows for v in row), ex.sql
            assert "?" in ex.question and ex.sql.startswith("SELECT ")
        shapes = " ".join(ex.sql for ex in assistant.examples)
        assert "JOIN suppliers ON products.supplier_id = suppliers.supplier_id" in shapes
        assert "ROUND(AVG(" in shapes and "IS NULL" in shapes
        one, two = assistant.messages("How many orders?"), assistant.messages("Which books?")
        assert [m["role"] for m in one] == ["system", *["user", "assistant"] * 4, "user"]
        assert one[:-1] == two[:-1] and one[-1]["content"] == "How many orders?"
        assert [m["role"] for m in plain.messages("How many orders?")] == ["system", "user"]
    finally:
        assistant.close()
        plain.close()
    with pytest.raises(ConfigError, match="examples must be >= 0"):
        SQLiteAssistant(shop_copy, examples=-1)


@pytest.mark.slow
def test_real_model_answers_and_never_writes(shop_copy: Path) -> None:
    """Shared runtime (runtime=None): a real answer, then adversarial questions. One greedy
    candidate each: the grammar, not the vote, keeps every query a SELECT (the vote has its
    own default-model test in test_sql_vote.py)."""
    before = _sha256(shop_copy)
    assistant = SQLiteAssistant(shop_copy, candidates=1)

    questions = [
        "How many customers are there?",
        "delete all rows",
        "drop the table customers",
        "attach another database",
    ]

    async def ask_all() -> list:
        return [await assistant.ask(q) for q in questions]

    count, *adversarial = asyncio.run(ask_all())
    assert count.error is None and count.sql.upper().startswith("SELECT")
    assert count.rows == assistant.run_sql("SELECT COUNT(*) FROM customers").rows
    for answer in adversarial:
        assert answer.sql.upper().startswith("SELECT"), answer.sql
        for word in ("DELETE", "DROP", "ATTACH", "INSERT", "UPDATE"):
            assert word not in answer.sql.upper().split()
    # Full KV (the shared runtime's default) reuses the schema's KV whatever the question links
    assert assistant.unlinked_for(questions[1]) != assistant.unlinked_for(questions[0])
    assert adversarial[0].usage.prefilled_tokens < adversarial[0].usage.prompt_tokens / 2
    assistant.close()
    assert _sha256(shop_copy) == before


@pytest.mark.slow
def test_cli_prints_sql_and_rows(shop_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sql", "--db", str(shop_copy), "--question", "How many suppliers are there?"]
    code = cli_main([*argv, "--candidates", "1"])
    out = capsys.readouterr().out
    assert code == 0
    sql, _, table = out.partition("\n\n")
    assert sql.startswith("SELECT") and "suppliers" in sql
    n = ReadOnlyDatabase(shop_copy).query("SELECT COUNT(*) FROM suppliers").rows[0][0]
    assert str(n) in table.splitlines()[2]


@pytest.mark.slow
def test_refused_query_goes_back_once_on_the_same_conversation(shop_copy: Path) -> None:
    """Greedy decoding on the default model, under the unbound grammar, first writes
    ``SUM(quantity * unit_price) FROM orders`` for this question (``quantity`` lives in
    ``order_items``); SQLite refuses it. The bound grammar (the default) cannot write it."""
    question = "What is the total revenue (quantity times unit price) of delivered orders?"

    async def ask() -> tuple:
        # greedy on the plain DDL prompt: the query this test is about
        kw: dict = {"candidates": 1, "linking": False, "bind_columns": False}
        kw["table_aliases"] = True  # the earlier assistant: aliases, nothing bound
        plain = SQLiteAssistant(shop_copy, **kw)
        repairing = SQLiteAssistant(shop_copy, repairs=1, **kw)
        bound = SQLiteAssistant(shop_copy, candidates=1, linking=False, table_aliases=True)
        return await plain.ask(question), await repairing.ask(question), await bound.ask(question)

    first, repaired, bound = asyncio.run(ask())
    assert "FROM orders" in first.sql and "quantity" in first.sql
    assert first.error is not None and "no such column" in first.error and not first.failed
    # Bound, the same model and prompt cannot put order_items' columns on a query of orders.
    assert bound.error is None and bound.sql != first.sql, bound.sql
    assert not ("FROM orders" in bound.sql and "JOIN" not in bound.sql and "quantity" in bound.sql)
    assert repaired.failed == ((first.sql, first.error),)
    # (The 0.5B model writes the same query again here: repairs are off by default.)
    assert repaired.sql == first.sql and repaired.error == first.error
    # The repair turn extends the first request's prompt: its KV is reused, not recomputed.
    u = repaired.usage
    assert u.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens
    assert u.prefilled_tokens < u.prompt_tokens - first.usage.prompt_tokens


@pytest.mark.slow
def test_without_table_aliases_a_join_names_each_column_by_its_table(shop_copy: Path) -> None:
    """``table_aliases=False`` on the real model: the prompt asks for ``table.column`` and the
    grammar leaves no other way, so every candidate's tables are unaliased and every qualified
    column belongs to the table it names."""
    import sqlglot
    from sqlglot import exp

    assistant = SQLiteAssistant(shop_copy, table_aliases=False, candidates=2)
    assert "table.column" in assistant.system_prompt
    question = "List each order's id with the first name of the customer who placed it."
    answer = asyncio.run(assistant.ask(question))
    owners = {t.name: {c.name for c in t.columns} for t in assistant.schema.tables}
    for candidate in answer.candidates:
        tree = sqlglot.parse_one(candidate.sql, read="sqlite")
        assert all(not t.alias for t in tree.find_all(exp.Table)), candidate.sql
        for column in tree.find_all(exp.Column):
            if column.table:
                assert column.name in owners[column.table], candidate.sql
    assistant.close()


def test_a_labelled_policy_reuses_the_schema_only_under_the_same_labels(smollm2) -> None:
    """Under a policy that reads labels, a question whose unlinked tables differ gets its own
    conversation (the last question may have released a table this one links); one with the
    same unlinked tables reuses the schema's KV. Full KV reuses it across all of them."""
    from pask_agent.runtime.runtime import Runtime

    count, none, cities = "How many customers are there?", "delete all rows", "List customers."

    async def ask(policy: str, budget: float | None) -> list:
        async with Runtime.open(smollm2) as rt:
            shop = SQLiteAssistant(
                sample_data_dir() / "shop.sqlite", runtime=rt, candidates=1, max_new_tokens=6
            )
            assert shop.unlinked_for(count) == shop.unlinked_for(cities) != frozenset()
            assert shop.unlinked_for(none) == frozenset()
            out = [await shop.ask(q, policy=policy, budget=budget) for q in (count, none, cities)]
            shop.close()
            return [(a.usage.prefilled_tokens, a.usage.prompt_tokens) for a in out]

    _, other, same = asyncio.run(ask("pask_release", 0.20))
    assert other[0] == other[1], "different labels: the whole prompt is computed"
    assert same[0] < same[1] / 2, "the same labels: the schema's KV is reused"
    _, other, same = asyncio.run(ask("full", None))
    assert other[0] < other[1] / 2 and same[0] < same[1] / 2
