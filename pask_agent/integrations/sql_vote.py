"""Choosing among candidate queries by what they return (execution-guided selection).

Why: a small model's greedy query is often wrong in a way its own samples are not; queries
that are written differently but mean the same thing return the same rows, while mistakes
scatter. So the assistant decodes several candidates, runs each read-only, and answers with
the result set most candidates agree on (self-consistency over execution results, as in
MBR-exec and the execution-guided decoding of BIRD/Spider systems). A candidate SQLite refuses
never wins while another one runs, and ties go to the earliest candidate (greedy is first), so
one candidate is plain greedy decoding.

Result sets are compared as sets of rows, BIRD's rule, with floats rounded to 6 decimals so that
``AVG(x)`` and ``SUM(x) / COUNT(x)`` agree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pask_agent.integrations.sql_db import QueryResult
from pask_agent.runtime.turns.results import Usage

_FLOAT_DECIMALS = 6


@dataclass(frozen=True, slots=True)
class SqlCandidate:
    """One decoded query and how it ran.

    ``digest`` identifies its result set (``None`` when it failed); ``votes`` is how many
    candidates returned the same result set (0 for a failed one); ``empty`` says the result
    had no rows or only NULLs; ``failed`` lists the attempts SQLite refused before this one,
    when repairs are on; ``usage`` is its final request's.
    """

    sql: str
    digest: str | None
    votes: int
    error: str | None
    seed: int | None
    usage: Usage
    failed: tuple[tuple[str, str], ...] = ()
    empty: bool = False


def _normalized(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, _FLOAT_DECIMALS) + 0.0  # + 0.0 folds -0.0 into 0.0
    return value


def result_digest(result: QueryResult) -> str:
    """A short hash of the result as a set of rows (order and duplicates ignored)."""
    rows = {tuple(_normalized(v) for v in row) for row in result.rows}
    text = repr(sorted(rows, key=repr)) + ("+more" if result.truncated else "")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def is_empty(result: QueryResult) -> bool:
    """No rows, or nothing but NULLs (``SELECT AVG(x) ... WHERE <matches nothing>``)."""
    return all(v is None for row in result.rows for v in row)


def tally(
    digests: Sequence[str | None], empty: Sequence[bool] | None = None
) -> tuple[list[int], int | None]:
    """Votes per candidate and the index of the winner (``None`` when every one failed).

    The winner's result set is non-empty if any candidate's is (``empty`` marks the empty
    ones) and has the most votes among those; among equal counts, the one whose first
    candidate comes earliest wins, so greedy (candidate 0) breaks ties.
    """
    flags = [False] * len(digests) if empty is None else list(empty)
    if len(flags) != len(digests):
        raise ValueError(f"{len(digests)} digests but {len(flags)} empty flags")
    counts: dict[str, int] = {}
    for d in digests:
        if d is not None:
            counts[d] = counts.get(d, 0) + 1
    votes = [counts[d] if d is not None else 0 for d in digests]
    rank = [(not e, v) for e, v in zip(flags, votes, strict=True)]
    best: int | None = None
    for i, v in enumerate(votes):
        if v > 0 and (best is None or rank[i] > rank[best]):
            best = i
    return votes, best
