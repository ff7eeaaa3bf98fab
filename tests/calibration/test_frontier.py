"""Floors, greedy upgrade paths, the reserve's deficits and the D.7 check, on numbers worked out
by hand (no model: these are the selection rules of paper §3.4, App. A.4, B.6, E.2, E.4)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pask_agent.calibration.deficits import fit_reserve, left_quantile, lookahead_deficits
from pask_agent.calibration.frontier import (
    Sensitivity,
    breadth_first,
    greedy_path,
    nominal_cost,
    path_candidates,
    spread,
)
from pask_agent.calibration.interventions import answer_keys, continue_rule_logits
from pask_agent.calibration.measure import TraceMeasurement, probe_name
from pask_agent.calibration.selection import group_weights
from pask_agent.calibration.table_build import mismatch_report
from pask_agent.policy.costs import PayloadCosts

COSTS = PayloadCosts.from_dims(24, 2, 64)


def _measurement(flipped: list[str], distortion: dict[str, float], tokens: list[int]):
    return TraceMeasurement("t", True, tokens, [0] * 7, dict.fromkeys(flipped, True), distortion)


def test_sensitivity_applies_the_monotone_envelope() -> None:
    # bucket 0 group 0: L breaks 1 of 2 traces, R breaks none -> V̄(R) = max(V̄(L), V(R)) = 0.5
    a = _measurement([probe_name("decode", 0, 0, "L")], {}, [5, 5])
    b = _measurement([probe_name("decode", 1, 2, "R")], {}, [5, 5])
    s = Sensitivity.aggregate([a, b], "decode", 2)
    assert s.v[0, 0, 1] == 0.5 and s.v[0, 0, 0] == 0.5  # index 1 = L, 0 = R
    assert s.v[1, 2, 1] == 0.0 and s.v[1, 2, 0] == 0.5
    assert s.tokens.tolist() == [10, 10]


def test_floors_follow_the_threshold_pair() -> None:
    v = np.zeros((3, 3, 3))
    v[0, :, 1] = v[0, :, 0] = 0.03  # L already hurts: H floor unless τ_high >= 3 %
    v[1, :, 0] = 0.03  # only releasing hurts: L floor unless τ_low >= 3 %
    s = Sensitivity(v, np.zeros_like(v), np.ones(3), 100)
    assert s.floors(0.01, 0.01)[:, 0].tolist() == [2, 1, 0]
    assert s.floors(0.05, 0.01)[:, 0].tolist() == [1, 1, 0]
    assert s.floors(0.05, 0.05)[:, 0].tolist() == [0, 0, 0]


def test_greedy_path_buys_distortion_per_byte_and_ends_all_high() -> None:
    d = np.zeros((2, 3, 3))
    d[0, :, 0], d[0, :, 1] = 10.0, 1.0  # bucket 0: releasing is costly, INT4 nearly free
    d[1, :, 0], d[1, :, 1] = 4.0, 3.0
    s = Sensitivity(np.zeros_like(d), d, np.array([1.0, 1.0]), 10)
    floors = np.zeros((2, 3), np.int8)
    moves = greedy_path(floors, s.upgrade_scores(COSTS))
    assert len(moves) == 2 * 3 * 2  # every bucket-group goes R -> L -> H
    assert moves[:3] == [(0, 0), (0, 1), (0, 2)]  # the largest reduction per byte first
    path = path_candidates((0.0, 0.0), floors, moves, np.array([3.0, 1.0]), COSTS)
    costs = [c.cost for c in path]
    assert costs[0] == 0.0 and costs[-1] == pytest.approx(1.0)
    assert all(b >= a for a, b in zip(costs, costs[1:], strict=False))  # App. E.2
    assert (path[-1].actions == 2).all()
    picked = spread(path, 4)
    assert picked[0].step == 0 and picked[-1].step == len(moves)


def test_nominal_cost_weights_buckets_by_their_tokens() -> None:
    acts = np.array([[2, 2, 2], [0, 0, 0]], np.int8)
    assert nominal_cost(acts, np.array([1.0, 3.0]), COSTS) == pytest.approx(0.25)


def test_deficits_and_left_quantile() -> None:
    # floors cost 1, 1, 0, 0 (C_full units) against an allowance of 0.5 per token
    s = lookahead_deficits(np.array([1.0, 1.0, 0.0, 0.0]), 0.5, horizon=2)
    assert s.tolist() == [0.5, 0.0, 0.0, 0.0]
    s2 = lookahead_deficits(np.array([0.0, 1.0, 1.0, 1.0]), 0.5, horizon=2)
    assert s2.tolist() == [1.0, 1.0, 0.5, 0.0]
    assert left_quantile(np.array([0.0, 1.0, 2.0, 3.0, 4.0]), 0.8) == 3.0
    floors = np.array([0.0, 1.0, 1.0, 1.0])  # the costs behind s2
    reserve = fit_reserve(
        [(floors, ["critical", "boundary", "critical", ""])], [0.5, 0.25], horizon=2
    )
    assert [r.budget for r in reserve.rows] == [0.25, 0.5]
    assert reserve.rows[1].by_state == {"boundary": 1.0, "critical": 1.0}
    assert reserve.rows[1].pooled == 1.0 and reserve.rows[0].pooled > 1.0


def test_mismatch_report_counts_sensitive_buckets_low_in_distortion() -> None:
    v = np.zeros((5, 3, 3))
    d = np.zeros((5, 3, 3))
    v[0, 0, 0] = 0.2  # the one task-sensitive release ...
    d[..., 0] = np.arange(15).reshape(5, 3)  # ... has the least distortion of all
    s = Sensitivity(v, d, np.ones(5), 10)
    report = mismatch_report(s)["R"]
    assert report["buckets"] == 15 and report["sensitive"] == 1
    assert report["recall_at_20"] == 0.0 and report["mismatch_20_50"] == 1.0


def test_breadth_first_keeps_each_moves_order_but_puts_every_int4_first() -> None:
    scores = np.zeros((2, 3, 2))
    scores[..., 0] = [[0.5, -0.2, 0.1], [0.0, 0.3, -0.4]]  # R->L (low group may be negative)
    scores[..., 1] = [[0.9, 0.05, 0.2], [0.01, 0.6, 0.02]]  # L->H
    out = breadth_first(scores)
    assert out[..., 0].min() > out[..., 1].max()  # every R->L ranks above every L->H
    for move in (0, 1):  # within a move the distortion order is unchanged
        want = np.argsort(scores[..., move], axis=None)
        assert (np.argsort(out[..., move], axis=None) == want).all()


def test_group_weights_give_every_group_the_same_say() -> None:
    w = group_weights(["simple"] * 6 + ["parallel"] * 2)
    assert w.sum() == pytest.approx(1.0)
    assert w[:6].sum() == pytest.approx(0.5) and w[6:].sum() == pytest.approx(0.5)
    # one parallel failure now weighs as much as three simple ones
    assert w[6] == pytest.approx(3 * w[0])
    assert group_weights(["", "", ""]).tolist() == pytest.approx([1 / 3] * 3)


def test_a_retokenized_alternative_is_not_a_change_of_answer() -> None:
    # decision 0 recorded '}}' with '}}, {"name"...' to come; '}},' only splits it differently
    candidates = [["}}", "}},", "]", " }}"], ['"calc', '"cal', '"area', '"']]
    continuations = ['}}, {"name": "b"}]', '"calc_area"}}]']
    keys = answer_keys(candidates, continuations)
    assert keys[0].tolist()[:2] == [0, 0]  # prefix of what was written: same answer
    assert keys[0, 2] != 0  # closing the list instead is a different answer
    assert keys[0, 3] == 0  # whitespace only
    assert keys[1, 1] == 0 and keys[1, 3] == 0 and keys[1, 2] != 0


def test_the_replay_applies_the_continue_calls_rule_to_each_rows_own_odds() -> None:
    # candidates at each position: [',', ']', ' '] ; position 1 is between calls
    is_next = torch.tensor([[True, False, False]])
    is_close = torch.tensor([[False, True, False]])
    real = torch.ones((1, 3), dtype=torch.bool)
    logits = torch.tensor(
        [
            [[0.0, 5.0, -9.0], [0.0, 5.0, -9.0]],  # another call at ~0.7 %: the array closes
            [[0.0, 5.0, -9.0], [1.0, 5.0, -9.0]],  # ~1.8 % >= 1 %: closing is not allowed
        ]
    )
    at = torch.tensor([1])
    best = continue_rule_logits(logits, at, real, is_next, is_close, 0.01).argmax(-1)
    assert best.tolist() == [[1, 1], [1, 0]]  # position 0 is not between calls: plain argmax
