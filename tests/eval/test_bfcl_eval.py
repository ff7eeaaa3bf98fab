"""The BFCL eval: the fixed split file and a real-model smoke run (the harness's own tests,
summaries, merges and resume, are in ``test_harness.py``).

The smoke run serves 4 dev cases (one per non-live category) with the bundled default model
under ``full`` and ``pask`` at ``B = 0.33``: PASK's single-call outputs must be valid calls, its
measured total ``B`` must be within ±0.03 of the target, and the written files must agree with
the official checker re-run on the stored calls.

A regression check pins the parallel-array runaway: when PASK released generated tokens at
B = 0.33 it repeated calls inside the arrays of ``parallel_0`` and ``parallel_5`` until the token
limit. It came back when decoding ran at the table's calibrated ``B_D`` = 0.157, below INT4's own
cost (0.266), where the ledger must release answer tokens; ``policy/stages.py`` now plans
decoding no lower than INT4's cost while ``B`` allows it, and the check holds again.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from pask_agent.errors import ConfigError
from pask_agent.eval.bfcl import NON_LIVE_CATEGORIES, ast_check, load_bfcl
from pask_agent.eval.bfcl_eval import BfclWorkload, evaluate, load_split
from pask_agent.eval.harness import Config, run_cases
from pask_agent.eval.harness_report import summarize_rows
from pask_agent.eval.splits import PARTITIONS, load_split_file, make_split, schema_key
from pask_agent.record.traces import read_traces


def test_split_file_is_fixed_disjoint_and_schema_closed() -> None:
    cases = [c for cat in NON_LIVE_CATEGORIES for c in load_bfcl(cat)]
    shipped = load_split_file()
    assert make_split(cases, shipped.seed) == shipped  # the file is what the rule writes
    for parts in shipped.ids.values():
        sizes = [len(parts[p]) for p in PARTITIONS]
        total = sum(sizes)
        assert all(abs(n - total * r / 5) <= 2 for n, r in zip(sizes, (1, 1, 3), strict=True))
        assert len(set().union(*map(set, parts.values()))) == total
    where: dict[str, str] = {}
    for case in cases:
        for function in case.functions:
            part = shipped.partition_of(case.id)
            assert where.setdefault(schema_key(function), part) == part, case.id
    picked = load_split("dev", 3)
    assert [c.category for c in picked] == [c for c in NON_LIVE_CATEGORIES for _ in range(3)]
    assert all(shipped.partition_of(c.id) == "dev" for c in picked)
    with pytest.raises(ConfigError, match="split"):
        load_split("train", 3)
    with pytest.raises(ConfigError, match="split file"):
        load_split_file(Path("/nonexistent/bfcl.json"))


def test_cases_no_earlier_run_scored_follow_the_first_n() -> None:
    seen, unseen = load_split("test", 50), load_split("test", 50, skip=50)
    assert len(unseen) == 200 and not {c.id for c in seen} & {c.id for c in unseen}
    # the same order: the first 100 of each category are the two runs, one after the other
    both = load_split("test", 100)
    for category in NON_LIVE_CATEGORIES:
        ids = [c.id for c in both if c.category == category]
        assert ids == [c.id for c in (*seen, *unseen) if c.category == category]
    workload = BfclWorkload("test", 50, skip_per_category=50)
    assert workload.settings()["skip_per_category"] == 50
    assert "skip_per_category" not in BfclWorkload("test", 50).settings()  # older runs resume
    assert "after the first 50" in workload.note(200)
    with pytest.raises(ConfigError, match="skip"):
        load_split("test", 1, skip=-1)


@pytest.mark.slow
def test_bfcl_smoke_full_and_pask(tmp_path: Path) -> None:
    out = tmp_path / "bfcl_smoke"
    summaries = anyio.run(
        lambda: evaluate(
            ["full", "pask"],
            [0.33],
            per_category=1,
            split="dev",
            out=out,
            max_new_tokens=160,
            log=lambda _: None,
            traces_out=tmp_path / "dev_traces.jsonl",
        )
    )
    full, pask = summaries
    assert (full.policy, full.budget, pask.policy, pask.budget) == ("full", 1.0, "pask", 0.33)
    assert full.measured_b == 1.0 and full.cases == pask.cases == 4
    assert abs(pask.measured_b - 0.33) <= 0.03 and abs(pask.mean_b - 0.33) <= 0.03
    rows = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert len(rows) == 8
    single = [r for r in rows if r["category"] in ("simple_python", "multiple")]
    assert len(single) == 4 and all(r["valid_call"] for r in single)
    assert all(r["valid_call"] for r in rows if r["policy"] == "full")
    assert all(r["tagger_fallbacks"] == 0 for r in rows)  # every token placed in a bucket
    traces = read_traces(tmp_path / "dev_traces.jsonl")  # the Full-KV run, as traces
    full_rows = {r["id"]: r for r in rows if r["policy"] == "full"}
    assert [t.id for t in traces] == list(full_rows)
    assert all(t.ok == full_rows[t.id]["correct"] for t in traces)
    assert all(t.output == full_rows[t.id]["text"] for t in traces)
    cases = {c.id: c for c in load_split("dev", 1)}
    for r in rows:
        assert r["correct"] == ast_check(cases[r["id"]], r["calls"])
    table = out.with_suffix(".md").read_text()
    assert "| full | 1.00 |" in table and "| pask | 0.33 |" in table
    stored = json.loads(out.with_suffix(".json").read_text())
    assert stored["summaries"][1]["policy"] == "pask"
    assert stored["paired_vs_full"]["pask @ 0.33"]["n"] == 4 and "McNemar p" in table
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"]({out.name}.png)" in table


@pytest.mark.slow
def test_pask_parallel_arrays_stay_valid() -> None:
    from pask_agent.runtime.runtime import Runtime

    cases = [c for c in load_bfcl("parallel", limit=6) if c.id in ("parallel_0", "parallel_5")]

    async def run() -> list:
        async with Runtime.open("default") as rt:
            workload = BfclWorkload(max_new_tokens=160)
            return await run_cases(workload, rt, cases, Config("pask", 0.33))

    (summary,) = summarize_rows(anyio.run(run))
    assert summary.cases == 2 and summary.valid_rate == 1.0
    assert abs(summary.measured_b - 0.33) <= 0.03
