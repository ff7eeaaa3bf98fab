"""Table-6 prompt labels over SQLite DDL, on real database DDL and a real tokenizer."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from pask_agent.eval.sql_data import sample_data_dir
from pask_agent.grammars.span_labels import CharSpan
from pask_agent.grammars.sql.schema import SqlSchema
from pask_agent.grammars.sql.span_labels import find_ddl_spans, label_ddl_spans, label_ddl_tokens
from pask_agent.runtime.models.loading import load_tokenizer

DATA = sample_data_dir()


@pytest.fixture(scope="module")
def school() -> SqlSchema:
    return SqlSchema.from_sqlite(DATA / "school.sqlite")


def _labelled(text: str, spans: list[CharSpan], label: str) -> list[str]:
    return [text[s:e] for s, e, lab in spans if lab == label]


def test_spans_partition_the_text(school: SqlSchema) -> None:
    text = "Answer with SQL.\n" + school.ddl() + "\nQuestion: how many students?"
    spans = label_ddl_spans(text, school)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert spans[0] == (0, len("Answer with SQL.\n"), "protected_content")
    assert spans[-1][2] == "protected_content"
    assert text[spans[-1][0] :].strip() == "Question: how many students?"


def test_rendered_ddl_labels(school: SqlSchema) -> None:
    text = school.ddl()
    spans = label_ddl_spans(text, school)
    tables = _labelled(text, spans, "function_name")
    assert tables[:3] == ["departments", "teachers", "departments"]  # REFERENCES target too
    assert set(tables) == set(school.table_names)
    keys = _labelled(text, spans, "parameter_key")
    assert "hire date" in keys and "final grade" in keys  # quotes are scaffold
    assert keys.count("dept_id") == 5  # three definitions, two REFERENCES columns
    assert keys[-3:] == ["student_id", "course_id", "term"]  # the composite PRIMARY KEY
    assert set(_labelled(text, spans, "type_constraint")) == {"INTEGER", "TEXT", "DATE", "REAL"}
    assert set(_labelled(text, spans, "enum_constraint")) == {
        "PRIMARY KEY",
        "NOT",
        "NULL",
        "UNIQUE",
        "REFERENCES",
    }
    scaffold = "".join(_labelled(text, spans, "schema_scaffold"))
    assert "CREATE TABLE" in scaffold and '"' in scaffold and ");" in scaffold
    assert not _labelled(text, spans, "protected_content") or all(
        part.strip() == "" for part in _labelled(text, spans, "protected_content")
    )


def test_original_sqlite_ddl_with_defaults_and_table_constraints() -> None:
    shop = SqlSchema.from_sqlite(DATA / "shop.sqlite")
    con = sqlite3.connect(f"{(DATA / 'shop.sqlite').as_uri()}?mode=ro", uri=True)
    text = (
        ";\n".join(
            r[0]
            for r in con.execute(
                "SELECT sql FROM sqlite_master WHERE type = 'table' ORDER BY rowid"
            )
        )
        + ";"
    )
    con.close()
    assert len(find_ddl_spans(text, shop)) == len(shop.tables)
    spans = label_ddl_spans(text, shop)
    enums = _labelled(text, spans, "enum_constraint")
    assert "DEFAULT" in enums and "0" in enums  # the default value is a constraint too
    pk = text.index("PRIMARY KEY (order_id, product_id)")
    labels_at = {s: lab for s, e, lab in spans}
    assert labels_at[pk] == "enum_constraint"
    assert labels_at[pk + len("PRIMARY KEY (")] == "parameter_key"


def test_general_sqlite_constraints(school: SqlSchema) -> None:
    text = (
        "CREATE TABLE IF NOT EXISTS students (a INTEGER PRIMARY KEY AUTOINCREMENT, "
        "b TEXT NOT NULL DEFAULT 'z' COLLATE NOCASE, c REAL CHECK (c > 0), "
        "d INT REFERENCES courses(course_id) ON DELETE CASCADE, `e f` varchar(3), "
        "FOREIGN KEY (d) REFERENCES courses (course_id), UNIQUE (b));"
    )
    spans = label_ddl_spans(text, school)
    assert _labelled(text, spans, "function_name") == ["students", "courses", "courses"]
    assert _labelled(text, spans, "parameter_key") == [
        "a",
        "b",
        "c",
        "d",
        "course_id",
        "e f",
        "d",
        "course_id",
        "b",
    ]
    assert _labelled(text, spans, "type_constraint") == [
        "INTEGER",
        "TEXT",
        "REAL",
        "INT",
        "varchar(3)",
    ]
    enums = _labelled(text, spans, "enum_constraint")
    for word in (
        "AUTOINCREMENT",
        "'z'",
        "COLLATE",
        "NOCASE",
        "CHECK",
        "ON",
        "CASCADE",
        "FOREIGN KEY",
        "UNIQUE",
    ):
        assert word in enums, word
    assert "c > 0" in "".join(_labelled(text, spans, "schema_scaffold"))  # CHECK body


@pytest.mark.parametrize(
    "text",
    [
        "CREATE TABLE strangers (x int);",  # not a table of this schema
        "CREATE TABLE students (x int",  # never closed
        "Please CREATE TABLE students for me; thanks",  # prose, not DDL
        "CREATE TABLE students (x int, y UNSIGNED BIG INT);",  # sqlglot cannot validate it
    ],
)
def test_unvalidated_spans_stay_protected(text: str, school: SqlSchema) -> None:
    assert label_ddl_spans(text, school) == [(0, len(text), "protected_content")]


def test_token_labels_with_the_real_tokenizer(school: SqlSchema) -> None:
    tokenizer: Any = load_tokenizer("default")
    text = "Schema:\n" + school.table("enrollments").ddl() + "\nQ: average grade?"
    labels = label_ddl_tokens(text, school, tokenizer)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(labels) == len(ids)
    pieces = [tokenizer.decode([i]) for i in ids]
    by_piece = dict(zip(pieces, labels, strict=False))
    assert by_piece["Schema"] == "protected_content"
    assert by_piece[" students"] == "function_name"
    assert by_piece["final"] == "parameter_key"
    assert by_piece[" REAL"] == "type_constraint"
    assert by_piece[" REFERENCES"] == "enum_constraint"
    assert labels[-1] == "protected_content"
    # '(student' spans scaffold "(" and a key: the key wins (span_labels.LABEL_PRIORITY).
    assert by_piece["(student"] == "parameter_key"


def _shop_prompt() -> tuple[str, SqlSchema]:
    from pask_agent.integrations.sql import SQLiteAssistant

    assistant = SQLiteAssistant(DATA / "shop.sqlite", model="default")
    try:
        return assistant.system_prompt, assistant.schema
    finally:
        assistant.close()


def test_example_rows_and_value_lines_of_the_linked_prompt_are_labelled() -> None:
    text, shop = _shop_prompt()
    spans = label_ddl_spans(text, shop)
    enums = _labelled(text, spans, "enum_constraint")
    # complete value sets are what a WHERE copies; examples ("e.g.") and rows only illustrate
    assert "'Books'" in enums and "'Germany'" in enums and "'gold'" in enums
    described = _labelled(text, spans, "schema_description")
    assert "'Olivia'" in described  # customers.first_name e.g.: 'Olivia', ...
    assert any("Wireless Mouse | Electronics | 26.18" in d for d in described)  # a sample row
    names = _labelled(text, spans, "parameter_key")
    assert names.count("loyalty_tier") >= 3  # DDL, the rows' header, the values line
    tables = _labelled(text, spans, "function_name")
    assert tables.count("products") >= 3
    # what is left as protected content is the instructions and the line breaks between parts
    protected = "".join(_labelled(text, spans, "protected_content"))
    assert "SELECT query" in protected and "'" not in protected and "|" not in protected


def test_the_last_rows_block_is_labelled_inside_the_chat_template() -> None:
    """The template closes the system turn right after the schema (``*/<|im_end|>``): the last
    table's example rows are labelled like every other table's, and what follows the schema
    is the request, left as protected content."""
    system, shop = _shop_prompt()
    text = f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nHow many?<|im_end|>\n"
    assert system.rstrip().endswith("*/")
    spans = label_ddl_spans(text, shop)
    last_row = system.rstrip().rsplit("\n", 2)[-2]  # the last sample row of the last table
    assert last_row in "".join(_labelled(text, spans, "schema_description"))
    tail = text[max(end for _, end, label in spans if label != "protected_content") :]
    assert tail == "<|im_end|>\n<|im_start|>user\nHow many?<|im_end|>\n"


def test_forged_rows_and_values_for_other_tables_stay_protected() -> None:
    _, shop = _shop_prompt()
    text = (
        "/*\n3 example rows from employees:\nid | name\n1 | Ann\n*/\n"
        "-- products.colour is one of: 'red', 'blue'\n"
        "-- payroll.salary is one of: '1', '2'\n"
        "/*\n1 example rows from products:\nname | colour\nMouse | red\n*/"
    )
    assert label_ddl_spans(text, shop) == [(0, len(text), "protected_content")]


def test_value_tokens_take_the_value_label_with_a_real_tokenizer() -> None:
    text, shop = _shop_prompt()
    tokenizer = load_tokenizer("default")
    labels = label_ddl_tokens(text, shop, tokenizer)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    books = text.index("'Books'")
    inside = [
        lab
        for (s, e), lab in zip(enc["offset_mapping"], labels, strict=True)
        if s >= books + 1 and e <= books + len("'Books'") - 1 and e > s
    ]
    assert inside and set(inside) == {"enum_constraint"}
