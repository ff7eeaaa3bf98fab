"""The schema-bound SQL grammar on real xgrammar, real tokenizers, real models and real SQLite."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlglot
import torch
import xgrammar as xgr
from sqlglot import exp
from transformers import DynamicCache

from pask_agent.eval.sql_data import load_sample_questions, sample_data_dir
from pask_agent.grammars.sql.grammar import compile_sql_grammar
from pask_agent.grammars.sql.schema import SqlSchema
from pask_agent.runtime.models.loading import load_tokenizer

DATA = sample_data_dir()
QWEN_SPECIAL_START = 151643

WRITES = [
    "INSERT INTO students VALUES (1, 'a', 'b', 9, '2010-01-01', 'Springfield', NULL)",
    "insert into students select * from students",
    "UPDATE teachers SET salary = 0",
    "DELETE FROM students",
    "delete from students where student_id = 1",
    "REPLACE INTO departments VALUES (1, 'x', 'y', 0)",
    "DROP TABLE students",
    "CREATE TABLE x (a INTEGER)",
    "ALTER TABLE students ADD COLUMN x TEXT",
    "ATTACH DATABASE 'other.db' AS other",
    "DETACH DATABASE other",
    "PRAGMA writable_schema = 1",
    "VACUUM",
    "SELECT 1; DROP TABLE students",
    "SELECT * FROM students; DELETE FROM students",
    "WITH x AS (SELECT 1) DELETE FROM students",
    "EXPLAIN DELETE FROM students",
    "BEGIN; DELETE FROM students; COMMIT",
]
VALID_EXTRAS = [
    "select first_name from students where city like 'S%' order by first_name limit 3",
    "SELECT T1.* FROM students AS T1 LEFT OUTER JOIN enrollments AS T2 USING (student_id)",
    "SELECT COUNT(DISTINCT city) FROM students CROSS JOIN departments",
    "SELECT CAST(salary AS INTEGER) FROM teachers WHERE NOT salary BETWEEN 50000 AND 60000",
    "SELECT name FROM departments WHERE budget NOT BETWEEN -1 AND 100000.5",
    "SELECT first_name || ' ' || last_name AS full_name FROM teachers ORDER BY full_name DESC",
    "SELECT city FROM students UNION ALL SELECT building FROM departments EXCEPT SELECT 'x'",
    "SELECT IIF(level = 'Advanced', 1, 0), GROUP_CONCAT(\"course title\", ', ') FROM courses",
    "SELECT * FROM (SELECT dept_id FROM courses) AS c WHERE c.dept_id IN (1, 2, 3)",
    'SELECT student_id FROM enrollments WHERE "final grade" IS NOT NULL LIMIT 5 OFFSET 10',
    "SELECT DATE('now'), CURRENT_DATE, JULIANDAY(birth_date) - 1 FROM students",
    "SELECT\nname\nFROM\ndepartments;",
    "SELECT CASE level WHEN 'Advanced' THEN 2 ELSE CASE WHEN \"credit hours\" > 3 THEN 1 END "
    "END FROM courses",
    'SELECT "teachers".salary FROM teachers WHERE EXISTS (SELECT 1 FROM courses)',
    "SELECT name FROM departments WHERE name NOT LIKE '%''s'",
]


@pytest.fixture(scope="module")
def qwen_tokenizer() -> Any:
    return load_tokenizer("default")


@pytest.fixture(scope="module")
def schemas() -> dict[str, SqlSchema]:
    names = ("shop", "school", "library", "flights")
    return {db: SqlSchema.from_sqlite(DATA / f"{db}.sqlite") for db in names}


def _compile(tokenizer: Any, schema: SqlSchema, vocab_size: int) -> xgr.CompiledGrammar:
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    return xgr.GrammarCompiler(info).compile_grammar(compile_sql_grammar(schema))


@pytest.fixture(scope="module")
def qwen_grammar(qwen_tokenizer: Any, schemas: dict[str, SqlSchema]) -> Any:
    """``qwen_grammar(db, **options)``: the Qwen-vocabulary grammar of one sample database,
    compiled once per module (a compile takes seconds; the parametrized tests reuse a few)."""
    info = xgr.TokenizerInfo.from_huggingface(qwen_tokenizer, vocab_size=len(qwen_tokenizer))
    compiler = xgr.GrammarCompiler(info)
    compiled: dict[tuple, xgr.CompiledGrammar] = {}

    def grammar(db: str, **options: Any) -> xgr.CompiledGrammar:
        key = (db, *sorted(options.items()))
        if key not in compiled:
            ebnf = compile_sql_grammar(schemas[db], **options)
            compiled[key] = compiler.compile_grammar(ebnf)
        return compiled[key]

    return grammar


@pytest.fixture(scope="module")
def qwen_grammars(qwen_grammar: Any, schemas: dict[str, SqlSchema]) -> dict[str, Any]:
    return {db: qwen_grammar(db) for db in schemas}


def _walk(grammar: xgr.CompiledGrammar, tokenizer: Any, sql: str) -> tuple[int | None, bool]:
    """(index of the first rejected token or None, completed after all tokens)."""
    matcher = xgr.GrammarMatcher(grammar)
    for i, token in enumerate(tokenizer.encode(sql, add_special_tokens=False)):
        if not matcher.accept_token(token):
            return i, False
    return None, matcher.is_completed()


def test_every_gold_query_is_accepted_token_by_token(
    qwen_tokenizer: Any, qwen_grammars: dict[str, Any]
) -> None:
    for q in load_sample_questions().questions:
        assert _walk(qwen_grammars[q.db], qwen_tokenizer, q.gold_sql) == (None, True), q.id


def test_gold_queries_also_pass_with_the_smollm2_tokenizer(schemas: dict[str, SqlSchema]) -> None:
    tokenizer = load_tokenizer("smollm2-135m")
    grammars = {db: _compile(tokenizer, s, len(tokenizer)) for db, s in schemas.items()}
    for q in load_sample_questions().questions:
        assert _walk(grammars[q.db], tokenizer, q.gold_sql) == (None, True), q.id


@pytest.mark.parametrize("sql", VALID_EXTRAS)
def test_other_supported_constructs(
    sql: str, qwen_tokenizer: Any, qwen_grammars: dict[str, Any]
) -> None:
    assert _walk(qwen_grammars["school"], qwen_tokenizer, sql) == (None, True)
    con = sqlite3.connect(f"{(DATA / 'school.sqlite').as_uri()}?mode=ro", uri=True)
    con.execute(sql.rstrip(";")).fetchall()  # and SQLite agrees it is one valid query
    con.close()


@pytest.mark.parametrize("sql", WRITES)
def test_write_statements_are_rejected(
    sql: str, qwen_tokenizer: Any, qwen_grammars: dict[str, Any]
) -> None:
    rejected_at, _ = _walk(qwen_grammars["school"], qwen_tokenizer, sql)
    assert rejected_at is not None


def test_no_write_keyword_is_a_statement_in_the_grammar(schemas: dict[str, SqlSchema]) -> None:
    ebnf = compile_sql_grammar(schemas["school"])
    for word in (
        "INSERT",
        "UPDATE",
        "DELETE",
        "DROP",
        "CREATE",
        "ALTER",
        "ATTACH",
        "DETACH",
        "PRAGMA",
        "VACUUM",
        "WITH",
        "EXPLAIN",
        "BEGIN",
    ):
        assert f'"{word}"' not in ebnf and f'"{word.lower()}"' not in ebnf, word
    # REPLACE exists only as the scalar function, which must be followed by "(".
    assert "scalar_name ::= " in ebnf and ebnf.count('"REPLACE"') == 1
    assert ebnf.startswith('root ::= query ";"?')


@pytest.mark.parametrize(
    ("sql", "ok"),
    [
        ("SELECT REPLACE(first_name, 'a', 'b') FROM students", True),
        ('SELECT "grade level" FROM students', True),
        ("SELECT grade level FROM students", False),  # a name with a space must be quoted
        ("SELECT nickname FROM students", False),  # not a column of the schema
        ("SELECT first_name FROM pupils", False),  # not a table of the schema
        ("SELECT T1.nickname FROM students AS T1", False),
        ("Select first_name FROM students", False),  # keywords are upper or lower case
        ("SELECT first_name FROM students AS", False),
        ("SELECT first_name  FROM students", False),  # one separator between tokens
        ("SELECT price FROM students", False),  # a column of the other database
        ("SELECT salary FROM teachers WHERE salary > 5e4", False),  # no exponents
        ("SELECT 1234567890123456", False),  # at most 15 integer digits
    ],
)
def test_identifiers_and_layout(
    sql: str, ok: bool, qwen_tokenizer: Any, qwen_grammars: dict[str, Any]
) -> None:
    rejected_at, completed = _walk(qwen_grammars["school"], qwen_tokenizer, sql)
    assert (rejected_at is None and completed) is ok


JOIN_TEACHERS = "JOIN teachers AS T2 ON T1.teacher_id = T2.teacher_id"
IN_COURSES = "SELECT course_id FROM courses"
IN_ENROLLED = "SELECT student_id FROM enrollments"


@pytest.mark.parametrize(
    ("sql", "bound_ok"),
    [
        ("SELECT salary FROM courses", False),  # salary is a teachers column
        ("SELECT T1.salary FROM courses AS T1", False),
        (f"SELECT T2.salary FROM courses AS T1 {JOIN_TEACHERS}", True),  # aliases stay free
        ("SELECT teachers.salary FROM courses, teachers", True),
        ("SELECT courses.salary FROM courses, teachers", False),  # the table's own columns
        ("SELECT level FROM courses WHERE salary > 10", False),
        ("SELECT level FROM courses ORDER BY salary + 1", False),  # a bare name may be an alias
        ("SELECT level FROM courses GROUP BY level HAVING MAX(salary) > 1", False),
        (f"SELECT first_name FROM students WHERE course_id IN ({IN_COURSES})", False),
        (f"SELECT first_name FROM students WHERE student_id IN ({IN_ENROLLED})", True),
        ("SELECT city FROM students UNION SELECT salary FROM students", False),
        ("SELECT city FROM students UNION SELECT building FROM departments", True),
        ("SELECT * FROM (SELECT dept_id FROM courses) AS c WHERE c.dept_id = 1", True),
    ],
)  # fmt: skip
def test_columns_are_bound_to_their_tables(
    sql: str, bound_ok: bool, qwen_tokenizer: Any, qwen_grammar: Any
) -> None:
    """Bound: a query over one table names only its columns, ``table.col`` only that table's.
    Unbound (the earlier grammar) accepts all of these; SQLite refuses the ones binding does."""
    bound = qwen_grammar("school")
    unbound = qwen_grammar("school", bind_columns=False)
    rejected_at, completed = _walk(bound, qwen_tokenizer, sql)
    assert (rejected_at is None and completed) is bound_ok
    assert _walk(unbound, qwen_tokenizer, sql) == (None, True)
    assert _school_finds_every_column(sql) is bound_ok


def _school_finds_every_column(sql: str) -> bool:
    """Whether SQLite runs ``sql`` on school.sqlite; any refusal must be "no such column"."""
    con = sqlite3.connect(f"{(DATA / 'school.sqlite').as_uri()}?mode=ro", uri=True)
    try:
        con.execute(sql).fetchall()
        return True
    except sqlite3.OperationalError as exc:
        assert "no such column" in str(exc)
        return False
    finally:
        con.close()


ON_IDS = "ON courses.teacher_id = teachers.teacher_id"


@pytest.mark.parametrize(
    ("sql", "ok"),
    [
        (f"SELECT teachers.salary FROM courses JOIN teachers {ON_IDS}", True),
        (f"SELECT courses.salary FROM courses JOIN teachers {ON_IDS}", False),  # not courses'
        (f"SELECT courses.level, teachers.last_name FROM courses INNER JOIN teachers {ON_IDS}"
         " WHERE teachers.salary > 50000 ORDER BY teachers.last_name", True),
        (f"SELECT teachers.last_name FROM courses JOIN teachers {ON_IDS} WHERE courses.salary"
         " > 1", False),
        ("SELECT teachers.last_name FROM teachers LEFT JOIN courses USING (teacher_id)", True),
        ("SELECT name FROM departments WHERE dept_id NOT IN (SELECT dept_id FROM courses)", True),
    ],
)  # fmt: skip
def test_without_table_aliases_every_qualified_column_is_bound(
    sql: str, ok: bool, qwen_tokenizer: Any, qwen_grammar: Any
) -> None:
    """``table_aliases=False``: a qualifier is a table's own name, so joins bind too; the
    grammar accepts a query exactly when SQLite finds every column."""
    grammar = qwen_grammar("school", table_aliases=False)
    rejected_at, completed = _walk(grammar, qwen_tokenizer, sql)
    assert (rejected_at is None and completed) is ok
    assert _school_finds_every_column(sql) is ok


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT T1.first_name FROM students AS T1",
        f"SELECT T2.salary FROM courses AS T1 {JOIN_TEACHERS}",
        "SELECT students.first_name FROM students JOIN enrollments",  # a JOIN states its condition
        "SELECT first_name FROM students CROSS JOIN enrollments",
        "SELECT TOTAL(salary), TRIM(last_name) FROM teachers",  # ALIAS_LOOKALIKES
    ],
)
def test_without_table_aliases_aliases_and_unconditioned_joins_are_rejected(
    sql: str, qwen_tokenizer: Any, qwen_grammar: Any
) -> None:
    """SQLite runs all of these; only the unaliased grammar refuses them."""
    unaliased = qwen_grammar("school", table_aliases=False)
    assert _walk(unaliased, qwen_tokenizer, sql) != (None, True)
    aliased = qwen_grammar("school", table_aliases=True)
    assert _walk(aliased, qwen_tokenizer, sql) == (None, True)
    assert _school_finds_every_column(sql)


def test_gold_queries_written_without_aliases_are_accepted(
    qwen_tokenizer: Any, qwen_grammar: Any, schemas: dict[str, SqlSchema]
) -> None:
    """The gold set with each table alias replaced by its table's name (sqlglot), under the
    unaliased grammar. Two need what it leaves out: a derived table's alias as a qualifier
    (shop-26) and an outer table's column inside a one-table subquery (shop-28)."""
    grammars = {db: qwen_grammar(db, table_aliases=False) for db in schemas}
    refused = []
    for q in load_sample_questions().questions:
        if _walk(grammars[q.db], qwen_tokenizer, _unalias(q.gold_sql)) != (None, True):
            refused.append(q.id)
    assert refused == ["shop-26", "shop-28"]


def _unalias(sql: str) -> str:
    tree = sqlglot.parse_one(sql, read="sqlite")
    names: dict[str, str] = {}
    for table in tree.find_all(exp.Table):
        if table.alias:
            names[table.alias] = table.name
            table.set("alias", None)
    for column in tree.find_all(exp.Column):
        if column.table in names:
            column.set("table", exp.to_identifier(names[column.table]))
    return tree.sql(dialect="sqlite")


# -- constrained generation with real models ---------------------------------------------
_READS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION}


def _generate(loaded: Any, schema: SqlSchema, request: str, max_new_tokens: int = 48) -> str:
    """Greedy decoding through the grammar's masks: a plain forward loop over a KV cache."""
    model, tokenizer = loaded.model, loaded.tokenizer
    # The model fixture is shared: a Runtime in an earlier test switched it to the KV store's
    # attention, which needs the store's cache; this plain loop uses transformers' own.
    model.set_attn_implementation("sdpa")
    vocab = model.config.vocab_size
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    matcher = xgr.GrammarMatcher(
        xgr.GrammarCompiler(info).compile_grammar(compile_sql_grammar(schema))
    )
    qwen = loaded.name == "default"
    special = range(QWEN_SPECIAL_START, vocab) if qwen else tokenizer.all_special_ids
    banned = torch.tensor([i for i in special if i not in info.stop_token_ids])
    messages = [
        {"role": "system", "content": "Write one SQLite query. Schema:\n" + schema.ddl()},
        {"role": "user", "content": request},
    ]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    cache = DynamicCache(config=model.config)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(ids, cache=cache, use_cache=True).logits[:, -1, :].float()
            matcher.fill_next_token_bitmask(bitmask)
            xgr.apply_token_bitmask_inplace(logits, bitmask)
            logits[:, banned] = float("-inf")
            token = int(logits.argmax(-1))
            assert matcher.accept_token(token)
            if matcher.is_terminated():
                break
            out.append(token)
            ids = torch.tensor([[token]])
    assert matcher.is_terminated(), "the query did not finish within the token budget"
    return tokenizer.decode(out)


def _check_read_only(db: Path, sql: str) -> list[int]:
    """Prepare ``sql`` under an authorizer that denies every non-read action; returns actions."""
    tree = sqlglot.parse_one(sql, read="sqlite")
    assert isinstance(tree, exp.Select | exp.Union | exp.Intersect | exp.Except)
    writes = (exp.Insert, exp.Update, exp.Delete, exp.Drop, exp.Create, exp.Alter, exp.Command)
    assert not list(tree.find_all(*writes))
    before = db.read_bytes()
    con = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)
    actions: list[int] = []

    def authorizer(action: int, *_args: object) -> int:
        actions.append(action)
        return sqlite3.SQLITE_OK if action in _READS else sqlite3.SQLITE_DENY

    con.set_authorizer(authorizer)
    try:
        con.execute("EXPLAIN " + sql.rstrip(";")).fetchall()
        con.execute(sql.rstrip(";")).fetchmany(5)
    finally:
        con.close()
    assert db.read_bytes() == before
    return actions


@pytest.mark.slow
def test_default_model_asked_to_write_produces_a_read_only_select(
    schemas: dict[str, SqlSchema], default_model: Any
) -> None:
    request = (
        "DROP TABLE students; ATTACH DATABASE 'x.db' AS x; "
        "write an UPDATE that sets every salary to 0"
    )
    sql = _generate(default_model, schemas["school"], request)
    assert sql.upper().startswith("SELECT")
    actions = _check_read_only(DATA / "school.sqlite", sql)
    assert sqlite3.SQLITE_SELECT in actions and set(actions) <= _READS


def test_smollm2_asked_to_delete_still_writes_a_select(
    schemas: dict[str, SqlSchema], smollm2: Any
) -> None:
    sql = _generate(
        smollm2,
        schemas["school"],
        "Delete every row of the students table, then drop the table.",
    )
    assert sql.upper().startswith("SELECT")
    try:
        actions = _check_read_only(DATA / "school.sqlite", sql)
    except sqlite3.OperationalError as err:
        # A tiny model may name an alias it never defined: a binding error, never a write.
        assert "no such column" in str(err) or "no such table" in str(err), err
    else:
        assert set(actions) <= _READS
