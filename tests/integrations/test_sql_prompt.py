"""Schema linking: sample rows and values in the prompt; on a tight budget, linked tables only.

Runs on the sample databases (real SQLite, no model): what a prompt shows is checked against
the database itself, and a linked prompt must stay within its token budget and still be DDL
that the span labeller accepts as schema.
"""

from __future__ import annotations

import math

import pytest

from pask_agent.errors import ConfigError
from pask_agent.grammars.sql.span_labels import find_ddl_spans
from pask_agent.integrations.sql import SQLiteAssistant
from pask_agent.integrations.sql_db import ReadOnlyDatabase
from pask_agent.integrations.sql_prompt import (
    link_scores,
    linked_schema_text,
    read_facts,
    unlinked_tables,
)
from pask_agent.package_data import sample_data_dir


def tokens(text: str) -> int:
    return math.ceil(len(text) / 3)


@pytest.fixture(scope="module")
def school() -> SQLiteAssistant:
    assistant = SQLiteAssistant(sample_data_dir() / "school.sqlite")
    yield assistant
    assistant.close()


def test_whole_schema_shows_rows_and_every_value_of_short_text_columns() -> None:
    shop = SQLiteAssistant(sample_data_dir() / "shop.sqlite")
    prompt = shop.system_prompt
    assert prompt == shop.system_prompt_for("How many customers live in Germany?")
    for table in shop.schema.table_names:
        assert f"CREATE TABLE {table} (" in prompt and f"example rows from {table}:" in prompt
    categories = sorted(r[0] for r in shop.run_sql("SELECT DISTINCT category FROM products").rows)
    line = next(x for x in prompt.splitlines() if x.startswith("-- products.category"))
    assert sorted(v.strip("'") for v in line.split(": ", 1)[1].split(", ")) == categories
    assert "-- customers.email" not in prompt  # unique values are not shown
    first = shop.run_sql("SELECT * FROM products ORDER BY rowid LIMIT 1").rows[0]
    assert " | ".join(str(v) for v in first) in prompt
    assert len(find_ddl_spans(prompt, shop.schema)) == len(shop.schema.tables)
    plain = SQLiteAssistant(sample_data_dir() / "shop.sqlite", linking=False).system_prompt
    assert "example rows" not in plain and "CREATE TABLE products" in plain
    shop.close()


def test_links_by_value_and_name_within_the_budget(school: SQLiteAssistant) -> None:
    db = ReadOnlyDatabase(sample_data_dir() / "school.sqlite")
    facts = read_facts(school.schema, db)
    city = db.query("SELECT city FROM students LIMIT 1").rows[0][0]
    question = f"How many students live in {city}?"
    scores = link_scores(facts, question)
    assert scores["students"][""] == 1 and scores["students"]["city"] == 2
    assert not any(scores["departments"].values())
    for budget in (250, 400, 700):
        text = linked_schema_text(facts, question, budget, tokens)
        assert tokens(text) <= budget, budget
        assert "CREATE TABLE students (" in text and "city" in text
        assert "CREATE TABLE departments" not in text
        spans = find_ddl_spans(text, school.schema)
        assert len(spans) == text.count("CREATE TABLE")
    db.close()


def test_a_table_that_joins_two_linked_ones_comes_along(school: SQLiteAssistant) -> None:
    db = ReadOnlyDatabase(sample_data_dir() / "school.sqlite")
    facts = read_facts(school.schema, db)
    title = db.query('SELECT "course title" FROM courses LIMIT 1').rows[0][0]
    text = linked_schema_text(facts, f"Which students take {title}?", 450, tokens)
    for table in ("students", "courses", "enrollments"):
        assert f"CREATE TABLE {table} (" in text, table
    assert tokens(text) <= 450
    db.close()


def test_assistant_prompt_follows_the_budget_and_refuses_a_tiny_one() -> None:
    path = sample_data_dir() / "school.sqlite"
    with pytest.raises(ConfigError, match="schema_tokens"):
        SQLiteAssistant(path, schema_tokens=10)
    small = SQLiteAssistant(path, schema_tokens=400)
    question = "List the names of departments in the Science building."
    prompt = small.system_prompt_for(question)
    assert tokens(prompt) <= 400 and "CREATE TABLE departments (" in prompt
    assert small.messages(question)[0]["content"] == prompt
    assert small.system_prompt_for("Which teachers earn most?") != prompt
    small.close()


def test_tables_the_question_does_not_link_are_labelled_unlinked(school: SQLiteAssistant) -> None:
    db = ReadOnlyDatabase(sample_data_dir() / "school.sqlite")
    facts = read_facts(school.schema, db)
    title = db.query('SELECT "course title" FROM courses LIMIT 1').rows[0][0]
    question = f"Which students take {title}?"
    db.close()
    # students by name, courses by value, enrollments joins the two; the rest is unlinked
    unlinked = unlinked_tables(facts, question)
    assert unlinked == frozenset(school.schema.table_names) - {"students", "courses", "enrollments"}
    assert unlinked  # departments and teachers
    text = school.system_prompt_for(question)
    spans = school.label_spans(text, question)
    marked = "".join(text[s:e] for s, e, lab in spans if lab == "unlinked_schema")
    for table in unlinked:
        assert f"CREATE TABLE {table} (" in marked and f"example rows from {table}:" in marked
    for table in ("students", "courses", "enrollments"):
        assert f"CREATE TABLE {table}" not in marked and f"-- {table}." not in marked
    # the linked tables keep their structural labels, exactly as without the question
    plain = school.label_spans(text)
    assert [x for x in spans if x[2] != "unlinked_schema"] == [
        x
        for x in plain
        if not any(s <= x[0] < e for s, e, lab in spans if lab == "unlinked_schema")
    ]
    assert "unlinked_schema" not in {lab for _, _, lab in plain}
    # a question that links nothing leaves every table as it is; so does label_unlinked=False
    assert unlinked_tables(facts, "What is in here?") == frozenset()
    off = SQLiteAssistant(sample_data_dir() / "school.sqlite", label_unlinked=False)
    assert off.label_spans(text, question) == plain
    off.close()
