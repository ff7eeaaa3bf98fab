"""What ``pask-agent eval headline`` leaves beside its stages' files: the index of the output
folder (``<out>/README.md``, one line a file) and the headline table the README quotes,
rendered from the stages' JSON so the README's numbers are the record's numbers.

The table reads the harness's JSON (``summaries`` and ``paired_vs_full``, as
``eval/harness_report.py`` writes them) of the BFCL and SQL stages; a workload whose file is
missing is left out, never filled in from elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pask_agent.eval.results_table import TableSource, results_table

# workload label -> the stage's JSON under the output folder
TABLE_SOURCES: tuple[tuple[str, str], ...] = (
    ("BFCL non-live", "bfcl.json"),
    ("Text-to-SQL", "sql/sql_eval.json"),
)


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
    """The README's results table from ``out``'s BFCL and SQL JSON (``eval/results_table.py``
    says what each cell is); a workload whose file is missing is left out."""
    return results_table([TableSource(label, out / rel, rel) for label, rel in TABLE_SOURCES])
