"""BFCL cases asked as structured outputs (``runtime.call(schema, prompt)``): the task is the
gold function's normalized schema, BFCL's checker scores the answer as a call of it (the
ground truth passes, a wrong value fails), and a SmolLM2 run writes files whose stored answers
re-score to what they recorded, with tokens spread over structural buckets and no tagger
fallback."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from pask_agent.eval.bfcl import ground_truth_calls
from pask_agent.eval.structured_eval import check_arguments, evaluate, structured_tasks
from pask_agent.eval.tag_buckets import bucket_summary, bucket_table, buckets_of
from pask_agent.grammars.tool_spec import ToolSpec
from pask_agent.policy.pask import PaskPolicy


def test_task_is_the_gold_function_with_its_normalized_schema() -> None:
    tasks = structured_tasks("dev", 2)
    assert [t.case.category for t in tasks] == ["simple_python"] * 2 + ["multiple"] * 2
    for task in tasks:
        ((gold, _),) = task.case.ground_truth[0].items()
        doc = next(f for f in task.case.functions if f["name"] == gold)
        assert task.function.name == gold
        assert task.schema == dict(ToolSpec.from_any(doc).parameters)
        assert task.schema["type"] == "object"  # BFCL's "dict", normalized
        assert task.prompt.startswith(task.case.messages[-1]["content"])
        assert f"a call of {gold}" in task.prompt
    assert len(tasks[-1].case.functions) > 1  # multiple: only the gold one is asked


def test_checker_passes_the_ground_truth_and_fails_a_wrong_answer() -> None:
    for task in structured_tasks("dev", 1):
        (truth,) = ground_truth_calls(task.case)
        answer = dict(truth["arguments"])
        assert check_arguments(task, answer)["valid"], task.case.id
        key = next(k for k in task.schema["required"] if isinstance(answer.get(k), str | int))
        wrong = {**answer, key: "not the answer" if isinstance(answer[key], str) else -12345}
        verdict = check_arguments(task, wrong)
        assert not verdict["valid"] and verdict["error_type"], task.case.id
        missing = {k: v for k, v in answer.items() if k != key}
        assert not check_arguments(task, missing)["valid"]


def test_bucket_summary_counts_buckets_and_fallbacks() -> None:
    s = bucket_summary("pask", 0.33, [
        {"a": 3, "b": 1, "c": 1, "d": 2},
        {"a": 2, "e": 0, "tagger_fallback": 1, "untagged": 4},
        None,  # the request raised
    ])  # fmt: skip
    assert (s.answered, s.errors, s.min_buckets, s.max_buckets) == (2, 1, 1, 4)
    assert s.mean_buckets == pytest.approx(2.5)
    assert (s.cases_with_4_or_more, s.tagger_fallbacks, s.untagged) == (1, 1, 4)
    assert s.tokens_per_bucket == {"a": 5, "d": 2, "b": 1, "c": 1}
    assert "| pask | 0.33 | 2 | 1 | 2.50 (1–4) | 1 | 4 | 1 | 4 |" in bucket_table([s])
    assert buckets_of({"a": 1, "untagged": 1, "b": 0}) == 1


def test_smollm2_run_writes_files_that_rescore(smollm2, tmp_path: Path) -> None:
    out = tmp_path / "structured"
    # the shipped table names the default model; PASK's mechanics still run on SmolLM2
    policies = ["full", PaskPolicy(allow_transfer=True)]
    run = dict(per_category=1, split="dev", out=out, model=smollm2, max_new_tokens=64)
    anyio.run(lambda: evaluate(policies, 0.33, **run, log=lambda _: None))
    rows = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert [(r["policy"], r["category"]) for r in rows] == [
        (p, c) for p in ("full", "pask") for c in ("simple_python", "multiple")
    ]
    tasks = {t.case.id: t for t in structured_tasks("dev", 1)}
    for r in rows:
        assert r["valid_call"], r["error"]
        (call,) = r["calls"]
        assert call["name"] == tasks[r["id"]].function.name
        assert json.loads(r["text"]) == call["arguments"]
        assert check_arguments(tasks[r["id"]], call["arguments"])["valid"] == r["correct"]
        assert r["tagger_fallbacks"] == 0 and "untagged" not in r["tag_counts"]
        assert sum(r["tag_counts"].values()) == r["completion_tokens"]
        assert r["buckets"] == buckets_of(r["tag_counts"]) >= 3, r["tag_counts"]
        assert (r["measured_b"] == 1.0) == (r["policy"] == "full")
    summary = json.loads(out.with_suffix(".json").read_text())
    assert {"command", "git_commit", "machine"} <= set(summary)
    assert set(summary["paired_vs_full"]) == {"pask @ 0.33"}
    assert [b["tagger_fallbacks"] for b in summary["buckets"]] == [0, 0]
    pask = summary["summaries"][1]
    assert pask["measured_b"] < 1.0 and pask["measured_b_prompt"] is not None
    md = out.with_suffix(".md").read_text()
    assert "McNemar" in md and "buckets per case" in md and "Command:" in md
    assert out.with_suffix(".png").stat().st_size > 0
