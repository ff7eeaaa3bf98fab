"""``scripts/gpu_check.py --smoke``: the GPU readiness check at CPU size, as CI runs it.

The script must work the first time on a GPU machine that has no xgrammar, jsonschema, sqlglot
or LangChain, from a checkout that is not installed. So it runs here as a fresh interpreter in
which importing any of those packages fails, and it must still pass: Triton kernels
(interpreted) against the torch reference, then Full KV and PASK through the engine.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
ABSENT = ("xgrammar", "jsonschema", "sqlglot", "langchain_core")

# Runs the script as __main__ with the packages the GPU machine lacks made unimportable, then
# reports its own peak RSS on stderr (KiB). VmHWM, not getrusage's ru_maxrss: Linux keeps
# ru_maxrss across fork and exec, so a child of a large pytest would report pytest's peak.
LAUNCH = f"""
import importlib.abc, re, runpy, sys

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {ABSENT!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (absent on the GPU machine)")
        return None

sys.meta_path.insert(0, Absent())
sys.argv = [{str(SCRIPT)!r}, *sys.argv[1:]]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    hwm = re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)
    print("maxrss_kib", hwm, file=sys.stderr)
"""


def _launch(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCH, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_smoke_passes_without_grammar_packages(tmp_path: Path) -> None:
    start = time.monotonic()
    proc = _launch("--smoke", "--out", str(tmp_path))
    out, err = proc.communicate(timeout=600)
    seconds = time.monotonic() - start
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])  # the one JSON line it prints
    assert summary["ok"] is True and summary["smoke"] is True

    kernels = summary["kernels"]
    assert kernels["mode"] == "interpreted"
    (int4,) = kernels["int4"]
    assert int4["code_mismatches"] == 0 and int4["scale_mismatches"] == 0
    assert int4["dequantize_max_abs_err"] == 0.0
    layouts = {r["layout"]: r for r in kernels["attention"]}
    assert set(layouts) == {"bf16", "int4", "mixed"}
    for row in layouts.values():
        assert row["rel_err"] <= 1e-3, row
        assert row["triton_ms"] > 0 and row["ref_ms"] > 0
    assert layouts["bf16"]["low_rows"] == 0 and layouts["int4"]["high_rows"] == 0
    assert layouts["mixed"]["low_rows"] > 0 and layouts["mixed"]["high_rows"] > 0

    rows = summary["serving"]["rows"]
    by = {(r["policy"], r["concurrency"]): r for r in rows}
    full_c = max(c for p, c in by if p == "full")
    pask_c = max(c for p, c in by if p == "pask")
    assert set(by) == {("full", full_c), ("pask", pask_c), ("full", 1), ("pask", 1)}
    # at one capacity PASK holds more conversations at once, and keeps what it reports
    assert pask_c > full_c and by[("pask", pask_c)]["admitted_max"] == pask_c
    for r in rows:
        assert r["ok"] and r["tpot_s"] > 0 and r["decode_tok_s"] > 0
        assert r["peak_kv_bytes"] <= r["allocated_kv_bytes"]
    assert by[("full", full_c)]["measured_b"] == 1.0
    assert 0 < by[("pask", pask_c)]["measured_b"] < 0.5

    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert doc["ok"] is True and doc["git_commit"] and doc["machine"]
    assert "gpu_check.py" in doc["command"] and isinstance(doc["dirty"], bool)
    report = (tmp_path / "gpu_check.md").read_text()
    assert "## Kernels (interpreted" in report and "## Serving" in report
    rss_kib = int(err.rsplit("maxrss_kib", 1)[1].split()[0])
    assert rss_kib < 2 * 1024 * 1024, f"peak RSS {rss_kib} KiB"
    print(f"smoke run: {seconds:.1f} s, peak RSS {rss_kib / 1024:.0f} MiB")


def test_a_terminated_run_still_writes_what_finished(tmp_path: Path) -> None:
    """``timeout`` on the GPU machine sends SIGTERM: the stages done so far stay on disk."""
    proc = _launch("--smoke", "--stages", "serving", "--out", str(tmp_path))
    written = tmp_path / "gpu_check.json"
    deadline = time.monotonic() + 300
    while not written.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # written once the environment stage is done
    if proc.poll() is not None:
        pytest.fail(f"the run ended before it could be stopped: {proc.communicate()[1][-2000:]}")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    doc = json.loads(written.read_text())
    assert doc["stages"]["environment"]["ok"] is True
    assert "serving" not in doc["stages"] and doc["ok"] is False
    assert "all stages passed: False" in (tmp_path / "gpu_check.md").read_text()
