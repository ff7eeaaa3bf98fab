"""NVIDIA kvpress as a peer (``python -m pask_agent.eval.kvpress_peer``): the press/budget
mapping, the rows it writes and their merge with our BFCL rows, and its typed errors. The run
itself needs the side venv of ``make peer-kvpress``, which CI never builds; these tests read
and write the files around it, scored by the real BFCL checker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pask_agent.errors import ConfigError
from pask_agent.eval import bfcl_eval
from pask_agent.eval.bfcl import load_bfcl
from pask_agent.eval.harness import Config, Row
from pask_agent.eval.harness_report import write_report
from pask_agent.eval.harness_rows import RowFile, read_rows
from pask_agent.eval.kvpress_peer import (
    PRESSES,
    KvpressWorkload,
    PressRun,
    compression_ratio,
    peer_python,
    plan_runs,
    score_record,
    usage_of,
)
from pask_agent.eval.kvpress_worker import Bf16Cache, job_cases, prompt_digest

OURS = Path(__file__).resolve().parents[2] / "results" / "bfcl_test50_centered_full.jsonl"
LAYERS, HEADS, HEAD_DIM = 24, 2, 64
TOKEN_BYTES = LAYERS * HEADS * HEAD_DIM * 2 * 2  # K and V at BF16


def _record(case_id: str, text: str, *, prompt: int = 100, kept: int = 33, **extra) -> dict:
    """A worker record as ``kvpress_worker.answer`` writes it (answer of 10 tokens)."""
    return {
        "press": "snapkv", "budget": 0.33, "id": case_id, "prompt_tokens": prompt,
        "prompt_sha256": prompt_digest([1, 2, 3]), "token_ids": list(range(10)), "text": text,
        "reason": "stop", "kept_prompt_entries": kept * LAYERS * HEADS, "layers": LAYERS,
        "kv_heads": HEADS, "head_dim": HEAD_DIM, "ttft_s": 0.5, "tpot_s": 0.1, "seconds": 1.5,
        **extra,
    }  # fmt: skip


def test_the_kept_share_of_the_prompt_is_the_budget() -> None:
    assert compression_ratio(0.33) == pytest.approx(0.67)
    assert compression_ratio(0.2) == pytest.approx(0.8)
    assert compression_ratio(1.0) == 0.0
    assert PressRun("snapkv", 0.33).compression_ratio == pytest.approx(0.67)
    assert PressRun("full", 1.0).compression_ratio == 0.0  # no press: nothing dropped
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ConfigError, match=r"\(0, 1\]"):
            compression_ratio(bad)


def test_runs_go_budget_by_budget_with_full_once() -> None:
    runs = plan_runs(["full", "snapkv", "kvzip"], [0.2, 0.33])
    assert [(r.config, r.budget) for r in runs] == [
        ("kvpress:full", 1.0),
        ("kvpress:snapkv", 0.2),
        ("kvpress:kvzip", 0.2),
        ("kvpress:snapkv", 0.33),
        ("kvpress:kvzip", 0.33),
    ]
    assert [r.press_class for r in runs[:3]] == [None, "SnapKVPress", "KVzipPress"]
    assert set(PRESSES) >= {"snapkv", "streaming_llm", "expected_attention", "kvzip"}


def test_the_worker_answers_the_cases_the_peer_scores_after_skipped_ones() -> None:
    """A run past the first n per category (``--skip-per-category``): the worker's selection is
    the peer's, so no case id the peer asks for is missing there (it once was)."""
    from pask_agent.eval.kvpress_peer import worker_job

    workload = bfcl_eval.BfclWorkload(
        split="test", per_category=2, categories=("simple_python", "parallel"),
        skip_per_category=100,
    )  # fmt: skip
    asked = [c.id for c in workload.cases()]
    assert asked and all(int(i.rsplit("_", 1)[1]) >= 100 for i in asked)
    assert list(job_cases(worker_job(workload, "unused", []))) == asked


def test_bad_press_names_and_budgets_are_typed_errors() -> None:
    with pytest.raises(ConfigError, match="unknown kvpress press.*snapkv, streaming_llm"):
        plan_runs(["snapkv", "h2o"], [0.33])
    with pytest.raises(ConfigError, match=r"\(0, 1\]"):
        plan_runs(["snapkv"], [0.33, 1.2])
    with pytest.raises(ConfigError, match="at least one"):
        plan_runs([], [0.33])


def test_a_missing_side_venv_names_the_command_that_makes_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="make peer-kvpress"):
        peer_python(tmp_path / "venv")
    bare = tmp_path / "bare"  # a venv without kvpress is no peer either
    (bare / "bin").mkdir(parents=True)
    (bare / "bin" / "python").write_text("")
    (bare / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    with pytest.raises(ConfigError, match="make peer-kvpress"):
        peer_python(bare)
    (bare / "lib" / "python3.11" / "site-packages" / "kvpress").mkdir()
    assert peer_python(bare) == (bare / "bin" / "python").absolute()


def test_measured_b_counts_kept_prompt_entries_and_every_answer_token() -> None:
    usage = usage_of(_record("x", "", prompt=100, kept=33))
    assert usage.prompt_full_kv_bytes == 100 * TOKEN_BYTES
    assert usage.prompt_kv_bytes == 33 * TOKEN_BYTES
    assert usage.full_kv_bytes == 110 * TOKEN_BYTES
    assert usage.kv_bytes == 43 * TOKEN_BYTES
    assert usage.measured_b == pytest.approx(43 / 110)
    assert usage.measured_b_prompt == pytest.approx(0.33)
    assert usage.measured_b_answer == pytest.approx(1.0)


def _scored_rows(cases, records, ours_digest):
    workload = KvpressWorkload("test", 50)
    run = PressRun("snapkv", 0.33)
    rows = []
    for case, record in zip(cases, records, strict=True):
        scored = score_record(workload, case, run, record, ours_digest)
        config = Config(run.config, run.budget)
        rows.append(Row.of(workload, case, run.config, config, scored, 1.5, {"git_commit": "c"}))
    return workload, rows


def test_records_are_scored_by_the_bfcl_checker_with_the_peer_fields() -> None:
    cases = load_bfcl("simple_python", limit=2)[1:2]  # simple_python_1: math.factorial(5)
    right = '{"name": "math.factorial", "arguments": {"number": 5}}'
    wrong = '{"name": "math.factorial", "arguments": {"number": 6}}'
    digest = prompt_digest([1, 2, 3])
    _, (ok,) = _scored_rows(cases, [_record("simple_python_1", right)], digest)
    _, (bad,) = _scored_rows(cases, [_record("simple_python_1", wrong)], "other")
    _, (failed,) = _scored_rows(
        cases, [_record("simple_python_1", "", error="AssertionError: too short")], digest
    )
    assert (ok.correct, ok.valid_call, ok.detail["finish_reason"]) == (True, True, "tool_calls")
    assert ok.detail["prompt_matches_runtime"] is True
    assert ok.detail["compression_ratio"] == pytest.approx(0.67)
    assert ok.detail["press"] == "SnapKVPress"
    assert (bad.correct, bad.valid_call) == (False, True)
    assert "value_error" in bad.error
    assert bad.detail["prompt_matches_runtime"] is False
    assert (failed.correct, failed.valid_call, failed.error) == (
        False, False, "AssertionError: too short",
    )  # fmt: skip
    assert failed.measured.full_kv_bytes == 0  # nothing measured


def test_a_call_that_breaks_its_schema_is_an_invalid_row() -> None:
    cases = load_bfcl("simple_python", limit=2)[1:2]
    text = '{"name": "math.factorial", "arguments": {"number": "five"}}'
    _, (row,) = _scored_rows(cases, [_record("simple_python_1", text)], None)
    assert (row.correct, row.valid_call) == (False, False)
    assert row.error.startswith("ToolCallError")
    assert row.measured.measured_b == pytest.approx(43 / 110)  # its cost is still recorded


def test_rows_merge_with_our_bfcl_rows_into_one_paired_table(tmp_path: Path) -> None:
    # our Full-KV row for simple_python_1, exactly as bfcl_eval wrote it
    line = next(x for x in OURS.read_text().splitlines() if '"simple_python_1"' in x)
    (tmp_path / "ours.jsonl").write_text(line + "\n")
    cases = load_bfcl("simple_python", limit=2)[1:2]
    right = '{"name": "math.factorial", "arguments": {"number": 5}}'
    workload, rows = _scored_rows(cases, [_record("simple_python_1", right)], None)
    theirs = tmp_path / "theirs"
    RowFile(theirs.with_suffix(".jsonl"), workload).rewrite(rows)
    run = {"command": "c", "git_commit": "g", "machine": "m"}
    write_report(theirs, workload, rows, run, {"workload": "bfcl"}, ("full",), "note")
    assert "kvpress:snapkv" in theirs.with_suffix(".md").read_text()

    merged = tmp_path / "merged"
    argv = ["--merge", str(tmp_path / "ours"), str(theirs), "--out", str(merged)]
    assert bfcl_eval.main(argv) == 0
    back = read_rows(merged.with_suffix(".jsonl"), bfcl_eval.BfclWorkload())
    assert [(r.config, r.budget, r.correct) for r in back] == [
        ("full", 1.0, True),
        ("kvpress:snapkv", 0.33, True),
    ]
    assert back[1].detail["compression_ratio"] == pytest.approx(0.67)
    summary = json.loads(merged.with_suffix(".json").read_text())
    assert set(summary["paired_vs_full"]) == {"kvpress:snapkv @ 0.33"}
    table = merged.with_suffix(".md").read_text()
    assert "| kvpress:snapkv | 0.33 |" in table and "| full | 1.00 |" in table


def test_the_peer_cache_keeps_bf16_values_and_attends_the_step_unrounded() -> None:
    cache = Bf16Cache()
    k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    keys, values = cache.update(k, v, 0)
    assert torch.equal(keys, k) and torch.equal(values, v)  # this step's own K/V: as computed
    assert torch.equal(cache.layers[0].keys, k.to(torch.bfloat16).float())
    assert not torch.equal(cache.layers[0].keys, k)
    step = torch.randn(1, 2, 1, 8)
    keys, _ = cache.update(step, step, 0)
    assert torch.equal(keys[:, :, :5], k.to(torch.bfloat16).float())  # earlier: as stored
    assert torch.equal(keys[:, :, 5:], step)
    assert cache.get_seq_length() == 6
