"""The SQL eval: scoring rules, the files it writes, bad input, and real runs on SmolLM2.

Bad input must stop the command before the model loads with a typed error and leave every file
as it was; the real runs (a BIRD-format folder built here, and the sample set) check the files
and that no database changed by a single byte.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from pask_agent.errors import ConfigError, DDLError
from pask_agent.eval.harness import Measured, Row, Shard
from pask_agent.eval.sql_data import SqlQuestion, SqlQuestionSet, load_sample_questions
from pask_agent.eval.sql_eval import SqlWorkload, check_inputs, main, write_results
from pask_agent.eval.sql_report import summarize
from pask_agent.eval.sql_scoring import (
    binding_errors,
    gold_orders,
    k_curve,
    results_match,
    revote,
    same_candidates,
    vote_ceiling,
)
from pask_agent.integrations.sql_db import QueryResult
from pask_agent.package_data import sample_data_dir


def record(
    i: int, difficulty: str, ok: bool, b: float, cands: list[tuple[str | None, bool]]
) -> Row:
    candidates = [
        {"sql": "SELECT 1", "digest": d, "votes": 0, "error": None if d else "x", "correct": c}
        for d, c in cands
    ]
    detail = {
        "db": "shop", "question": "question?", "gold_sql": "SELECT 1",
        "predicted_sql": "SELECT 1", "repairs": 0, "candidates": candidates,
        "example_match": False,
    }  # fmt: skip
    measured = Measured.values(completion_tokens=9, measured_b=b, pooled_b=b)
    return Row(f"q{i}", difficulty, "full k=3", "full", 1.0, ok, True, "", measured, 1.0, "",
               detail)  # fmt: skip


def with_detail(row: Row, **detail: object) -> Row:
    return replace(row, detail={**row.detail, **detail})


def rows(*r: tuple) -> QueryResult:
    return QueryResult(("a",), tuple(r), False, 0.0)


def test_scoring_orders_only_when_the_gold_query_orders() -> None:
    assert gold_orders("SELECT a FROM t ORDER BY a DESC LIMIT 3")
    assert not gold_orders("SELECT a FROM t WHERE a IN (SELECT a FROM u ORDER BY a LIMIT 2)")
    assert not gold_orders("SELECT COUNT(*) FROM t")
    a, b = rows((1,), (2,)), rows((2,), (1,))
    assert results_match(a, b, ordered=False) and not results_match(a, b, ordered=True)
    assert results_match(rows((1 / 3,)), rows((0.33333333,)), ordered=True)
    assert not results_match(rows((1,)), rows((1,), (2,)), ordered=False)


def test_k_curve_revotes_the_first_k_candidates() -> None:
    records = [
        # greedy wrong, two samples agree on the right answer: right from k=3 on
        record(0, "simple", True, 0.3, [("a", False), ("b", True), ("b", True)]),
        # greedy failed: the first runner wins at k=2
        record(1, "moderate", True, 0.3, [(None, False), ("c", True), ("d", False)]),
        # greedy right, samples split: ties keep greedy
        record(2, "challenging", True, 0.3, [("e", True), ("f", False), ("g", False)]),
    ]
    assert k_curve(records, [1, 2, 3]) == {1: round(1 / 3, 4), 2: round(2 / 3, 4), 3: 1.0}


def test_vote_ceiling_counts_questions_with_any_right_candidate() -> None:
    records = [
        # the vote chose wrong, but a runner-up was right: inside the ceiling
        record(0, "simple", False, 0.3, [("a", False), ("a", False), ("b", True)]),
        # no candidate right
        record(1, "moderate", False, 0.3, [("c", False), (None, False)]),
        # the vote chose right
        record(2, "challenging", True, 0.3, [("e", True), ("f", False)]),
    ]
    assert vote_ceiling(records) == {"n": 3, "correct": 2, "accuracy": round(2 / 3, 4)}
    (summary,) = summarize(records)
    assert summary["vote_ceiling"]["correct"] == 2
    assert summary["overall"]["correct"] == 1


def test_revote_demotes_recorded_empty_results() -> None:
    r = record(0, "simple", False, 0.3, [("e", False), ("e", False), ("x", True)])
    for c in r.detail["candidates"][:2]:
        c["empty"] = True
    assert revote(r, 3).correct and revote(r, 3).detail["predicted_sql"] == "SELECT 1"
    old = record(1, "simple", False, 0.3, [("e", False), ("e", False), ("x", True)])
    assert not revote(old, 3).correct  # records without the flag vote as they did


def test_questions_an_example_answered_are_counted_apart() -> None:
    records = [
        with_detail(record(0, "simple", True, 1.0, [("a", True)]), example_match=True),
        record(1, "simple", False, 1.0, [("b", False)]),
        record(2, "simple", True, 1.0, [("c", True)]),
    ]
    (s,) = summarize(records)
    assert s["example_matches"] == 1
    assert s["outside_examples"] == {"n": 2, "correct": 1, "accuracy": 0.5}


def test_files_summary_and_paired_baseline(tmp_path: Path) -> None:
    records = [
        record(0, "simple", True, 0.30, [("a", True)]),
        record(1, "moderate", False, 0.36, [("b", False)]),
        record(2, "challenging", True, 0.33, [("c", True)]),
        record(3, "simple", False, 0.33, [(None, False)]),
    ]
    (s,) = summarize(records)
    assert s["overall"] == {"n": 4, "correct": 2, "accuracy": 0.5}
    assert s["by_difficulty"]["simple"]["n"] == 2 and s["max_measured_b"] == 0.36
    assert s["mean_measured_b"] == pytest.approx(0.33)
    baseline = [record(i, "simple", i == 0, 1.0, [("a", i == 0)]) for i in range(4)]
    report = write_results(tmp_path, records, {"policy": "full"}, [baseline])
    lines = (tmp_path / "sql_eval.jsonl").read_text().splitlines()
    assert [json.loads(x)["id"] for x in lines] == ["q0", "q1", "q2", "q3"]
    md = (tmp_path / "sql_eval.md").read_text()
    assert "| full k=3 | 1.00 | 50.0 | 0.0 | 100.0 | 50.0 (2/4) |" in md
    assert "git_commit" in report and "command" in json.loads(
        (tmp_path / "sql_eval.json").read_text()
    )
    (pair,) = report["paired_vs_baseline"]
    assert (pair["only_a"], pair["only_b"], pair["difference"]) == (1, 0, 0.25)
    assert tuple(pair["same_candidates"]) == (4, 4)  # every candidate is "SELECT 1"
    assert "(same question and seed): full k=3 4 of 4" in md
    assert (tmp_path / "sql_eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_same_candidates_compares_sql_by_question_and_seed() -> None:
    def with_sql(i: int, sqls: list[str]) -> Row:
        return with_detail(record(i, "simple", True, 1.0, [("a", True)] * len(sqls)),
                           candidates=[{"sql": q} for q in sqls])  # fmt: skip

    runs = [with_sql(0, ["A", "B"]), with_sql(1, ["C", "D", "E"]), with_sql(2, ["F"])]
    base = [with_sql(0, ["A", "X"]), with_sql(1, ["C", "D"])]  # no question 2, two seeds of 1
    assert same_candidates(runs, base) == {"full k=3": (3, 4)}  # A=A, B≠X; C=C, D=D


def test_revote_scores_a_run_as_if_it_had_fewer_candidates(tmp_path: Path) -> None:
    r = record(0, "simple", True, 0.3, [("a", False), ("b", True), ("b", True)])
    two = revote(r, 2)  # a and b one vote each: greedy wins the tie
    assert two.config == "full k=2" and not two.correct and len(two.detail["candidates"]) == 2
    assert [c["votes"] for c in two.detail["candidates"]] == [1, 1]
    assert revote(r, 3).correct and revote(r, 3).config == "full k=3"
    failed = record(1, "simple", False, 0.3, [(None, False), ("c", True), ("d", False)])
    one = revote(failed, 1)
    assert one.error == "x" and not one.correct
    records = [r, failed]
    k_curve_of_run = k_curve(records, [1, 2, 3])
    for k in (1, 2, 3):  # the same numbers as the k-curve of the full run
        (s,) = summarize([revote(x, k) for x in records])
        assert s["overall"]["accuracy"] == k_curve_of_run[k]
    write_results(tmp_path / "run", records, {})
    argv = ["--records", str(tmp_path / "run" / "sql_eval.jsonl"), "--revote", "2"]
    assert main([*argv, "--out", str(tmp_path / "k2")]) == 0
    assert "| full k=2 |" in (tmp_path / "k2" / "sql_eval.md").read_text()


def test_binding_errors_count_sqlite_column_refusals_only() -> None:
    r = record(0, "simple", False, 1.0, [(None, False), (None, False), (None, False), ("a", False)])
    errors = [
        "SQLite error: no such column: T2.salary",
        "SQLite error: ambiguous column name: dept_id",
        'SQLite error: near "JOIN": syntax error',
    ]
    for c, e in zip(r.detail["candidates"], errors, strict=False):
        c["error"] = e
    counts = binding_errors([r])
    assert counts == {"candidates": 2, "candidates_total": 4, "candidates_refused": 3, "answers": 0}
    (s,) = summarize([r])
    assert s["binding_errors"] == counts


# -- bad input: a typed error before the model loads, and no file changes ------------------
def _bird(root: Path, questions: list[dict], db_file: Path | None) -> Path:
    (root / "dev_databases" / "library").mkdir(parents=True)
    if db_file is not None:
        shutil.copyfile(db_file, root / "dev_databases" / "library" / "library.sqlite")
    (root / "dev.json").write_text(json.dumps(questions))
    return root


def _snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


QUESTION = {
    "question_id": 0,
    "db_id": "library",
    "question": "How many books are there?",
    "evidence": "",
    "SQL": "SELECT COUNT(*) FROM books",
    "difficulty": "simple",
}


def _not_sqlite(path: Path) -> None:
    path.write_text("not a database\n" * 40)


def _no_tables(path: Path) -> None:
    sqlite3.connect(path).close()


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing_db", r"library\.sqlite is missing"),
        ("not_sqlite", r"not a readable SQLite database"),
        ("no_tables", r"has no tables"),
        ("long_question", r"has 4\d{3} characters; each must have 1 to 4000"),
        ("missing_dev_json", r"dev\.json not found"),
        ("bad_budget", r"--budgets must be comma-separated numbers"),
        ("unknown_policy", r"unknown policy 'nope'"),
    ],
)
def test_bad_input_is_refused_and_changes_no_file(
    tmp_path: Path, case: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "bird"
    question = dict(QUESTION)
    if case == "long_question":
        question["question"] = "How many books? " * 260
    db = None if case == "missing_db" else sample_data_dir() / "library.sqlite"
    _bird(root, [question], db)
    target = root / "dev_databases" / "library" / "library.sqlite"
    if case == "not_sqlite":
        _not_sqlite(target)
    if case == "no_tables":
        target.unlink()
        _no_tables(target)
    if case == "missing_dev_json":
        (root / "dev.json").unlink()
    argv = ["--bird", str(root), "--out", str(tmp_path / "out"), "--model", "smollm2-135m"]
    argv += {"bad_budget": ["--policies", "pask", "--budgets", "a,b"]}.get(case, [])
    argv += {"unknown_policy": ["--policies", "nope"]}.get(case, [])
    before = _snapshot(tmp_path)
    samples = _snapshot(sample_data_dir())
    assert main(argv) == 2
    assert re_search(message, capsys.readouterr().err)
    assert _snapshot(tmp_path) == before and not (tmp_path / "out").exists()
    assert _snapshot(sample_data_dir()) == samples


def re_search(pattern: str, text: str) -> bool:
    import re

    return re.search(pattern, text) is not None


def test_check_inputs_raises_typed_errors(tmp_path: Path) -> None:
    fake = tmp_path / "fake.sqlite"
    _not_sqlite(fake)
    q = SqlQuestion("x", "fake", "How many?", "SELECT 1", "simple", "dev")
    with pytest.raises(DDLError, match="not a readable SQLite database"):
        check_inputs(SqlQuestionSet((q,), (("fake", fake),)))
    with pytest.raises(ConfigError, match="missing"):
        check_inputs(SqlQuestionSet((q,), (("fake", tmp_path / "gone.sqlite"),)))
    with pytest.raises(ConfigError, match="no questions"):
        check_inputs(SqlQuestionSet((), ()))


# -- real runs on SmolLM2 ------------------------------------------------------------------
def test_bird_folder_runs_end_to_end_and_changes_no_database(tmp_path: Path) -> None:
    root = _bird(
        tmp_path / "bird",
        [
            QUESTION,
            {
                **QUESTION,
                "question_id": 1,
                "question": "Which authors are from Japan?",
                "evidence": "Japan refers to country = 'Japan'",
                "SQL": "SELECT name FROM authors WHERE country = 'Japan'",
                "difficulty": "moderate",
            },
        ],
        sample_data_dir() / "library.sqlite",
    )
    before = _snapshot(root)
    out = tmp_path / "out"
    argv = ["--bird", str(root), "--model", "smollm2-135m", "--candidates", "2", "--out", str(out)]
    argv += ["--max-new-tokens", "24"]  # the flow is under test, not the queries
    argv += ["--policies", "full,streaming", "--budgets", "0.5"]
    assert main(argv) == 0
    assert _snapshot(root) == before
    records = [json.loads(x) for x in (out / "sql_eval.jsonl").read_text().splitlines()]
    assert [(r["policy"], r["id"]) for r in records] == [
        ("full", "0"), ("full", "1"), ("streaming", "0"), ("streaming", "1"),
    ]  # fmt: skip
    assert all(len(r["candidates"]) == 2 for r in records)
    assert records[1]["question"] == "Which authors are from Japan?"
    report = json.loads((out / "sql_eval.json").read_text())
    assert [c["config"] for c in report["configs"]] == ["full k=2", "streaming@0.5 k=2"]
    assert report["settings"]["data"] == str(root) and report["git_commit"] != "unknown"
    assert (out / "sql_eval.png").is_file()
    assert "| full k=2 |" in (out / "sql_eval.md").read_text()


def test_sample_benchmark_leaves_every_database_unchanged(tmp_path: Path) -> None:
    databases = {db: path for db, path in load_sample_questions().databases}
    assert set(databases) == {"shop", "school", "library", "flights"}
    before = {db: hashlib.sha256(p.read_bytes()).hexdigest() for db, p in databases.items()}
    argv = ["--split", "dev", "--limit", "2", "--model", "smollm2-135m", "--candidates", "2"]
    argv += ["--max-new-tokens", "24"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0
    after = {db: hashlib.sha256(p.read_bytes()).hexdigest() for db, p in databases.items()}
    assert after == before
    assert len((tmp_path / "out" / "sql_eval.jsonl").read_text().splitlines()) == 2


def test_records_mode_pairs_two_runs_without_a_model(tmp_path: Path) -> None:
    run = [record(i, "simple", i < 3, 0.3, [("a", i < 3)]) for i in range(4)]
    base = [record(i, "simple", i == 0, 1.0, [("a", i == 0)]) for i in range(4)]
    greedy = [replace(r, config="full k=1", correct=r.id == "q1") for r in base]
    write_results(tmp_path / "run", run, {})
    write_results(tmp_path / "base", base, {})
    write_results(tmp_path / "greedy", greedy, {})
    argv = ["--records", str(tmp_path / "run" / "sql_eval.jsonl")]
    argv += ["--baseline", f"{tmp_path}/base/sql_eval.jsonl,{tmp_path}/greedy/sql_eval.jsonl"]
    assert main([*argv, "--out", str(tmp_path / "paired")]) == 0
    report = json.loads((tmp_path / "paired" / "sql_eval.json").read_text())
    first, second = report["paired_vs_baseline"]
    assert first["baseline"] == "full k=3" and second["baseline"] == "full k=1"
    assert (first["n"], first["only_a"], first["only_b"], first["difference"]) == (4, 2, 0, 0.5)
    assert (second["only_a"], second["only_b"]) == (2, 0)  # q0, q2 right only in the run
    md = (tmp_path / "paired" / "sql_eval.md").read_text()
    assert md.count("Paired against the baseline run") == 2
    assert "Accuracy over the baseline's: full k=3 3.00x." in md  # 3/4 over 1/4
    assert main(["--records", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_shards_split_the_questions_and_merge_back(tmp_path: Path) -> None:
    def ids(shard: str | None) -> list[str]:
        questions = SqlWorkload(split="test").cases()
        return [q.id for q in (Shard.parse(shard).of(questions) if shard else questions)]

    everything, first, second = ids(None), ids("0/2"), ids("1/2")
    assert sorted(first + second) == sorted(everything) and not set(first) & set(second)
    with pytest.raises(ConfigError, match="--shard"):
        ids("2/2")
    halves = [[r for r in [record(i, "simple", i % 2 == 0, 0.3, [("a", True)])]] for i in (0, 1)]
    for i, half in enumerate(halves):
        write_results(tmp_path / f"s{i}", half, {})
    parts = ",".join(str(tmp_path / f"s{i}" / "sql_eval.jsonl") for i in (0, 1))
    assert main(["--records", parts, "--out", str(tmp_path / "merged")]) == 0
    (s,) = json.loads((tmp_path / "merged" / "sql_eval.json").read_text())["configs"]
    assert s["overall"] == {"n": 2, "correct": 1, "accuracy": 0.5}
