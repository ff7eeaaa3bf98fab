"""Every Python snippet in the README and in docs/ runs as written, in a fresh interpreter (one for
all of them, each snippet in its own namespace), on the real model.

The snippets are the documentation of the entry points (``Runtime``, ``PaskChatModel``,
``create_agent``, ``SQLiteAssistant``, the policies, the typed errors); a snippet that no longer
runs is a broken promise to a reader.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

# its subprocesses load the default model: this worker's copy goes meanwhile
pytestmark = pytest.mark.usefixtures("no_default_model_here")

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The server quickstart talks to a running `pask-agent serve`:
# tests/server/test_default_model.py runs it against one.
SERVER_URL = "http://127.0.0.1:8000/v1"
BLOCKS = [
    (doc.relative_to(ROOT).as_posix(), block)
    for doc in DOCUMENTS
    for block in re.findall(r"^```python\n(.*?)^```", doc.read_text(), re.M | re.S)
    if SERVER_URL not in block
]
# What each snippet must print, keyed by a line that identifies it.
EXPECTED = {
    'Runtime.open("default", policy="pask", budget=0.33)': "origin=",
    "agent = create_agent(": "46",
    'SQLiteAssistant("recipes/data/shop.sqlite", runtime=rt)': "SELECT",
    "RuntimeConfig(record_traces=str(path))": '"name": "get_weather"',
    'for policy in ("full", "streaming", "mikv")': "streaming: measured B",
    "PaskChatModel(max_tokens=64).bind_tools": "46",
    "with_structured_output(City)": "name='Paris'",
    "known_queries=known": "CASE WHEN",
    'Runtime.open("default", policy="pask", budget=0)': "ConfigError: budget 0",
}


def test_every_snippet_is_checked() -> None:
    """Each Python block of README.md and docs/*.md has exactly one entry in EXPECTED."""
    assert len(BLOCKS) == len(EXPECTED), [doc for doc, _ in BLOCKS]
    for doc, block in BLOCKS:
        assert sum(key in block for key in EXPECTED) == 1, (doc, block[:200])


def test_the_docs_use_only_top_level_imports() -> None:
    """A reader copies what the docs show: they import from ``pask_agent`` (and its errors),
    never from internal modules that move when the package is reorganised."""
    for doc, block in BLOCKS:
        internal = re.findall(r"^from (pask_agent\.\S+) import", block, re.M)
        assert set(internal) <= {"pask_agent.errors"}, (doc, internal)


# One interpreter runs every block, each in a namespace of its own as `python -c` would give it:
# the default model then loads once for all of them (nine loads cost minutes of the suite), and a
# snippet that only works first in a process would show here as it would in a user's notebook.
DRIVER = """
import contextlib, ctypes, gc, io, json, sys, traceback
blocks, out = json.loads(open(sys.argv[1]).read()), {}
for key, code in blocks.items():
    stdout, stderr, status = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            exec(compile(code, f"<snippet {key[:40]}>", "exec"), {"__name__": "__main__"})
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            status = 1
    out[key] = {"status": status, "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}
    gc.collect()  # what the snippet left goes before the next, heap given back to the system
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    open(sys.argv[2], "w").write(json.dumps(out))
"""


@pytest.fixture(scope="module")
def snippet_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("snippets")
    blocks = {key: next(b for _, b in BLOCKS if key in b) for key in EXPECTED}
    (folder / "blocks.json").write_text(json.dumps(blocks))
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(folder / "blocks.json"), str(folder / "runs.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    runs = json.loads((folder / "runs.json").read_text()) if (folder / "runs.json").exists() else {}
    assert runs.keys() == blocks.keys(), ("the driver stopped", done.stderr[-2000:])
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("key", list(EXPECTED))
def test_snippet_runs_as_written(key: str, snippet_runs: dict[str, dict]) -> None:
    ((doc, _),) = [(d, b) for d, b in BLOCKS if key in b]
    run = snippet_runs[key]
    assert run["status"] == 0, (doc, run["stderr"][-2000:])
    assert EXPECTED[key] in run["stdout"], (doc, run["stdout"][-2000:])
