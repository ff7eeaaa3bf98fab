"""``results/`` holds only what its index or the docs cite (issue 33, item 3): a run nobody
cites is an old run, and git history keeps it. A file counts as cited when ``results/README.md``,
README.md or a page of docs/ names it, its ``stem.{...}`` group, or the folder it sits in."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cited(rel: str, text: str) -> bool:
    stem = rel.rsplit(".", 1)[0]
    folder = rel.split("/")[0] + "/" if "/" in rel else None
    return (
        rel in text or f"{stem}.{{" in text or f"{stem}." in text or bool(folder and folder in text)
    )


def test_every_file_in_results_is_cited_by_the_index_or_the_docs() -> None:
    text = "".join(
        p.read_text(encoding="utf-8")
        for p in [ROOT / "results" / "README.md", ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    )
    listed = subprocess.run(
        ["git", "ls-files", "results"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    files = [f.removeprefix("results/") for f in listed if (ROOT / f).is_file()]
    assert files, "git ls-files found no results: run the suite from a git checkout"
    uncited = [f for f in files if f != "README.md" and not _cited(f, text)]
    assert not uncited, f"results/ files no index or doc cites (list or remove them): {uncited}"
