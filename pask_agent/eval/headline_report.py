"""What ``pask-agent eval headline`` leaves beside its stages' files: the index of the output
folder (``<out>/README.md``, one line a file) and the headline table the README quotes,
rendered from the stages' JSON so the README's numbers are the record's numbers.

The table reads the harness's JSON (``summaries`` and ``paired_vs_full``, as
``eval/harness_report.py`` writes them) of the BFCL and SQL stages; a workload whose file is
missing is left out, never filled in from elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# workload label -> the stage's JSON under the output folder
TABLE_SOURCES: tuple[tuple[str, str], ...] = (
    ("BFCL non-live", "bfcl.json"),
    ("Text-to-SQL", "sql/sql_eval.json"),
)
# policies that use the parser's labels; the "best other" column is the best of the rest
STRUCTURED = frozenset({"pask", "pask_hand"})


def write_index(out: Path, manifest: Mapping[str, Any], stages: Sequence[Any]) -> Path:
    """``<out>/README.md``: one line per stage that wrote files there (its files, what it
    measures, its command, commit and wall time, from the manifest), then any file no stage
    claims, so nothing in the folder goes unlisted."""
    entries = manifest.get("stages", {})
    files: dict[str | None, list[str]] = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        rel = path.relative_to(out).as_posix()
        if rel not in ("README.md", "headline.json") and not rel.endswith(".tmp"):
            files.setdefault(_owner(rel, {s.name: s for s in stages}), []).append(rel)
    profile = manifest.get("profile", "?")
    lines = [
        f"# Current results ({profile} profile)",
        "",
        (
            "Written by `pask-agent eval headline --quick`: SmolLM2 at smoke size, a check of "
            "the pipeline, not results."
            if profile == "quick"
            else "Written by `pask-agent eval headline`."
        )
        + " Each stage's files also carry their own command, commit and machine; "
        "`headline.json` holds the manifest.",
        "",
        f"Machine: {manifest.get('machine', '?')}",
        "",
        "| stage | files | measures (full profile) | command | commit | wall |",
        "|---|---|---|---|---|---|",
    ]
    for stage in stages:
        if stage.name not in files:
            continue
        entry = entries.get(stage.name, {})
        listed = ", ".join(f"`{f}`" for f in files[stage.name])
        commit = str(entry.get("git_commit", ""))
        commit = commit[:12] + (" (dirty)" if commit.endswith("+dirty") else "")
        wall = f"{entry['seconds'] / 60:.1f} min" if "seconds" in entry else ""
        lines.append(
            f"| {stage.name} | {listed} | {stage.what} | `{entry.get('command', '')}` | "
            f"{commit} | {wall} |"
        )
    for rel in files.get(None, []):
        lines.append(f"| – | `{rel}` | not written by a headline stage | | | |")
    index = out / "README.md"
    index.write_text("\n".join(lines) + "\n")
    return index


def _owner(rel: str, stages: Mapping[str, Any]) -> str | None:
    """The stage whose ``--out`` produced ``rel`` (a stem's files or a folder's)."""
    for name, stage in stages.items():
        target = stage.out
        stem = target.rsplit(".", 1)[0] if target.endswith(".json") else target
        if rel == target or rel.startswith(stem + ".") or rel.startswith(stem + "/"):
            return name
    return None


def headline_table(out: Path) -> str:
    """The README's results table from ``out``'s BFCL and SQL JSON: Full KV, then per budget
    PASK (paired difference to Full KV with its 95 % interval and McNemar p), the best policy
    that does not use the parser's labels, and PASK's measured B mean (max)."""
    rows = []
    for label, rel in TABLE_SOURCES:
        path = out / rel
        if path.exists():
            rows.extend(_workload_rows(label, json.loads(path.read_text()), rel))
    header = (
        "| workload | B | Full KV | PASK (vs Full KV) | best without labels | "
        "PASK measured B mean (max) | file |\n|---|---:|---:|---:|---:|---:|---|"
    )
    return "\n".join([header, *rows]) if rows else ""


def _workload_rows(label: str, data: Mapping[str, Any], rel: str) -> list[str]:
    summaries = data.get("summaries", [])
    full = next((s for s in summaries if s["policy"] == "full"), None)
    if full is None:
        return []
    paired = data.get("paired_vs_full", {})
    cases = f"{label}, {full['cases']} {data.get('settings', {}).get('split', '')} cases"
    out = []
    for budget in sorted({s["budget"] for s in summaries if s["policy"] != "full"}):
        at = [s for s in summaries if s["budget"] == budget and s["policy"] != "full"]
        pask = next((s for s in at if s["policy"] in STRUCTURED), None)
        others = [s for s in at if s["policy"] not in STRUCTURED]
        best = max(others, key=lambda s: s["overall"], default=None)
        pask_cell, b_cell = "–", "–"
        if pask is not None:
            pair = paired.get(pask["label"], {})
            diff = (
                f" ({_signed(pair['difference'])} [{_signed(pair['ci_low'])}, "
                f"{_signed(pair['ci_high'])}], p = {pair['p_value']:.2f})"
                if pair else ""
            )  # fmt: skip
            pask_cell = f"{100 * pask['overall']:.1f}{diff}"
            b_cell = f"{pask['mean_b']:.3f} ({pask['max_b']:.3f})"
        best_cell = f"{best['policy']} {100 * best['overall']:.1f}" if best else "–"
        out.append(
            f"| {cases} | {budget:.2f} | {100 * full['overall']:.1f} | {pask_cell} | "
            f"{best_cell} | {b_cell} | [`{rel}`]({rel}) |"
        )
    return out


def _signed(x: float) -> str:
    return f"{100 * x:+.1f}".replace("-", "−")
