"""``eval/cpu_paths.py``: every comparison runs the real code paths and the report says what
ran where (command, commit, machine)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from pask_agent.eval import cpu_paths
from pask_agent.record.provenance import provenance

TINY = SimpleNamespace(
    hidden_size=256, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=512,
)  # fmt: skip


def test_report_compares_each_path(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(cpu_paths, "ATTENTION_CASES", (("pask, small", 3, 5, 40),))
    linears = cpu_paths.time_linears(TINY, repeats=2, stream_bytes=1 << 20)
    assert {r["layer"] for r in linears} == {n for n, _, _ in cpu_paths.linear_shapes(TINY)}
    paths = ("nn_linear_ms", "onednn_ms", "int8_ms", "int4_ms")
    assert all(r[p] > 0 for r in linears for p in paths)
    (attention,) = cpu_paths.time_attention(TINY, repeats=2)
    assert attention["loop_ms_per_layer"] > 0 and attention["batched_ms_per_layer"] > 0
    assert attention["native_ms_per_layer"] > 0  # head dim 64: the C kernel's own shape
    scratch = cpu_paths.time_scratch(repeats=3)
    assert scratch["plain_ms"] > 0 and scratch["retain_ms"] > 0
    report = {
        "meta": {
            **provenance(["cpu_paths"]),
            "threads": 1,
            "repeats": 2,
            "model": "tiny",
            "native_kernel": "compiled",
        },
        "linears": linears,
        "attention": [attention],
        "scratch": scratch,
    }
    cpu_paths.write(report, tmp_path / "cpu")
    text = (tmp_path / "cpu.md").read_text()
    assert "Commit: `" in text and "| pask, small | 3 | 5 | 40 |" in text
    assert "C kernel: compiled." in text
    assert "| nn.Linear ms | oneDNN ms | oneDNN speedup | int8 ms | int4 ms |" in text
    assert (tmp_path / "cpu.json").exists()
