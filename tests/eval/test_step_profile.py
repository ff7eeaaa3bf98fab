"""``eval/step_profile.py`` on the tiny random model: phases are measured inside real steps and
the report names its command, commit and machine."""

from __future__ import annotations

from pathlib import Path

from tiny_models import tiny_qwen2

from pask_agent.eval.step_profile import PHASES, measure, write
from pask_agent.record.provenance import provenance
from pask_agent.runtime.models.loading import LoadedModel, load_tokenizer


def test_profile_of_a_batched_decode_step(tmp_path: Path) -> None:
    tiny = LoadedModel("tiny-qwen2", Path("."), tiny_qwen2(151936), load_tokenizer("default"))
    row = measure(tiny, 3, 40, 2, "full", 0.33)
    # the prompt, then 2 warm steps, 2 timed plain and 2 profiled: one token each
    assert row["concurrency"] == 3 and row["history_tokens"] == 40 + 2 + 2 + 2
    phases = row["phases_ms"]
    assert set(phases) == set(PHASES)
    # every labelled phase ran inside the profiled steps; attention and writes inside the forward
    assert all(ms > 0 for ms in phases.values())
    assert phases["store.attend"] < phases["model.forward"] < row["step_ms_profiled"]
    assert row["decode_tok_s"] > 0 and row["top_ops_self_ms"]
    write([row], tmp_path / "profile", {**provenance(["step_profile"]), "threads": 1, "note": ""})
    text = (tmp_path / "profile.md").read_text()
    assert "Commit: `" in text and "| logit masks (`masks.apply`)" in text
    assert (tmp_path / "profile.json").exists()
