"""The multi-turn eval: conversations chained from BFCL cases, and a run that writes its files."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from pask_agent.errors import ConfigError
from pask_agent.eval.bfcl import ground_truth_calls
from pask_agent.eval.multiturn_eval import conversations, evaluate
from pask_agent.policy.pask import PaskPolicy


def test_conversations_chain_finished_exchanges_before_an_open_request() -> None:
    convs = conversations("dev", 4, 3)
    assert len(convs) == 4 and len({c.id for c in convs}) == 4
    ids = [case.id for c in convs for case in (*c.history, c.last)]
    assert len(ids) == len(set(ids)) == 12  # no case is used twice
    conv = convs[0]
    messages = conv.messages()
    roles = [m["role"] for m in messages]
    assert roles == ["user", "assistant", "tool", "assistant"] * 2 + ["user"]
    first_call = ground_truth_calls(conv.history[0])[0]
    assert messages[1]["tool_calls"][0]["function"]["name"] == first_call["name"]
    assert messages[-1]["content"] == conv.last.messages[-1]["content"]
    names = [t.name for t in conv.tools()]
    assert len(names) == len(set(names))
    assert {f["name"] for case in (*conv.history, conv.last) for f in case.functions} == set(names)
    with pytest.raises(ConfigError, match="need turns >= 2"):
        conversations("dev", 1, 1)
    with pytest.raises(ConfigError, match="cases"):
        conversations("dev", 10_000, 3)


def test_a_small_run_writes_paired_results_and_a_tag_census(tmp_path: Path) -> None:
    out = tmp_path / "mt"
    summaries = asyncio.run(
        evaluate(
            split="dev", count=2, turns=2, budget=0.5, configs=["full", "pask", "pask_plain"],
            out=out, model="smollm2-135m", max_new_tokens=12, log=lambda _: None,
            pask=PaskPolicy(allow_transfer=True),  # the shipped table is the default model's
        )
    )  # fmt: skip
    summary = {s.config: s for s in summaries}
    assert set(summary) == {"full", "pask", "pask_plain"}
    assert summary["full"].mean_b == pytest.approx(1.0)
    assert summary["pask"].max_b < 0.9  # measured, not configured
    rows = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(r["completion_tokens"] > 0 for r in rows)
    body = json.loads(out.with_suffix(".json").read_text())
    assert set(body["paired_vs_full"]) == {"pask @ 0.50", "pask_plain @ 0.50"}
    assert set(body["paired_vs_pask_plain"]) == {"pask @ 0.50"}  # and not full vs pask_plain
    assert body["git_commit"] and body["command"]
    generated = sum(sum(v.values()) for v in body["tag_census"].values())
    assert generated == sum(r["completion_tokens"] for r in rows)  # every token in one bucket
    assert "Generated tokens per tag bucket" in out.with_suffix(".md").read_text()
