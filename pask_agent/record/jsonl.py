"""JSON Lines input: each non-blank line parsed, with ``path:line`` for the caller's errors.

Why one reader: traces, known SQL queries and question sets are all JSON Lines written by
people and tools; a bad line must be reported the same way everywhere (its file and line
number, and what is wrong), and blank lines (an editor's trailing newline) skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pask_agent.errors import PaskError


def json_lines(path: Path, error: type[PaskError]) -> Iterator[tuple[str, Any]]:
    """``("path:line", value)`` per non-blank line of an existing file.

    Raises
    ------
    error
        A line is not JSON (``path:line: not JSON (...)``).
    """
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(f"{path}:{n}: not JSON ({exc.msg} at char {exc.pos})") from exc
            yield f"{path}:{n}", value
