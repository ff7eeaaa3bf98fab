"""The README's results tables are the record's numbers (issue 33, item 2): rendered from the
result files they link, cell by cell, and checked against the README on every run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pask_agent.errors import ConfigError
from pask_agent.eval.results_table import (
    README_TABLES,
    TableSource,
    main,
    readme_sources,
    render_readme,
    results_table,
)

ROOT = Path(__file__).resolve().parents[2]
RANKINGS = ROOT / "results/fresh/bfcl_test_after50_b020_rankings_paired.json"


def test_the_readme_tables_are_rendered_from_their_files() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in README_TABLES:
        assert f"<!-- results-table: {name} -->" in text, f"README lost its {name} table"
    assert render_readme(text) == text, (
        "README's results tables differ from the files they cite: "
        "run `python -m pask_agent.eval.results_table`"
    )


def test_cells_are_the_files_numbers_and_subsets_are_left_out(tmp_path: Path) -> None:
    """PASK's cell carries its paired interval; the best unlabelled policy is chosen among those
    run on every case (``pask_release`` ran on 110 of the 310 and is in no cell)."""
    data = json.loads(RANKINGS.read_text())
    src = TableSource("BFCL", RANKINGS, "x.md")
    (row,) = results_table([src]).splitlines()[2:]
    by = {s["policy"]: s for s in data["summaries"] if s["cases"] == 310}
    pair = data["paired_vs_full"]["pask @ 0.20"]
    assert row.startswith(f"| BFCL | 310 | 0.20 | {100 * by['full']['overall']:.1f} | ")
    assert f"{100 * by['pask']['overall']:.1f} (−{-100 * pair['difference']:.1f} [" in row
    assert f"| {100 * by['int4']['overall']:.1f} |" in row
    others = [s for p, s in by.items() if p not in ("full", "pask")]
    best = max(others, key=lambda s: (s["overall"], s["policy"]))
    assert f"`{best['policy']}` {100 * best['overall']:.1f} (of {len(others)})" in row
    assert "pask_release" not in row
    # PASK against that best, paired from the rows: the merge's own pairing, seen from PASK
    theirs = data["paired_vs_pask"][best["label"]]
    lead = f"+{-100 * theirs['difference']:.1f} [+{-100 * theirs['ci_high']:.1f}, "
    assert f"| {lead}" in row and f"p = {theirs['p_value']:.2g} |" in row

    # a policy that beats the rest moves into the best column; PASK's own cell is unaffected
    by["keydiff"]["overall"] = 0.99
    data["summaries"] = [*by.values()]
    (tmp_path / "r.json").write_text(json.dumps(data))
    (moved,) = results_table([TableSource("BFCL", tmp_path / "r.json", "x.md")]).splitlines()[2:]
    assert "`keydiff` 99.0" in moved

    only = TableSource("BFCL", RANKINGS, "x.md", budgets=(0.33,))
    assert results_table([only]) == ""  # a budget the file lacks: no row, no header
    assert results_table([TableSource("BFCL", tmp_path / "none.json", "x.md")]) == ""


def test_check_fails_on_a_stale_readme_and_the_rewrite_fixes_it(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    shutil.copy(ROOT / "README.md", readme)
    stale = readme.read_text().replace("| 0.20 | 62.9 |", "| 0.20 | 66.6 |")
    assert stale != readme.read_text()
    readme.write_text(stale)
    assert main(["--readme", str(readme), "--check"]) == 1
    assert main(["--readme", str(readme)]) == 0
    assert readme.read_text() == (ROOT / "README.md").read_text()
    assert main(["--readme", str(readme), "--check"]) == 0


def test_an_unknown_table_is_a_typed_error() -> None:
    with pytest.raises(ConfigError, match="no README table 'nope'; known: headline"):
        readme_sources("nope")
