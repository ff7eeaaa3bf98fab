"""Results tables rendered from the result files they cite, so a quoted number is the record's
number (issue 33, item 2).

A table row is one workload at one budget: Full KV, PASK with its paired difference to Full KV
(95 % bootstrap interval, McNemar p), ``int4`` (what a q4_0 KV cache gives users), the best
policy that does not use the parser's labels, PASK paired against that best policy, and PASK's
measured B. Cells come from the harness's JSON (``summaries`` and ``paired_vs_full``, as
``eval/harness_report.py`` writes them); the pairing against the best policy comes from the
per-case rows beside it (``.jsonl``, ``eval/paired.py``, the same seed as every report). A file
that is missing or lacks a policy leaves its cell or row out, never filled in.

The README holds its tables between ``<!-- results-table: NAME -->`` and
``<!-- /results-table -->``; ``python -m pask_agent.eval.results_table`` rewrites them from
the files (``--check`` only compares), and a test fails when they differ.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pask_agent.errors import ConfigError
from pask_agent.eval.paired import PairedComparison, compare_paired

# policies that use the parser's labels; "best without labels" is the best of the rest
STRUCTURED = frozenset({"pask", "pask_hand", "pask_release"})
HEADER = (
    "| workload | cases | B | Full KV | PASK (vs Full KV) | `int4` | best without labels (of n) "
    "| PASK vs that best | PASK measured B mean (max) | file |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
)
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class TableSource:
    """One result file's rows: ``label`` names the workload and which cases, ``path`` is the
    harness JSON, ``link`` the path the row links to, and ``budgets`` the budgets to show (all
    the file holds when ``None``)."""

    label: str
    path: Path
    link: str
    budgets: tuple[float, ...] | None = None


# The README's tables: name -> rows in order. Paths relative to the repository root.
README_TABLES: dict[str, tuple[tuple[str, str, tuple[float, ...] | None], ...]] = {
    "headline": (
        ("BFCL non-live test, first 50 per category", "results/bfcl_test_floor", None),
        (
            "BFCL test, after the first 50 per category",
            "results/fresh/bfcl_test_after50_b020_rankings_paired",
            None,
        ),
        (
            "BFCL test, after the first 100 (never scored before)",
            "results/fresh/bfcl_test_fresh_sweep_paired",
            (0.25, 0.15, 0.10),
        ),
        ("Text-to-SQL test, 5 candidates", "results/sql_b033_linked/paired", (0.33,)),
        ("Text-to-SQL test, 5 candidates", "results/sql_b020_linked/paired", None),
    ),
}


def readme_sources(name: str, root: Path = ROOT) -> list[TableSource]:
    """The sources of the README's table ``name``; an unknown name is a ``ConfigError``."""
    if name not in README_TABLES:
        raise ConfigError(f"no README table {name!r}; known: {', '.join(README_TABLES)}")
    return [
        TableSource(label, _json_of(root / stem), _link_of(root, stem), budgets)
        for label, stem, budgets in README_TABLES[name]
    ]


def _json_of(stem: Path) -> Path:
    """A bfcl run's ``<stem>.json``, or a SQL run's ``<stem>/sql_eval.json``."""
    return stem / "sql_eval.json" if stem.is_dir() else stem.with_suffix(".json")


def _link_of(root: Path, stem: str) -> str:
    return f"{stem}/sql_eval.md" if (root / stem).is_dir() else f"{stem}.md"


def results_table(sources: Sequence[TableSource]) -> str:
    """The table of every source's rows (header included); empty when no source has a row."""
    rows = [row for src in sources if src.path.exists() for row in _rows(src)]
    return "\n".join([HEADER, *rows]) if rows else ""


def _rows(src: TableSource) -> list[str]:
    data: Mapping[str, Any] = json.loads(src.path.read_text())
    summaries = data.get("summaries", [])
    full = next((s for s in summaries if s["policy"] == "full"), None)
    if full is None:
        return []
    # only rows on every case Full KV answered: a policy run on a subset is not comparable
    same = [s for s in summaries if s["policy"] != "full" and s["cases"] == full["cases"]]
    paired = data.get("paired_vs_full", {})
    budgets = sorted({s["budget"] for s in same}, reverse=True)
    if src.budgets is not None:
        budgets = [b for b in budgets if any(abs(b - w) < 1e-9 for w in src.budgets)]
    correct = _per_case(src.path.with_suffix(".jsonl"))
    out = []
    for budget in budgets:
        at = [s for s in same if abs(s["budget"] - budget) < 1e-9]
        pask = next((s for s in at if s["policy"] in STRUCTURED), None)
        int4 = next((s for s in at if s["policy"] == "int4"), None)
        others = [s for s in at if s["policy"] not in STRUCTURED]
        best = max(others, key=_score, default=None)
        pask_cell, versus, b_cell = "–", "–", "–"
        if pask is not None:
            pair = paired.get(pask["label"])
            pask_cell = _pct(pask) + (f" ({_interval(pair)})" if pair else "")
            b_cell = f"{pask['mean_b']:.3f} ({pask['max_b']:.3f})"
            ours = correct.get((pask["policy"], pask["budget"]))
            theirs = correct.get((best["policy"], best["budget"])) if best else None
            if ours and theirs:
                versus = _interval(compare_paired(ours, theirs))
        int4_cell = _pct(int4) if int4 else "–"
        best_cell = f"`{best['policy']}` {_pct(best)} (of {len(others)})" if best else "–"
        shown = Path(src.link).name if not src.link.endswith("sql_eval.md") else src.link
        link = f"[`{shown.removeprefix('results/')}`]({src.link})"
        out.append(
            f"| {src.label} | {full['cases']} | {budget:.2f} | {_pct(full)} | {pask_cell} | "
            f"{int4_cell} | {best_cell} | {versus} | {b_cell} | {link} |"
        )
    return out


def _per_case(rows: Path) -> dict[tuple[str, float], dict[str, bool]]:
    """``(policy, budget) -> {case id: correct}`` from a run's rows (empty when absent)."""
    out: dict[tuple[str, float], dict[str, bool]] = {}
    if rows.exists():
        for line in rows.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                out.setdefault((r["policy"], r["budget"]), {})[str(r["id"])] = bool(r["correct"])
    return out


def _interval(pair: PairedComparison | Mapping[str, Any]) -> str:
    """``difference [low, high], p`` in points, from a comparison or its JSON form."""
    d = pair if isinstance(pair, Mapping) else asdict(pair)
    return (
        f"{_signed(d['difference'])} [{_signed(d['ci_low'])}, {_signed(d['ci_high'])}], "
        f"p {_p(d['p_value'])}"
    )


def _score(summary: Mapping[str, Any]) -> tuple[float, str]:
    return summary["overall"], summary["policy"]  # ties go the same way every time


def _pct(summary: Mapping[str, Any]) -> str:
    return f"{100 * summary['overall']:.1f}"


def _signed(x: float) -> str:
    return f"{100 * x:+.1f}".replace("-", "−")


def _p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"= {p:.2g}"


_BLOCK = re.compile(r"(<!-- results-table: ([\w-]+) -->\n)(.*?)(<!-- /results-table -->)", re.S)


def render_readme(text: str, root: Path = ROOT) -> str:
    """``text`` with every marked table rendered from its sources."""

    def fill(m: re.Match[str]) -> str:
        table = results_table(readme_sources(m.group(2), root))
        return m.group(1) + (table + "\n" if table else "") + m.group(4)

    return _BLOCK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pask_agent.eval.results_table", description=__doc__)
    p.add_argument("--readme", type=Path, default=ROOT / "README.md")
    p.add_argument("--check", action="store_true", help="exit 1 if the README differs")
    args = p.parse_args(argv)
    text = args.readme.read_text(encoding="utf-8")
    rendered = render_readme(text)
    if rendered == text:
        return 0
    if args.check:
        print(f"{args.readme}: results tables differ from the files they cite", file=sys.stderr)
        return 1
    args.readme.write_text(rendered, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
