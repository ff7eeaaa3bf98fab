"""Development selection (paper §3.7): which decode and prompt candidates the dev traces
accept under α, what each costs, and the per-group failure rates the report shows.

``calibrate.py`` runs the stages and measures; this module only chooses among what was
measured, so a choice can be re-derived from a checkpoint without replaying a trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from pask_agent.calibration.buckets import DecodeKeys
from pask_agent.calibration.frontier import (
    THRESHOLD_PAIRS,
    Candidate,
    Sensitivity,
    breadth_first,
    greedy_path,
    path_candidates,
    spread,
)
from pask_agent.calibration.replay import ReplayedTrace
from pask_agent.calibration.worker import PrefillCandidates
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.planner import PrefillPlanner
from pask_agent.policy.stages import solve_stage_budgets
from pask_agent.record.traces import Trace

if TYPE_CHECKING:  # only its sinks and window are read
    from pask_agent.calibration.calibrate import CalibrationConfig


def dev_decode_tokens(dev: list[ReplayedTrace], keys: DecodeKeys) -> np.ndarray:
    tokens = np.zeros(keys.size)
    for r in dev:
        tokens += np.bincount(keys.of_trace(r), minlength=keys.size)
    return tokens


def decode_candidates(
    dec: Sensitivity, dev_tokens: np.ndarray, costs: PayloadCosts, per_path: int
) -> list[Candidate]:
    scores = dec.upgrade_scores(costs)
    seen: set[bytes] = set()
    out: list[Candidate] = []
    for pair in THRESHOLD_PAIRS:
        floors = dec.floors(*pair)
        path = path_candidates(pair, floors, greedy_path(floors, scores), dev_tokens, costs)
        for cand in spread(path, per_path):
            key = cand.floors.tobytes() + cand.actions.tobytes()
            if key not in seen:
                seen.add(key)
                out.append(cand)
    return out


def cheapest_within(candidates: Sequence[Candidate], errors: np.ndarray, alpha: float) -> Candidate:
    """The cheapest candidate whose development failure rate exceeds the reference's (0 by
    construction of the proxy) by at most ``alpha``; ties go to the earlier path point."""
    ok = [i for i, e in enumerate(errors) if e <= alpha + 1e-12]
    if not ok:  # cannot happen: each path ends all-H, which fails nothing
        ok = [int(np.argmin(errors))]
    best = min(ok, key=lambda i: (candidates[i].cost, float(errors[i]), candidates[i].step))
    return candidates[best]


@dataclass(frozen=True)
class PromptCandidate:
    """Floors from one threshold pair, and the order the planner raises tokens above them."""

    pair: tuple[float, float]
    order: str  # "distortion" (paper: D reduction per byte) | "breadth" (every R→L first)
    floors: np.ndarray  # int8 [labels, 3]
    priority: np.ndarray  # [labels, 3, 2]


def prompt_candidates(pre: Sensitivity, costs: PayloadCosts) -> list[PromptCandidate]:
    scores = pre.upgrade_scores(costs)
    orders = {"distortion": scores, "breadth": breadth_first(scores)}
    out: list[PromptCandidate] = []
    for order, priority in orders.items():
        for pair in THRESHOLD_PAIRS:
            floors = pre.floors(*pair)
            if not any(c.order == order and np.array_equal(floors, c.floors) for c in out):
                out.append(PromptCandidate(pair, order, floors, priority))
    return out


def group_weights(groups: Sequence[str]) -> np.ndarray:
    """Per-trace weights summing to 1 that give every group the same total weight."""
    names, index, counts = np.unique(np.asarray(groups, dtype=object).astype(str),
                                     return_inverse=True, return_counts=True)  # fmt: skip
    return 1.0 / (len(names) * counts[index])


def by_group(dev: list[tuple[str, Trace]], failed: np.ndarray) -> dict[str, float]:
    """Failure rate within each development group (share of that group's traces)."""
    groups = np.array([t.group for _, t in dev], dtype=object)
    return {
        str(g): round(float(failed[groups == g].mean()), 4) for g in sorted(set(groups.tolist()))
    }


def prefill_choice(
    rows: Sequence[tuple[int, int]],
    errors: np.ndarray,
    realized: np.ndarray,
    targets: np.ndarray,
    alpha: float,
    fixed_budget: bool,
    alternative: Sequence[bool],
) -> tuple[int, int]:
    """Among rows whose plans keep what they were asked to (floors do not push the prompt
    past its ``B_P``): with a fixed ``B``, the fewest failures; else the cheapest level within
    ``alpha``. On a tie the paper's upgrade order beats an ``alternative`` one (which must
    win on development traces to be used), then the cheaper realized plan. If no row fits,
    the cheapest one."""
    fits = [i for i in range(len(rows)) if realized[i] <= targets[i] + 0.005]
    if not fits:
        return rows[int(np.argmin(realized))]
    if fixed_budget:
        i = min(fits, key=lambda i: (float(errors[i]), alternative[i], float(realized[i])))
        return rows[i]
    ok = [i for i in fits if errors[i] <= alpha + 1e-12] or fits
    i = min(ok, key=lambda i: (rows[i][1], float(errors[i]), alternative[i], float(realized[i])))
    return rows[i]


def realized_prompt_budgets(
    rows: Sequence[tuple[int, int]],
    prefill: PrefillCandidates,
    dev: list[ReplayedTrace],
    budgets: list[list[float]],
    costs: PayloadCosts,
    config: CalibrationConfig,
) -> tuple[np.ndarray, np.ndarray]:
    """Per candidate row: the share of Full KV its plans keep on the development prompts, and
    the share they were asked for (floors can make the first exceed the second)."""
    realized, targets = np.zeros(len(rows)), np.zeros(len(rows))
    for i, (pair, level) in enumerate(rows):
        kept = full = asked = 0.0
        for r, b in zip(dev, budgets, strict=True):
            planner = PrefillPlanner.from_arrays(
                prefill.floors[pair], prefill.floors[pair], prefill.priorities[pair], costs,
                budget=min(1.0, max(0.0, b[level])), sinks=config.sinks, window=config.window,
            )  # fmt: skip
            plan = planner.plan_indices(r.prompt_labels)
            # what the floors keep: a row whose floors need a breach to fit is not selectable
            kept += plan.planned_bytes + plan.floor_breach_bytes
            full += plan.full_bytes
            asked += float(plan.target_bytes)
        realized[i], targets[i] = kept / full, asked / full
    return realized, targets


def floor_costs(
    r: ReplayedTrace, keys: DecodeKeys, floors: np.ndarray, costs: PayloadCosts
) -> tuple[np.ndarray, list[str]]:
    m = np.asarray(costs.bytes_by_group, dtype=np.float64)
    per_bucket = m[np.arange(3)[None, :], floors].sum(axis=1) / costs.full_bytes_per_token
    states = [t.state if t is not None else "" for t in r.tags]
    return per_bucket[keys.of_trace(r)], states


def sensitivity_json(s: Sensitivity, names: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    for b, name in enumerate(names):
        for c in range(3):
            rows.append(
                {
                    "bucket": name,
                    "group": c,
                    "tokens": int(s.tokens[b]),
                    "V_L": round(float(s.v[b, c, 1]), 4),
                    "V_R": round(float(s.v[b, c, 0]), 4),
                    "D_L": round(float(s.d[b, c, 1]), 4),
                    "D_R": round(float(s.d[b, c, 0]), 4),
                }
            )
    return rows


def selection_prompt_budgets(
    dev: Sequence[ReplayedTrace],
    budget: float,
    budget_decode: float,
    expected: float,
    config: CalibrationConfig,
    decode_floor: float | Fraction,
) -> list[float]:
    """The ``B_P`` each development prompt's candidates are replayed at: what PASK serving the
    resulting table plans for it (``policy/stages.py``, with the table's ``B_D``, expected
    answer length, sinks and window)."""
    same = {"answer_tokens": expected, "sinks": config.sinks, "window": config.window}
    solve = partial(solve_stage_budgets, budget, decode=budget_decode, decode_floor=decode_floor)
    return [solve(prompt_tokens=r.prompt_len, **same).prompt for r in dev]
