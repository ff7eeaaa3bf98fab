"""SqlSchema from real SQLite files and DDL; the sample databases and question set."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sqlite3
from pathlib import Path
from types import ModuleType

import pytest

from pask_agent.errors import ConfigError, DDLError
from pask_agent.eval.sql_data import load_bird_dev, load_sample_questions, sample_data_dir
from pask_agent.grammars.sql.schema import SqlColumn, SqlSchema, quote_identifier

DATA = sample_data_dir()


def _build_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_databases", DATA / "build_databases.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dump(path: Path) -> list[str]:
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return list(con.iterdump())
    finally:
        con.close()


def test_school_schema_reads_types_keys_and_references() -> None:
    schema = SqlSchema.from_sqlite(DATA / "school.sqlite")
    assert schema.table_names == ("departments", "teachers", "courses", "students", "enrollments")
    teachers = schema.table("teachers")
    assert teachers.column("hire date") == SqlColumn(name="hire date", type="DATE", not_null=True)
    assert teachers.column("teacher_id").primary_key
    assert teachers.column("dept_id").references == ("departments", "dept_id")
    enrollments = schema.table("enrollments")
    assert enrollments.primary_key == ("student_id", "course_id", "term")
    assert enrollments.column("final grade").not_null is False
    assert "final grade" in schema.column_names()


def test_shop_schema_default_unique_and_composite_key() -> None:
    schema = SqlSchema.from_sqlite(DATA / "shop.sqlite")
    products = schema.table("products")
    assert products.column("stock").default == "0"
    assert products.column("price").type == "REAL"
    assert schema.table("customers").column("email").unique
    assert schema.table("order_items").primary_key == ("order_id", "product_id")
    assert schema.table("Orders").name == "orders"  # lookup is case-insensitive like SQLite


@pytest.mark.parametrize("db", ["shop", "school"])
def test_rendered_ddl_round_trips_and_creates_the_same_tables(db: str) -> None:
    schema = SqlSchema.from_sqlite(DATA / f"{db}.sqlite")
    text = schema.ddl()
    assert SqlSchema.from_ddl(text) == schema
    con = sqlite3.connect(":memory:")
    con.executescript(text)  # the prompt DDL is valid SQLite
    assert (
        SqlSchema.from_ddl(
            ";\n".join(
                r[0] for r in con.execute("SELECT sql FROM sqlite_master WHERE type = 'table'")
            )
            + ";"
        )
        == schema
    )


def test_from_ddl_keeps_declared_type_text_and_quoting() -> None:
    schema = SqlSchema.from_ddl(
        'CREATE TABLE "order items" (id INTEGER PRIMARY KEY, label varchar(20) NOT NULL, '
        '"unit price" decimal(10, 2) DEFAULT 0.5, note, "select" TEXT, '
        "FOREIGN KEY (id) REFERENCES other(oid)); CREATE INDEX i ON other(oid);"
    )
    table = schema.table("order items")
    assert [c.type for c in table.columns] == [
        "INTEGER",
        "varchar(20)",
        "decimal(10, 2)",
        "",
        "TEXT",
    ]
    assert table.column("id").references == ("other", "oid")
    assert quote_identifier("order items") == '"order items"'
    assert quote_identifier("select") == '"select"'
    assert quote_identifier("label") == "label"
    assert table.ddl().startswith(
        'CREATE TABLE "order items" (\n  id INTEGER PRIMARY KEY REFERENCES other(oid),\n'
        "  label varchar(20) NOT NULL,\n"
    )


@pytest.mark.parametrize(
    ("ddl", "needle"),
    [
        ("", "empty"),
        ("CREATE TABLE (x int)", "could not parse"),
        ("CREATE TABLE a (x int", "could not parse"),
        ("CREATE INDEX i ON a(x);", "no table"),
        ("SELECT 1", "no table"),
        ("CREATE TABLE a (x int); CREATE TABLE A (y int);", "defined twice"),
        ("CREATE TABLE a (x int, PRIMARY KEY (y))", "unknown columns"),
    ],
)
def test_malformed_ddl_raises_ddl_error(ddl: str, needle: str) -> None:
    with pytest.raises(DDLError, match=needle):
        SqlSchema.from_ddl(ddl)


def test_from_sqlite_bad_files(tmp_path: Path) -> None:
    with pytest.raises(DDLError, match="does not exist"):
        SqlSchema.from_sqlite(tmp_path / "missing.sqlite")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(DDLError, match="not a readable SQLite database"):
        SqlSchema.from_sqlite(junk)
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).execute("PRAGMA user_version = 1").connection.close()
    with pytest.raises(DDLError, match="no tables"):
        SqlSchema.from_sqlite(empty)


def test_from_sqlite_opens_read_only() -> None:
    path = DATA / "shop.sqlite"
    before = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    SqlSchema.from_sqlite(path)
    assert (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns) == before


# -- the sample databases -----------------------------------------------------------------
def test_build_script_reproduces_the_committed_databases(tmp_path: Path) -> None:
    module = _build_module()
    assert set(module.DATABASES) == {"shop", "school", "library", "flights"}
    for db in module.DATABASES:
        built = module.build_database(db, tmp_path)
        committed = DATA / f"{db}.sqlite"
        assert _dump(built) == _dump(committed)
        assert committed.stat().st_size < 2_000_000
        # Bytes match whenever the SQLite library that wrote the file (header offset 96) is ours.
        major, minor, patch = sqlite3.sqlite_version_info
        if int.from_bytes(committed.read_bytes()[96:100], "big") == (
            major * 1_000_000 + minor * 1000 + patch
        ):
            assert built.read_bytes() == committed.read_bytes()


def test_sample_databases_are_realistic_sizes() -> None:
    for db, table, low, high in [
        ("shop", "customers", 300, 1000),
        ("shop", "orders", 1000, 5000),
        ("shop", "order_items", 1000, 10000),
        ("school", "students", 300, 1000),
        ("school", "enrollments", 1000, 10000),
    ]:
        con = sqlite3.connect(f"{(DATA / f'{db}.sqlite').as_uri()}?mode=ro", uri=True)
        (count,) = con.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
        con.close()
        assert low <= count <= high, (db, table, count)


def test_question_set_gold_queries_execute_non_empty() -> None:
    qset = load_sample_questions()
    assert len(qset.questions) >= 150
    assert len({q.id for q in qset.questions}) == len(qset.questions)
    assert {q.difficulty for q in qset.questions} == {"simple", "moderate", "challenging"}
    dev = load_sample_questions(split="dev").questions
    test = load_sample_questions(split="test").questions
    assert 0.3 <= len(dev) / len(qset.questions) <= 0.5 and len(test) >= 90
    assert {q.db for q in dev} == {q.db for q in test} == {"shop", "school", "library", "flights"}
    for split in (dev, test):  # every difficulty in every split
        assert {q.difficulty for q in split} == {"simple", "moderate", "challenging"}
    for q in qset.questions:
        con = sqlite3.connect(f"{qset.db_path(q.db).as_uri()}?mode=ro", uri=True)
        rows = con.execute(q.gold_sql).fetchall()
        con.close()
        assert rows and rows != [(None,)], q.id
    kinds = " ".join(q.gold_sql for q in qset.questions)
    for construct in (
        "JOIN",
        "GROUP BY",
        "HAVING",
        "ORDER BY",
        "LIMIT",
        "(SELECT",
        "CASE",
        "STRFTIME",
        "BETWEEN",
        "IS NULL",
        "LIKE",
        "UNION",
        "EXISTS",
        '"',
    ):
        assert construct in kinds, construct


def test_question_loader_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_sample_questions(data_dir=tmp_path)
    (tmp_path / "questions.jsonl").write_text('{"id": "x"}\n')
    with pytest.raises(ConfigError, match="questions.jsonl:1"):
        load_sample_questions(data_dir=tmp_path)
    row = {
        "id": "a",
        "db": "nope",
        "question": "q",
        "gold_sql": "SELECT 1",
        "difficulty": "simple",
        "split": "dev",
    }
    (tmp_path / "questions.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match="nope.sqlite is missing"):
        load_sample_questions(data_dir=tmp_path)
    with pytest.raises(ConfigError, match="unknown split"):
        load_sample_questions().select(split="train")


def test_bird_dev_folder_is_read(tmp_path: Path) -> None:
    db_dir = tmp_path / "dev_databases" / "toy"
    db_dir.mkdir(parents=True)
    con = sqlite3.connect(db_dir / "toy.sqlite")
    con.executescript(
        "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO t VALUES (1, 'a');"
    )
    con.close()
    entries = [
        {
            "question_id": 7,
            "db_id": "toy",
            "question": "How many?",
            "evidence": "hint",
            "SQL": "SELECT COUNT(*) FROM t",
            "difficulty": "simple",
        }
    ]
    (tmp_path / "dev.json").write_text(json.dumps(entries))
    qset = load_bird_dev(tmp_path)
    (q,) = qset.questions
    assert (q.id, q.db, q.evidence, q.split) == ("7", "toy", "hint", "dev")
    assert SqlSchema.from_sqlite(qset.db_path("toy")).table_names == ("t",)
    (tmp_path / "dev.json").write_text(json.dumps([{**entries[0], "db_id": "other"}]))
    with pytest.raises(ConfigError, match="other.sqlite is missing"):
        load_bird_dev(tmp_path)
    with pytest.raises(ConfigError, match="dev.json not found"):
        load_bird_dev(tmp_path / "nowhere")
