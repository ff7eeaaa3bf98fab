"""``pask-agent bench`` on SmolLM2 at tiny sizes: every row carries the fields the README's
numbers come from, PASK's store peak is below Full KV's, a fixed capacity admits more PASK
requests at once than Full-KV ones, and the files name their command, commit and machine."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from pask_agent.errors import ConfigError
from pask_agent.eval.bench import add_arguments, bench, concurrency_levels
from pask_agent.eval.bench_report import paired_rounds, write
from pask_agent.record.provenance import provenance

FIELDS = {
    "policy", "concurrency", "prompt_tokens", "decode_tok_s", "tpot_s", "ttft_s",
    "peak_kv_bytes", "allocated_kv_bytes", "rss_peak_bytes", "admitted_max",
    "host_overhead_pct", "host_ms_per_step", "roofline_pct", "measured_b", "e2e_tok_s",
    "decode_rows_mean", "full_batch_steps", "full_batch_tok_s",
}  # fmt: skip


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(["--model", "smollm2-135m", "--new-tokens", "4", *argv])


def test_bench_rows_compare_policies(smollm2, tmp_path: Path) -> None:
    args = _args("--policies", "full,pask,snapkv", "--concurrency", "1,2", "--prompt-tokens", "160")
    rows, meta = bench(smollm2, args)
    assert [(r["policy"], r["concurrency"]) for r in rows] == [
        (p, c) for p in ("full", "pask", "snapkv") for c in (1, 2)
    ]
    for r in rows:
        assert FIELDS <= set(r), FIELDS - set(r)
        assert r["prompt_tokens"] == 160 and r["admitted_max"] == r["concurrency"]
        assert r["fits_at_once"] > r["concurrency"]  # the default capacity: room to spare
        assert r["decode_tok_s"] > 0 and 0 < r["roofline_pct"] and 0 <= r["host_overhead_pct"] < 100
        assert 0 < r["host_ms_per_step"] < 1000 * r["tpot_s"] * 2
        assert 0 < r["peak_kv_bytes"] <= r["allocated_kv_bytes"] < r["rss_peak_bytes"]
        assert r["shed_events"] == 0
        # both prompts fit one prefill chunk: every decode step runs every request
        assert r["decode_rows_mean"] == r["concurrency"]
        assert r["full_batch_steps"] == r["decode_steps"] > 0
    peak = {(r["policy"], r["concurrency"]): r["peak_kv_bytes"] for r in rows}
    for c in (1, 2):
        assert peak["pask", c] < peak["full", c]  # the plan runs as the prompt is written
    full = next(r for r in rows if r["policy"] == "full")
    assert full["measured_b"] == 1.0 and full["peak_kv_bytes"] == full["full_kv_bytes_per_request"]

    meta = {**provenance(["pask-agent", "bench"]), **meta, "command": "pask-agent bench"}
    write(rows, tmp_path / "bench", meta)
    write(rows[:1], tmp_path / "bench", {**meta, "command": "again"}, append=True)
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert [r["run"] for r in saved["rows"]] == [0] * len(rows) + [1]
    assert saved["rows"][: len(rows)] == [{**r, "run": 0} for r in rows]
    assert all(m["git_commit"] and m["machine"] for m in saved["runs"])
    text = (tmp_path / "bench.md").read_text()
    assert "Run 0: `pask-agent bench`" in text and "Run 1: `again`" in text
    assert "| 0 | 0 | pask | 160 | 2 |" in text  # run 0, round 0
    assert "Paired rounds" not in text  # one round: no drift to pair away
    assert (tmp_path / "bench.png").stat().st_size > 0


def test_fixed_capacity_admits_more_pask_requests(smollm2) -> None:
    # a capacity that holds exactly one Full-KV request of 160 + 4 tokens
    args = _args(
        "--policies", "full,pask", "--concurrency", "3", "--prompt-tokens", "160",
        "--capacity-full-requests", "1",
    )  # fmt: skip
    rows, _ = bench(smollm2, args)
    full, pask = rows
    assert full["admitted_max"] == full["fits_at_once"] == 1
    assert pask["admitted_max"] == min(3, pask["fits_at_once"]) >= 2
    # the last sampled token is never written: 163 tokens held of the 164 reserved
    per_token = full["full_kv_bytes_per_request"] // 163
    assert full["kv_capacity_bytes"] == full["allocated_kv_bytes"] == 164 * per_token
    assert full["peak_kv_bytes"] <= full["kv_capacity_bytes"]
    assert pask["peak_kv_bytes"] <= pask["kv_capacity_bytes"]


@pytest.mark.parametrize(
    ("schedule", "decode_steps", "full_steps"), [("interleave", 3, 2), ("prefill_first", 3, 3)]
)
def test_full_batch_steps_exclude_steps_with_requests_missing(
    smollm2, schedule: str, decode_steps: int, full_steps: int
) -> None:
    """One prompt per prefill chunk. Interleaved, the first request decodes while the second
    is prefilled and finishes first, so one decode step runs the second alone and the all-c
    rate leaves it out; prefill first, both decode together in every decode step."""
    args = _args("--policies", "full", "--concurrency", "2", "--prompt-tokens", "160",
                 "--prefill-chunk-tokens", "160", "--schedule", schedule)  # fmt: skip
    rows, meta = bench(smollm2, args)
    (row,) = rows
    assert meta["schedule"] == schedule
    assert (row["decode_steps"], row["full_batch_steps"]) == (decode_steps, full_steps)
    rows_run = 2 * full_steps + (decode_steps - full_steps)
    assert row["decode_rows_mean"] == round(rows_run / decode_steps, 2)
    assert row["full_batch_tok_s"] > 0


def test_concurrency_per_policy_is_parsed_or_refused() -> None:
    assert concurrency_levels("1,4", ["full", "pask"]) == {"full": [1, 4], "pask": [1, 4]}
    assert concurrency_levels("full=4,pask=11", ["full", "pask"]) == {"full": [4], "pask": [11]}
    with pytest.raises(ConfigError, match="name each of"):
        concurrency_levels("full=4", ["full", "pask"])
    with pytest.raises(ConfigError, match="is not"):
        concurrency_levels("full=four", ["full"])


def test_rounds_pair_each_policy_with_the_first_in_the_same_round(smollm2, tmp_path: Path) -> None:
    """Two rounds of Full KV at c = 1 against PASK at c = 2: rows come round by round, and the
    paired ratio of a round is PASK's all-c rate over Full KV's in that same round."""
    args = _args("--policies", "full,pask", "--concurrency", "full=1,pask=2",
                 "--prompt-tokens", "160", "--repeat", "2")  # fmt: skip
    rows, meta = bench(smollm2, args)
    assert meta["repeat"] == 2
    assert [(r["round"], r["policy"], r["concurrency"]) for r in rows] == [
        (0, "full", 1),
        (0, "pask", 2),
        (1, "full", 1),
        (1, "pask", 2),
    ]
    pairs = paired_rounds(rows)
    assert [(p["round"], p["policy"], p["reference"]) for p in pairs] == [
        (0, "pask", "full"),
        (1, "pask", "full"),
    ]
    for p, (full, pask) in zip(pairs, (rows[:2], rows[2:]), strict=True):
        assert p["ratio"] == round(pask["full_batch_tok_s"] / full["full_batch_tok_s"], 3)
    meta = {**provenance(["pask-agent", "bench"]), **meta, "command": "pask-agent bench"}
    write(rows, tmp_path / "bench", meta)
    text = (tmp_path / "bench.md").read_text()
    assert "## Paired rounds" in text and "- run 0, pask: 2 rounds, ratio median" in text
