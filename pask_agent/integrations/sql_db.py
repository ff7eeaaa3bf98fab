"""A SQLite file opened so that nothing can change it: read-only URI, authorizer, limits.

Why three layers: the grammar already allows only ``SELECT`` (paper §3.3), but the database
must stay intact even if a query reached SQLite some other way. ``mode=ro`` makes the
connection read-only at the file level, ``PRAGMA query_only`` refuses writes at the statement
level, and the authorizer refuses every action but reading (no ``ATTACH``, no ``PRAGMA``, no
writes, no schema changes, no ``load_extension`` or file functions). A progress handler
enforces the time limit; rows are capped.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pask_agent.errors import ConfigError, PaskError

# Actions a SELECT needs; everything else (writes, ATTACH, PRAGMA, DDL...) is denied.
_ALLOWED_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)
# Functions that reach outside the database (files, shared libraries), denied by name even
# though reading is allowed: this Python's SQLite disables extension loading, but another
# build may not, and the fileio functions exist wherever that extension is compiled in.
_DENIED_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"})
_PROGRESS_EVERY = 1000  # SQLite VM instructions between time checks


class SqlExecutionError(PaskError):
    """A query was refused (not read-only), ran past its time limit, or failed in SQLite."""


@dataclass(frozen=True, slots=True)
class QueryResult:
    """Rows of one query; ``truncated`` is True when more than ``row_limit`` rows existed."""

    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    truncated: bool
    seconds: float


class ReadOnlyDatabase:
    """One read-only connection to a SQLite file; queries are serialized by a lock.

    Parameters
    ----------
    path
        The database file (must exist).
    time_limit_s, row_limit
        Per-query wall-clock limit and the most rows returned.

    Raises
    ------
    ConfigError
        The file is missing or the limits are not positive.
    """

    def __init__(self, path: str | Path, *, time_limit_s: float = 5.0, row_limit: int = 200):
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"{self.path} does not exist; pass the path of a SQLite file")
        if time_limit_s <= 0 or row_limit < 1:
            raise ConfigError("time_limit_s must be > 0 and row_limit >= 1")
        self.time_limit_s = time_limit_s
        self.row_limit = row_limit
        self._lock = threading.Lock()
        self._deadline = 0.0
        uri = f"{self.path.resolve().as_uri()}?mode=ro"
        self._con = sqlite3.connect(uri, uri=True, check_same_thread=False)
        self._con.execute("PRAGMA query_only = ON")
        self._con.set_authorizer(_authorize)
        self._con.set_progress_handler(self._past_deadline, _PROGRESS_EVERY)

    def _past_deadline(self) -> int:
        return int(time.monotonic() > self._deadline)

    def query(self, sql: str, *, row_limit: int | None = None) -> QueryResult:
        """Run one read-only statement.

        Raises
        ------
        SqlExecutionError
            The statement is refused by the authorizer, is not a single statement, exceeds
            the time limit, or SQLite reports an error.
        """
        limit = self.row_limit if row_limit is None else row_limit
        with self._lock:
            start = time.monotonic()
            self._deadline = start + self.time_limit_s
            try:
                cursor = self._con.execute(sql)
                rows = cursor.fetchmany(limit + 1)
                columns = tuple(d[0] for d in cursor.description or ())
                cursor.close()
            except sqlite3.DatabaseError as exc:
                raise SqlExecutionError(_explain(exc, self.time_limit_s)) from exc
            finally:
                self._con.rollback()
            kept = tuple(tuple(r) for r in rows[:limit])
            return QueryResult(columns, kept, len(rows) > limit, time.monotonic() - start)

    def close(self) -> None:
        with self._lock:
            self._con.close()


def _authorize(action: int, arg1: Any, arg2: Any, db: Any, trigger: Any) -> int:
    if action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK if action in _ALLOWED_ACTIONS else sqlite3.SQLITE_DENY


def _explain(exc: sqlite3.DatabaseError, limit_s: float) -> str:
    text = str(exc)
    if "interrupted" in text:
        return f"the query ran longer than {limit_s} s and was stopped; simplify it"
    if "not authorized" in text or "readonly" in text or "query_only" in text:
        return f"refused: only reading queries may run on this database ({text})"
    return f"SQLite error: {text}"
