"""CI runs the calibrate-from-your-agent recipe at smoke size on SmolLM2: a LangChain agent's
recorded turns calibrate a table that the model then serves with."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from pask_agent.policy.table import PolicyTable
from pask_agent.record.traces import read_traces

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "calibrate_from_your_agent.py"


def test_calibrate_from_your_agent_recipe_on_smollm2(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("recipe_calibrate", RECIPE)
    assert spec is not None and spec.loader is not None
    recipe = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = recipe
    spec.loader.exec_module(recipe)
    # Two questions, at least one recorded turn each: the split still writes a calibration and
    # a development file (each SmolLM2 turn can decode to the recipe's 96-token limit).
    out = recipe.main(["--model", "smollm2-135m", "--questions", "2", "--out", str(tmp_path)])
    recorded = read_traces(tmp_path / "agent_traces.jsonl")
    assert len(recorded) >= 2 and all(t.model.name == "smollm2-135m" for t in recorded)
    table = PolicyTable.read(out["table"])
    assert table.source == "calibrated" and table.model_id == "SmolLM2-135M-Instruct"
    hashes = {t["path"] for t in table.calibration["traces"]}  # type: ignore[index]
    assert hashes == {str(tmp_path / "cal.jsonl"), str(tmp_path / "dev.jsonl")}
    # The reloaded model ran under that table: PASK kept less than Full KV. (Whether a 135M
    # model calibrated on four turns still gets the call right is not what this smoke tests;
    # the default model's numbers are in results/.)
    assert 0 < out["measured_b"] < 1
    assert out["tool_calls"] or out["finish"] in ("length", "stop"), out
