"""Reading the official BFCL harness's files and pairing them with our rows
(``python -m pask_agent.eval.bfcl_official``; the run itself needs the side venv of
``make bfcl-official`` and is in ``results/bfcl_official.md``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pask_agent.errors import ConfigError
from pask_agent.eval.bfcl import load_bfcl
from pask_agent.eval.bfcl_official import (
    OFFICIAL_MODEL,
    bfcl_command,
    compare,
    official_calls,
    read_official,
    same_calls,
    to_markdown,
)


def _lines(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def _project(tmp_path: Path) -> Path:
    """BFCL's layout: result/<model>/non_live/BFCL_v4_<cat>_result.json and the score file
    (a summary line, then one line per wrong case), as ``bfcl generate/evaluate`` write them."""
    model = OFFICIAL_MODEL.replace("/", "_")
    _lines(
        tmp_path / "result" / model / "non_live" / "BFCL_v4_simple_python_result.json",
        [
            {"id": "simple_python_1", "result": [{"math_factorial": '{"number": 5}'}]},
            {"id": "simple_python_2", "result": "I cannot help with that."},
        ],
    )
    _lines(
        tmp_path / "score" / model / "non_live" / "BFCL_v4_simple_python_score.json",
        [
            {"accuracy": 0.5, "correct_count": 1, "total_count": 2},
            {"id": "simple_python_2", "valid": False, "error": ["No function call."],
             "error_type": "ast_decoder:decoder_failed"},
        ],
    )  # fmt: skip
    return tmp_path


def test_the_official_verdicts_and_answers_are_read_per_case(tmp_path: Path) -> None:
    got = read_official(_project(tmp_path), ["simple_python"])
    assert got["simple_python_1"]["correct"] is True
    assert got["simple_python_2"]["correct"] is False
    assert "decoder_failed" in got["simple_python_2"]["error"]
    assert official_calls(got["simple_python_1"]["answer"]) == [
        {"name": "math_factorial", "arguments": {"number": 5}}
    ]
    assert official_calls(got["simple_python_2"]["answer"]) is None


def test_a_category_bfcl_did_not_write_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="multiple"):
        read_official(_project(tmp_path), ["simple_python", "multiple"])


def test_a_score_file_that_disagrees_with_the_answers_is_refused(tmp_path: Path) -> None:
    project = _project(tmp_path)
    score = next(project.glob("score/**/*_score.json"))
    score.write_text(score.read_text().replace('"total_count": 2', '"total_count": 3'))
    with pytest.raises(ConfigError, match="not the answers it generated"):
        read_official(project, ["simple_python"])


def test_calls_compare_with_names_as_the_official_client_sends_them() -> None:
    ours = [{"name": "math.factorial", "arguments": {"number": 5}}]
    assert same_calls(ours, [{"name": "math_factorial", "arguments": {"number": 5}}])
    assert not same_calls(ours, [{"name": "math_factorial", "arguments": {"number": 6}}])
    assert not same_calls(ours, None)  # the official answer was text
    assert same_calls([], None)


def test_rows_pair_both_harnesses_on_the_same_cases(tmp_path: Path) -> None:
    cases = load_bfcl("simple_python", limit=3)[1:3]  # simple_python_1, simple_python_2
    assert [c.id for c in cases] == ["simple_python_1", "simple_python_2"]
    ours = {
        "simple_python_1": {"correct": True, "calls": [
            {"name": "math.factorial", "arguments": {"number": 5}}], "text": ""},
        "simple_python_2": {"correct": True, "calls": [
            {"name": "math.hypot", "arguments": {"x": 4, "y": 5}}], "text": ""},
    }  # fmt: skip
    rows, paired = compare(cases, ours, read_official(_project(tmp_path), ["simple_python"]))
    assert [(r["official"], r["in_process"], r["same_calls"]) for r in rows] == [
        (True, True, True),
        (False, True, False),
    ]
    assert (paired.n, paired.only_a, paired.only_b, paired.difference) == (2, 0, 1, -0.5)
    assert "required" not in rows[0]


def test_the_headline_column_and_call_counts_ride_along(tmp_path: Path) -> None:
    cases = load_bfcl("simple_python", limit=3)[1:3]
    one = [{"name": "math.factorial", "arguments": {"number": 5}}]
    ours = {c.id: {"correct": False, "calls": one, "text": ""} for c in cases}
    required = {
        "simple_python_1": {"correct": True, "calls": one * 2},
        "simple_python_2": {"correct": False, "calls": []},
    }
    theirs = read_official(_project(tmp_path), ["simple_python"])
    rows, _ = compare(cases, ours, theirs, required)
    assert [(r["required"], r["required_n_calls"]) for r in rows] == [(True, 2), (False, 0)]
    assert [(r["in_process_n_calls"], r["official_n_calls"]) for r in rows] == [(1, 1), (1, 0)]
    report = {
        "command": "c", "git_commit": "g", "machine": "m", "serve_args": [], "bfcl_version": "v",
        "in_process_settings": {}, "categories": ["simple_python"], "explanation": [],
        "paired": dataclasses.asdict(compare(cases, ours, theirs)[1]), "rows": rows,
    }  # fmt: skip
    md = to_markdown(report)
    assert "| simple_python | 2 | 50.0 (1/2) | 0.0 (0/2) | 1/2 | 50.0 (1/2) | 0 / 0 / 1 |" in md


def test_a_missing_side_venv_names_the_command_that_makes_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="make bfcl-official"):
        bfcl_command(tmp_path / "venv")
