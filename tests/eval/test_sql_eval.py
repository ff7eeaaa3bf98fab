"""SQL eval arithmetic: execution accuracy by group, repairs and measured budget in the files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pask_agent.eval.sql_eval import SqlRecord, summarize, write_results


def record(i: int, db: str, difficulty: str, ok: bool, error: str | None, repairs: int, b: float):
    return SqlRecord(
        f"q{i}", db, difficulty, "question?", "SELECT 1", "SELECT 1", ok, error, 9, b, 1.0, repairs
    )


def test_summary_and_files(tmp_path: Path) -> None:
    records = [
        record(0, "shop", "simple", True, None, 0, 0.30),
        record(1, "shop", "moderate", False, "SQLite error: no such column: x", 1, 0.36),
        record(2, "school", "simple", True, None, 1, 0.33),
        record(3, "school", "simple", False, None, 0, 0.33),
    ]
    s = summarize(records)
    assert s["overall"] == {"n": 4, "correct": 2, "accuracy": 0.5}
    assert s["by_db"]["shop"]["correct"] == 1 and s["by_difficulty"]["simple"]["n"] == 3
    assert (s["errors"], s["repaired"], s["repaired_correct"]) == (1, 1, 1)
    assert s["mean_measured_b"] == pytest.approx(0.33) and s["max_measured_b"] == 0.36
    path = write_results(records, {"policy": "pask", "budget": 0.33}, tmp_path, 60.0)
    assert json.loads(path.read_text())["overall"]["correct"] == 2
    md = (tmp_path / "sql_accuracy.md").read_text()
    assert "**2/4 = 50.0%**" in md and "mean 0.33, max 0.36" in md
    assert "| q1 | no | 1 | `SELECT 1` |" in md
