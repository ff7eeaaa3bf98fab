"""Every Python snippet in the README runs as written, in a fresh interpreter, on the real model.

The snippets are the documentation of the entry points (``Runtime``, ``PaskChatModel``,
``SQLiteAssistant``); a snippet that no longer runs is a broken promise to a reader.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The server quickstart talks to a running `pask-agent serve`:
# tests/server/test_default_model.py runs it against one.
SERVER_URL = "http://127.0.0.1:8000/v1"
BLOCKS = [
    block
    for block in re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.M | re.S)
    if SERVER_URL not in block
]
# What each snippet must print, keyed by a line that identifies it.
EXPECTED = {
    'Runtime.open("default", policy="pask", budget=0.33)': "origin=",
    "PaskChatModel(max_tokens=64).bind_tools": "46",
    "with_structured_output(City)": "name='Paris'",
    'rt.call(City, "Tell me about Kyoto.")': "Kyoto",
    'SQLiteAssistant("recipes/data/shop.sqlite", runtime=rt)': "SELECT",
    "known_queries=known": "CASE WHEN",
    "RuntimeConfig(record_traces=str(path))": '"name": "get_weather"',
}


def test_every_snippet_is_checked() -> None:
    assert len(BLOCKS) == len(EXPECTED)
    for block in BLOCKS:
        assert sum(key in block for key in EXPECTED) == 1, block[:200]


@pytest.mark.slow
@pytest.mark.parametrize("key", list(EXPECTED))
def test_snippet_runs_as_written(key: str) -> None:
    (code,) = [b for b in BLOCKS if key in b]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert EXPECTED[key] in done.stdout, done.stdout[-2000:]
