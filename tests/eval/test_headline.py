"""``pask-agent eval headline``: its stages, its refusals, a real stage run twice (the second
time kept from the manifest), the output folder's index, and the README table rendered from
a real results file."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from pask_agent.cli import main as cli_main
from pask_agent.errors import ConfigError
from pask_agent.eval.headline import STAGE_NAMES, STAGES, Manifest, preflight, run_headline, select
from pask_agent.eval.headline_report import headline_table

ROOT = Path(__file__).resolve().parents[2]


def test_stages_run_eval_commands_that_exist() -> None:
    """Every stage's module is importable, and where its parser can be built without running
    it (the harness evals, ``pask-agent bench``), both profiles' arguments parse."""
    import argparse
    import importlib
    import shlex

    from pask_agent.cli import build_parser

    assert len(set(STAGE_NAMES)) == len(STAGES)
    parsed = 0
    for stage in STAGES:
        module = importlib.import_module(stage.module)
        assert hasattr(module, "main"), stage.module
        for args in (stage.full, stage.quick):
            if args is None:
                continue
            argv = [*shlex.split(args), "--out", "x"]
            if stage.module == "pask_agent.cli":
                build_parser().parse_args(argv)
            elif hasattr(module, "add_arguments"):
                parser = argparse.ArgumentParser()
                module.add_arguments(parser)
                parser.parse_args(argv)
            else:
                continue
            parsed += 1
    assert parsed >= 10  # bfcl, sql, agent, extract, bench in both profiles; the peers' full


def test_select_keeps_order_and_refuses_unknown_or_quickless_stages() -> None:
    assert [s.name for s in select(None, None, quick=False)] == list(STAGE_NAMES)
    quick = [s.name for s in select(None, None, quick=True)]
    assert "kvpress" not in quick and "bench_peers" not in quick and quick[0] == "bfcl"
    assert [s.name for s in select("sql,bfcl", None, quick=False)] == ["bfcl", "sql"]
    assert "soak" not in [s.name for s in select(None, "soak", quick=False)]
    with pytest.raises(ConfigError, match="unknown stage"):
        select("bfcl,nope", None, quick=False)
    with pytest.raises(ConfigError, match="no --quick form"):
        select("kvpress", None, quick=True)
    with pytest.raises(ConfigError, match="no stage left"):
        select("soak", "soak", quick=False)


def test_a_peer_that_is_not_built_is_refused_before_any_work(tmp_path: Path) -> None:
    (kvpress,) = select("kvpress", None, quick=False)
    with pytest.raises(ConfigError, match="make peer-kvpress"):
        preflight([kvpress], tmp_path)  # an empty tree: no .peers/
    (tmp_path / ".peers/kvpress/venv").mkdir(parents=True)
    preflight([kvpress], tmp_path)


def test_a_manifest_of_the_other_profile_needs_restart(tmp_path: Path) -> None:
    path = tmp_path / "headline.json"
    path.write_text(json.dumps({"profile": "full", "stages": {}}))
    with pytest.raises(ConfigError, match="--restart"):
        Manifest(path, "quick", restart=False)
    assert Manifest(path, "quick", restart=True).data == {"profile": "quick", "stages": {}}


def test_list_prints_every_quick_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["eval", "headline", "--quick", "--list"]) == 0
    printed = capsys.readouterr().out
    for stage in select(None, None, quick=True):
        assert f"{stage.name}: " in printed and f"--out results/current/{stage.out}" in printed
    assert cli_main(["eval", "headline", "--only", "nope"]) == 2  # a typed error, exit 2


def test_quick_peak_stage_runs_then_is_kept_and_indexed(tmp_path: Path) -> None:
    """A real stage (SmolLM2, its own process) writes its file with provenance; the rerun at
    the same commit keeps it without running; the index lists the file with its command."""
    stages = select("peak", None, quick=True)
    ran: list[list[str]] = []
    logs: list[str] = []

    def runner(argv: list[str]) -> int:
        import subprocess

        ran.append(argv)
        return subprocess.run(argv, cwd=ROOT, check=False).returncode

    manifest = run_headline(stages, tmp_path, quick=True, runner=runner, log=logs.append)
    entry = manifest["stages"]["peak"]
    assert entry["status"] == "done" and entry["exit_code"] == 0 and entry["seconds"] > 0
    assert ran[0][:3] == [sys.executable, "-m", "pask_agent.eval.peak"]
    written = json.loads((tmp_path / "peak.json").read_text())
    runs = written if isinstance(written, list) else [written]
    assert all("git_commit" in r and "machine" in r for r in runs)
    index = (tmp_path / "README.md").read_text()
    assert "| peak | `peak.json` |" in index and "pask_agent.eval.peak" in index

    again = run_headline(stages, tmp_path, quick=True, runner=runner, log=logs.append)
    assert len(ran) == 1 and again["stages"]["peak"] == entry
    assert any("done at this commit, kept" in line for line in logs)


def test_readme_table_renders_the_record(tmp_path: Path) -> None:
    """The table's cells are the JSON's numbers (the README's BFCL run, copied as a stage's
    output), and a workload without its file is left out."""
    shutil.copy(ROOT / "results/bfcl_test_floor.json", tmp_path / "bfcl.json")
    data = json.loads((tmp_path / "bfcl.json").read_text())
    table = headline_table(tmp_path)
    lines = table.splitlines()
    assert len(lines) == 3 and "Text-to-SQL" not in table  # header, rule, one budget
    full = next(s for s in data["summaries"] if s["policy"] == "full")
    pask = next(s for s in data["summaries"] if s["policy"] == "pask")
    pair = data["paired_vs_full"][pask["label"]]
    row = lines[2]
    assert f"| 0.33 | {100 * full['overall']:.1f} |" in row
    assert f"{100 * pask['overall']:.1f} (" in row and f"p = {pair['p_value']:.2f}" in row
    assert f"{pask['mean_b']:.3f} ({pask['max_b']:.3f})" in row
    assert "| `mikv` 62.5 (of 1) |" in row  # the best policy without the parser's labels
    assert headline_table(tmp_path / "empty") == ""
