"""Known queries: the nearest checked question/SQL pairs, shown before the question.

No model for most tests: selection, the alias rewrite and the checks run on the sample
databases (real SQLite). The last test asks the bundled default model.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import anyio
import pytest

from pask_agent.cli import main as cli_main
from pask_agent.errors import ConfigError
from pask_agent.eval.sql_data import load_sample_questions, sample_data_dir
from pask_agent.eval.sql_eval import known_pool
from pask_agent.eval.sql_eval import main as sql_eval_main
from pask_agent.integrations.sql import SQLiteAssistant
from pask_agent.integrations.sql_examples import SqlExample
from pask_agent.integrations.sql_known import (
    KnownQueries,
    load_known_queries,
    without_table_aliases,
)
from pask_agent.runtime.runtime import Runtime

POOL = [
    SqlExample("How many customers are there?", "SELECT COUNT(*) FROM customers"),
    SqlExample(
        "What is the average review rating of each product category?",
        "SELECT T1.category, ROUND(AVG(T2.rating), 2) FROM products AS T1 INNER JOIN reviews "
        "AS T2 ON T1.product_id = T2.product_id GROUP BY T1.category",
    ),
    SqlExample(
        "Which suppliers are based in Germany?",
        "SELECT name FROM suppliers WHERE country = 'Germany'",
    ),
    SqlExample(
        "Which products cost more than the average price of their own category?",
        "SELECT name FROM products AS p WHERE price > (SELECT AVG(price) FROM products "
        "WHERE category = p.category)",
    ),
]  # fmt: skip


@pytest.fixture()
def shop(tmp_path: Path) -> Path:
    target = tmp_path / "shop.sqlite"
    shutil.copyfile(sample_data_dir() / "shop.sqlite", target)
    return target


def test_nearest_ranks_by_the_words_that_tell_questions_apart() -> None:
    pool = KnownQueries.of(POOL)
    near = pool.nearest("Which suppliers are based in France?", 2)
    assert len(near) == 2 and near[-1] is POOL[2]  # most alike last, next to the question
    assert pool.nearest("What is the average rating per category?", 1) == (POOL[1],)
    assert pool.nearest("anything", 0) == () and KnownQueries.of([]).nearest("x", 3) == ()


def test_aliases_are_replaced_by_table_names_or_the_query_is_refused() -> None:
    joined = without_table_aliases(POOL[1].sql)
    assert joined == (
        "SELECT products.category, ROUND(AVG(reviews.rating), 2) FROM products INNER JOIN "
        "reviews ON products.product_id = reviews.product_id GROUP BY products.category"
    )
    assert without_table_aliases(POOL[0].sql) == POOL[0].sql  # nothing to rewrite
    assert without_table_aliases(POOL[3].sql) is None  # products read twice: needs its alias
    derived = (
        "SELECT AVG(T2.n) FROM customers AS T1 JOIN (SELECT customer_id, COUNT(*) AS n "
        "FROM orders GROUP BY customer_id) AS T2 ON T1.customer_id = T2.customer_id"
    )
    assert without_table_aliases(derived) is None  # a derived table's columns need T2
    assert without_table_aliases("SELECT FROM WHERE (") is None


def test_assistant_shows_rewritten_pairs_that_return_the_same_rows(shop: Path) -> None:
    """Under the default (unaliased) grammar the aliased pair is shown by table names and
    returns what it did; the self-referencing one is kept out and listed; the nearest pairs
    come as chat turns between the schema and the question, nearest last."""
    assistant = SQLiteAssistant(shop, known_queries=POOL, shots=2)
    aliased = SQLiteAssistant(shop, known_queries=POOL, table_aliases=True)
    try:
        known = assistant.known_queries
        assert [e.question for e in known.unshown] == [POOL[3].question]
        rewritten = [e for e in known.examples if e.question == POOL[1].question][0]
        assert " AS T" not in rewritten.sql
        assert sorted(assistant.run_sql(rewritten.sql).rows) == sorted(
            assistant.run_sql(POOL[1].sql).rows
        )
        assert len(aliased.known_queries.examples) == 4  # shown as written
        messages = assistant.messages("Which suppliers are based in Italy?")
        assert [m["role"] for m in messages] == ["system", *["user", "assistant"] * 2, "user"]
        assert messages[3:5] == [
            {"role": "user", "content": POOL[2].question},
            {"role": "assistant", "content": POOL[2].sql},
        ]
        other = assistant.known([POOL[0]])  # a per-question pool replaces the assistant's
        assert assistant.messages("How many suppliers?", other)[1]["content"] == POOL[0].question
        none = SQLiteAssistant(shop, known_queries=POOL, shots=0)
        assert [m["role"] for m in none.messages("How many orders?")] == ["system", "user"]
        none.close()
    finally:
        assistant.close()
        aliased.close()


def test_bad_known_queries_are_refused_with_what_to_fix(shop: Path) -> None:
    with pytest.raises(ConfigError, match=r"known_queries\[0\].*does not run"):
        SQLiteAssistant(shop, known_queries=[SqlExample("q?", "SELECT nope FROM customers")])
    with pytest.raises(ConfigError, match=r"known_queries\[0\].*does not run"):
        SQLiteAssistant(shop, known_queries=[SqlExample("wipe", "DELETE FROM customers")])
    with pytest.raises(ConfigError, match=r"known_queries\[1\] has an empty"):
        SQLiteAssistant(shop, known_queries=[POOL[0], SqlExample(" ", "SELECT 1")])
    with pytest.raises(ConfigError, match="pass SqlExample"):
        SQLiteAssistant(shop, known_queries=[("q?", "SELECT 1")])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="shots must be >= 0"):
        SQLiteAssistant(shop, shots=-1)


def test_benchmark_pool_is_the_same_database_without_the_question() -> None:
    dev = load_sample_questions(split="dev")
    q = dev.questions[0]
    pool = KnownQueries.of(known_pool(dev, q.db))
    same_db = [k for k in dev.questions if k.db == q.db]
    assert len(pool.examples) == len(same_db)
    left = pool.leaving_out(q.question)
    assert len(left.examples) == len(same_db) - 1
    assert q.question not in {e.question for e in left.examples}
    assert q.question not in {e.question for e in left.nearest(q.question, 20)}
    assert known_pool(None, q.db) == []


def test_sql_eval_refuses_shots_without_a_pool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert sql_eval_main(["--split", "dev", "--shots", "3", "--out", str(out)]) == 2
    assert "--known-queries" in capsys.readouterr().err
    args = ["--split", "dev", "--known-queries", "dev", "--shots", "0", "--out", str(out)]
    assert sql_eval_main(args) == 2
    assert not out.exists()


@pytest.mark.slow
def test_default_model_copies_the_shape_of_a_near_known_query(default_model: Any) -> None:
    """A convention the question does not spell out (a share as a percentage to one
    decimal, through ``CASE``) is taken from the nearest known query for another value.
    Without known queries the model answered ``SELECT SUM(stock) FROM products WHERE category
    = 'Kitchen'`` (checked by hand at ``28ffd73``)."""
    known = [
        *POOL[:3],
        SqlExample(
            "What share of the products are in the Books category?",
            "SELECT ROUND(100.0 * SUM(CASE WHEN category = 'Books' THEN 1 ELSE 0 END) "
            "/ COUNT(*), 1) FROM products",
        ),
    ]
    gold = (
        "SELECT ROUND(100.0 * SUM(CASE WHEN category = 'Kitchen' THEN 1 ELSE 0 END) "
        "/ COUNT(*), 1) FROM products"
    )

    async def main() -> tuple[Any, Any]:
        async with Runtime.open(default_model) as rt:
            assistant = SQLiteAssistant(  # greedy: the copy is the model's, not the vote's
                sample_data_dir() / "shop.sqlite", runtime=rt, known_queries=known, candidates=1
            )
            try:
                question = "What share of the products are in the Kitchen category?"
                return await assistant.ask(question), assistant.run_sql(gold)
            finally:
                assistant.close()

    answer, expected = anyio.run(main)
    assert answer.error is None and answer.rows == expected.rows, answer.sql
    assert "CASE WHEN" in answer.sql and "'Kitchen'" in answer.sql


def test_known_queries_file_is_read_and_bad_lines_are_named(tmp_path: Path) -> None:
    good = tmp_path / "known.jsonl"
    good.write_text(
        '{"question": "How many customers are there?", "sql": "SELECT COUNT(*) FROM customers"}\n\n'
    )
    assert load_known_queries(good) == [POOL[0]]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q?", "sql": "SELECT 1"}\n{"question": "q?"}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2 needs"):
        load_known_queries(bad)
    bad.write_text("not json\n")
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: not JSON"):
        load_known_queries(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_known_queries(tmp_path / "missing.jsonl")


def test_cli_refuses_a_missing_known_queries_file_before_loading_a_model(
    shop: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.jsonl"
    args = ["sql", "--db", str(shop), "--question", "How many?", "--known", str(missing)]
    assert cli_main(args) != 0
    assert "does not exist" in capsys.readouterr().err


def test_benchmark_with_known_queries_runs_on_smollm2(tmp_path: Path) -> None:
    """``sql_eval --known-queries dev`` on the dev split itself: the run records its shots in
    the configuration and settings, and no question's own gold result is marked as shown."""
    import json

    argv = ["--split", "dev", "--limit", "2", "--model", "smollm2-135m", "--candidates", "1"]
    argv += ["--known-queries", "dev", "--shots", "2", "--out", str(tmp_path / "out")]
    argv += ["--max-new-tokens", "40"]  # the shots' bookkeeping is under test, not the queries
    assert sql_eval_main(argv) == 0
    rows = [json.loads(x) for x in (tmp_path / "out" / "sql_eval.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["config"] == "full k=1 shots=2" for r in rows)
    assert not any(r["example_match"] for r in rows)
    report = json.loads((tmp_path / "out" / "sql_eval.json").read_text())
    assert report["settings"]["known_queries"] == "dev" and report["settings"]["shots"] == 2
