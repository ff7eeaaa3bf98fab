"""How a text-to-SQL answer is scored, and what one run's candidates can tell afterwards.

A question counts as correct when the chosen query's rows equal the gold query's rows: as sets
(BIRD's rule, duplicates ignored) unless the gold query orders its result (a top-level
``ORDER BY``), then as sequences. Floats are compared to 6 decimals. Every candidate is scored
too, so the accuracy of voting among the first k candidates can be read off one run for every
smaller k (``k_curve``, ``revote``), and so can the best any vote could do (``vote_ceiling``).
Rows are the harness's (``eval/harness_rows.py``); the SQL fields live in ``row.detail``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import sqlglot
from sqlglot import exp

from pask_agent.eval.harness_rows import Measured, Row, Scored, fallback_counters

ALL_ROWS = 1_000_000  # scoring compares whole results, not the assistant's row cap
_BINDING_ERRORS = ("no such column", "ambiguous column name")


def gold_orders(sql: str) -> bool:
    """Whether the query orders its result at the top level (then order is scored)."""
    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
    except sqlglot.errors.SqlglotError:
        return " ORDER BY " in sql.upper()
    return isinstance(tree, exp.Query) and tree.args.get("order") is not None


def _norm(rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    return [tuple(round(v, 6) + 0.0 if isinstance(v, float) else v for v in r) for r in rows]


def results_match(predicted: Any, gold: Any, *, ordered: bool) -> bool:
    """Rows equal as sequences when the gold query orders, else as sets (BIRD's rule)."""
    p, g = _norm(predicted.rows), _norm(gold.rows)
    return p == g if ordered else set(p) == set(g)


def score_answer(
    db: Any, gold_sql: str, answer: Any, detail: dict[str, Any], shown: frozenset[str]
) -> Scored:
    """Compare the answer and each candidate with the gold rows (``db`` is the question's
    read-only database); ``detail`` holds the row's question fields; ``shown`` the digests of
    the results of the examples the prompt showed, so a question they answer is marked."""
    from pask_agent.integrations.sql_db import SqlExecutionError

    ordered = gold_orders(gold_sql)
    gold = db.query(gold_sql, row_limit=ALL_ROWS)
    right: dict[str, bool] = {}
    candidates = []
    for c in answer.candidates:
        ok = False
        if c.error is None:
            if c.sql not in right:
                try:
                    rows = db.query(c.sql, row_limit=ALL_ROWS)
                    right[c.sql] = results_match(rows, gold, ordered=ordered)
                except SqlExecutionError:  # past the time limit once the row cap is lifted
                    right[c.sql] = False
            ok = right[c.sql]
        candidates.append(
            {"sql": c.sql, "digest": c.digest, "votes": c.votes, "error": c.error,
             "empty": c.empty, "correct": ok}
        )  # fmt: skip
    from pask_agent.integrations.sql_vote import result_digest

    u = answer.usage
    measured = Measured.values(
        prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
        kv_bytes=u.kv_bytes, full_kv_bytes=u.full_kv_bytes,
        measured_b=round(u.max_measured_b, 4), pooled_b=round(u.measured_b, 4),
        prompt_kv_bytes=u.prompt_kv_bytes, prompt_full_kv_bytes=u.prompt_full_kv_bytes,
        fallbacks=fallback_counters(u), tag_counts=dict(u.tag_counts),
    )  # fmt: skip
    detail = {
        **detail, "predicted_sql": answer.sql, "repairs": len(answer.failed),
        "candidates": candidates,
        "example_match": result_digest(gold) in shown,
    }  # fmt: skip
    correct = answer.error is None and right.get(answer.sql, False)
    return Scored(correct, answer.error is None, answer.error or "", measured, detail)


def display_name(row: Row) -> str:
    """The configuration as SQL reports name it: ``pask@0.33 k=5`` (budget after the policy)."""
    if row.policy == "full":
        return row.config
    return re.sub(r"^(\S+)", lambda m: f"{m.group(1)}@{row.budget:g}", row.config, count=1)


def candidates_of(row: Row) -> list[dict[str, Any]]:
    return list(row.detail.get("candidates", []))


def is_binding_error(error: str | None) -> bool:
    """SQLite's refusal of a column its query's tables do not have (or have twice)."""
    return bool(error) and any(e in error for e in _BINDING_ERRORS)


def binding_errors(rows: Sequence[Row]) -> dict[str, int]:
    """Candidates and chosen answers that SQLite refused for a column-to-table slip."""
    cands = [c for r in rows for c in candidates_of(r)]
    return {
        "candidates": sum(is_binding_error(c["error"]) for c in cands),
        "candidates_total": len(cands),
        "candidates_refused": sum(c["error"] is not None for c in cands),
        "answers": sum(is_binding_error(r.error) for r in rows),
    }


def accuracy(hits: Iterable[bool]) -> dict[str, Any]:
    hits = list(hits)
    ok = sum(hits)
    return {"n": len(hits), "correct": ok, "accuracy": round(ok / len(hits), 4) if hits else None}


def revote(row: Row, k: int) -> Row:
    """The row as a run with only its first ``k`` candidates would have scored it: the same
    vote (``tally``) over fewer candidates. ``measured_b`` stays the whole run's worst
    candidate's, an upper bound for the first ``k``."""
    from pask_agent.integrations.sql_vote import tally

    cands = [dict(c) for c in candidates_of(row)[:k]]
    votes, best = tally([c["digest"] for c in cands], [c.get("empty", False) for c in cands])
    for c, v in zip(cands, votes, strict=True):
        c["votes"] = v
    chosen = cands[0] if best is None else cands[best]
    error = (chosen["error"] or "") if best is None else ""
    return replace(
        row,
        config=re.sub(r"\bk=\d+", f"k={len(cands)}", row.config),
        correct=best is not None and bool(chosen["correct"]),
        valid_call=best is not None,
        error=error,
        detail={**row.detail, "predicted_sql": chosen["sql"], "candidates": cands},
    )


def k_curve(rows: Sequence[Row], ks: Iterable[int]) -> dict[int, float]:
    """Accuracy had only the first k candidates voted (greedy first, seeds in order)."""
    return {
        k: round(sum(revote(r, k).correct for r in rows) / len(rows), 4) if rows else 0.0
        for k in ks
    }


def vote_ceiling(rows: Sequence[Row]) -> dict[str, Any]:
    """Questions where at least one candidate is right: what a perfect choice among the same
    candidates would score. No vote can beat it, so it tells whether an accuracy target is
    out of reach of the candidates themselves rather than of the way they are chosen."""
    return accuracy(r.correct or any(c.get("correct") for c in candidates_of(r)) for r in rows)


def same_candidates(rows: Sequence[Row], baseline: Sequence[Row]) -> dict[str, tuple[int, int]]:
    """Per configuration: candidates whose SQL equals the baseline's candidate of the same
    question and index (the same seed), out of those both runs have. How closely a compressed
    cache follows Full KV, with far less noise than accuracy."""
    base = {r.id: [c["sql"] for c in candidates_of(r)] for r in baseline}
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        theirs = base.get(r.id)
        if theirs is None:
            continue
        pairs = list(zip((c["sql"] for c in candidates_of(r)), theirs, strict=False))
        out[display_name(r)][0] += sum(a == b for a, b in pairs)
        out[display_name(r)][1] += len(pairs)
    return {name: (v[0], v[1]) for name, v in out.items()}
