"""The trace format: round trip, atomic appends from many writers, and clear refusals."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from pask_agent.record.traces import (
    ModelId,
    Trace,
    TraceError,
    append_trace,
    read_traces,
    write_traces,
)

MODEL = ModelId("default", "1d96" + "0" * 60)


def _trace(i: int = 0, output: str = '{"name": "f", "arguments": {}}') -> Trace:
    return Trace(
        messages=({"role": "user", "content": f"question {i} — ünïcode ✓"},),
        output=output,
        output_token_ids=(90, 1, 2 + i),
        model=MODEL,
        tools=({"type": "function", "function": {"name": "f", "parameters": {}}},),
        tool_choice="required",
        parallel_tool_calls=False,
        ok=True,
        id=f"case_{i}",
    )


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    ref = Trace(
        messages=({"role": "user", "content": "How many?"},),
        output="SELECT 1",
        output_token_ids=(4,),
        model=MODEL,
        sql_schema="CREATE TABLE t (a INT);",
        reference={"checker": "sql_exec", "db": "x.sqlite", "gold_sql": "SELECT 1"},
    )
    assert write_traces(path, [_trace(0), ref]) == 2
    back = read_traces(path, model=MODEL)
    assert back == [_trace(0), ref]
    assert json.loads(path.read_text().splitlines()[1])["sql_schema"].startswith("CREATE")


def _append_many(args: tuple[str, int]) -> None:
    path, worker = args
    for i in range(50):
        append_trace(path, _trace(worker * 1000 + i, output="x" * 5000))


def test_concurrent_appends_never_interleave(tmp_path: Path) -> None:
    path = str(tmp_path / "many.jsonl")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_append_many, [(path, w) for w in range(4)])
    traces = read_traces(path)
    assert len(traces) == 200 and len({t.id for t in traces}) == 200


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "holds no traces"),
        ("{not json\n", "not JSON"),
        ('{"messages": []}\n', "missing field"),
        (json.dumps({**_trace().to_json(), "ok": None}) + "\n", "'ok'"),
        (json.dumps({**_trace().to_json(), "tools": {}}) + "\n", "'tools' must be a list"),
        (json.dumps({**_trace().to_json(), "output_token_ids": ["a"]}) + "\n", "token ids"),
    ],
)
def test_bad_files_are_refused_with_the_reason(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TraceError, match=message):
        read_traces(path)


def test_traces_of_another_model_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_traces(path, [_trace()])
    with pytest.raises(TraceError, match="recorded with model 'default'"):
        read_traces(path, model=ModelId("smollm2-135m", "b179" + "0" * 60))
    with pytest.raises(TraceError, match="no trace file"):
        read_traces(tmp_path / "missing.jsonl")


def test_group_comes_from_the_line_or_the_references_category() -> None:
    model = {"name": "default", "weights_sha256": "0" * 64}
    base = {"messages": [{"role": "user", "content": "hi"}], "output": "x",
            "output_token_ids": [1], "model": model, "ok": True}  # fmt: skip
    assert Trace.from_json(base).group == ""
    ref = {**base, "reference": {"checker": "bfcl_ast", "case_id": "p_1", "category": "parallel"}}
    assert Trace.from_json(ref).group == "parallel"
    assert Trace.from_json({**ref, "group": "mine"}).group == "mine"
    assert Trace.from_json({**ref, "group": "mine"}).to_json()["group"] == "mine"


def test_calibration_takes_sql_traces_and_refuses_turns_without_structure(
    tmp_path: Path,
) -> None:
    from dataclasses import replace

    from pask_agent.calibration.inputs import load_traces

    sql = Trace(
        messages=({"role": "user", "content": "How many?"},),
        output="SELECT COUNT(*) FROM t",
        output_token_ids=(4, 5),
        model=MODEL,
        sql_schema="CREATE TABLE t (a INT);",
        ok=True,
    )
    path = tmp_path / "t.jsonl"
    write_traces(path, [_trace(0), sql])
    assert [t for _, t in load_traces([path], MODEL)] == [_trace(0), sql]
    bare = tmp_path / "bare.jsonl"
    write_traces(bare, [replace(sql, sql_schema=None)])
    with pytest.raises(TraceError, match=r"bare\.jsonl:1: .*neither tools nor sql_schema"):
        load_traces([bare], MODEL)
