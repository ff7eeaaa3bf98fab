"""The reserve ``Γ(s; B_D)`` from reference-trajectory deficits (paper §3.5, App. B.6, E.4).

At token ``u`` of a reference answer, the floors of the next ``h ≤ K`` tokens will cost
``Σ_{j≤h} f_{u+j}`` while the ledger only earns ``h·b`` for them. The worst shortfall over the
horizon, ``S^(K)_u = max_h [Σ_{j≤h} f_{u+j} − h·b]_+``, is what the controller should hold back
at ``u`` so that upcoming protected tokens find their bytes. ``Γ(s)`` is the left β-quantile of
``S^(K)`` over the positions whose parser state is ``s``; unseen states use the pooled one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pask_agent.policy.table_entries import Reserve, ReserveRow


def lookahead_deficits(floor_cost: np.ndarray, budget: float, horizon: int) -> np.ndarray:
    """``S^(K)_u`` for every position ``u`` of one answer; costs in units of ``C_full``."""
    n = len(floor_cost)
    out = np.zeros(n)
    excess = floor_cost - budget
    for u in range(n):
        ahead = np.cumsum(excess[u + 1 : u + 1 + horizon])
        out[u] = max(0.0, float(ahead.max())) if len(ahead) else 0.0
    return out


def left_quantile(values: np.ndarray, beta: float) -> float:
    """The smallest value whose empirical CDF is at least ``beta`` (App. E.4)."""
    ordered = np.sort(values)
    index = max(0, int(np.ceil(beta * len(ordered))) - 1)
    return float(ordered[index])


def fit_reserve(
    answers: Sequence[tuple[np.ndarray, Sequence[str]]],
    budgets: Sequence[float],
    *,
    beta: float = 0.8,
    horizon: int = 8,
) -> Reserve:
    """``answers``: per reference answer, each token's floor cost (``C_full`` units) and its
    parser state (``""`` when untagged). One reserve row per budget."""
    rows = []
    for budget in sorted(set(round(b, 4) for b in budgets)):
        by_state: dict[str, list[float]] = {}
        pooled: list[float] = []
        for cost, states in answers:
            deficits = lookahead_deficits(cost, budget, horizon)
            for s, value in zip(states, deficits, strict=True):
                pooled.append(float(value))
                if s:
                    by_state.setdefault(s, []).append(float(value))
        rows.append(
            ReserveRow(
                budget=budget,
                by_state={
                    s: round(left_quantile(np.array(v), beta), 6)
                    for s, v in sorted(by_state.items())
                },
                pooled=round(left_quantile(np.array(pooled or [0.0]), beta), 6),
            )
        )
    return Reserve(beta=beta, horizon=horizon, rows=rows)
