"""What ``SQLiteAssistant.ask`` returns: the chosen query, its rows, the vote, and what the
question cost over all its candidates and repair turns."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pask_agent.integrations.sql_vote import SqlCandidate
from pask_agent.runtime.turns.results import Usage


@dataclass(frozen=True, slots=True)
class SqlUsage:
    """What one ``ask`` cost, over all its candidates and repair turns.

    Token counts and KV bytes are sums over the candidates' final requests; ``measured_b`` is
    their summed KV payload over their summed Full-KV bytes, and ``max_measured_b`` the worst
    single candidate's (a budget holds per request, so that is the number to check it against).
    ``seconds`` is the wall time of the whole ask, decoding and execution. The prompts' part of
    the KV bytes gives the realized B_P and B_D; ``tag_counts`` sums the generated tokens per
    structural bucket (``Usage.tag_counts``, where tagger fallbacks are counted).
    """

    candidates: int
    prompt_tokens: int
    completion_tokens: int
    prefilled_tokens: int
    kv_bytes: int
    full_kv_bytes: int
    measured_b: float
    max_measured_b: float
    peak_kv_bytes: int
    seconds: float
    prompt_kv_bytes: int = 0
    prompt_full_kv_bytes: int = 0
    tag_counts: dict[str, int] = field(default_factory=dict)

    @property
    def tagger_fallbacks(self) -> int:
        return self.tag_counts.get("tagger_fallback", 0)

    @classmethod
    def of(cls, usages: list[Usage], seconds: float) -> SqlUsage:
        full = sum(u.full_kv_bytes for u in usages)
        kv = sum(u.kv_bytes for u in usages)
        return cls(
            len(usages),
            sum(u.prompt_tokens for u in usages),
            sum(u.completion_tokens for u in usages),
            sum(u.prefilled_tokens for u in usages),
            kv,
            full,
            kv / full if full else 0.0,
            max((u.measured_b for u in usages), default=0.0),
            sum(u.peak_kv_bytes for u in usages),
            seconds,
            sum(u.prompt_kv_bytes for u in usages),
            sum(u.prompt_full_kv_bytes for u in usages),
            dict(sum((Counter(u.tag_counts) for u in usages), Counter())),
        )

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class SqlAnswer:
    """The chosen query and what it returned, with every candidate that was considered.

    ``sql`` is the winning candidate's query (the greedy one when every candidate failed);
    ``error`` is set, and ``rows`` empty, only when every candidate failed. ``candidates``
    holds each candidate's SQL, result digest, votes and error, greedy first. ``failed`` lists
    the chosen candidate's earlier attempts that SQLite refused, as ``(sql, error)``.
    """

    question: str
    sql: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    truncated: bool
    error: str | None
    usage: SqlUsage
    candidates: tuple[SqlCandidate, ...] = ()
    failed: tuple[tuple[str, str], ...] = ()

    def table(self, max_rows: int = 20) -> str:
        """The rows as a plain-text table (for terminals and logs)."""
        if self.error:
            return f"error: {self.error}"
        header = list(self.columns)
        body = [["NULL" if v is None else str(v) for v in row] for row in self.rows[:max_rows]]
        widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(header)]
        lines = [" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
        lines.append("-+-".join("-" * w for w in widths))
        lines += [" | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in body]
        more = len(self.rows) - len(body)
        if more > 0 or self.truncated:
            lines.append(f"... {more if more > 0 else 'more'} rows not shown")
        return "\n".join(lines)
