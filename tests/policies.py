"""Every registered policy with its configurations, easiest first (STYLE rule 13).

``tests/policy/test_baselines.py`` runs each entry through the runtime and checks the shared
invariants; a policy registered in ``pask_agent.policy`` but missing here fails that suite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pask_agent.policy import (
    FullPolicy,
    H2OPolicy,
    HandWrittenPaskPolicy,
    Int4Policy,
    KeyDiffPolicy,
    LabelReleasePolicy,
    MiKVPolicy,
    PaskPolicy,
    PositionBothPolicy,
    PositionPolicy,
    RKVPolicy,
    SnapKVInt4Policy,
    SnapKVPolicy,
    StreamingPolicy,
)


@dataclass(frozen=True)
class PolicyCase:
    """A policy class and the keyword sets to build it with (easy → hard)."""

    cls: Any
    kwargs: list[dict[str, Any]] = field(default_factory=lambda: [{}])
    budgeted: bool = True  # takes a target total B (everything but ``full``)
    has_floors: bool = False  # PASK-style protection floors that must always hold
    holds_budget: bool = True  # lands within ±0.03 of the target B
    full_at_one: bool = True  # B = 1 is Full KV (int4 quantizes at any budget)


ALL_POLICIES: list[PolicyCase] = [
    PolicyCase(FullPolicy, budgeted=False),
    PolicyCase(StreamingPolicy),
    PolicyCase(H2OPolicy, [{}, {"recent_tokens": 0}]),
    PolicyCase(SnapKVPolicy, [{}, {"observation_tokens": 8, "kernel": 3, "pooling": "avg"}]),
    PolicyCase(MiKVPolicy, [{}, {"high_ratio": 0.2}]),
    # The invariants run on a tiny random Qwen2: the shipped table belongs to the default model,
    # so it is transferred on purpose (the refusal itself is tested in tests/policy/test_table.py).
    PolicyCase(PaskPolicy, [{"allow_transfer": True}], has_floors=True),
    # The hand-written table's floors cost more than its stage budgets say, and nothing squeezes
    # the prompt after the fact any more: its measured B is reported, not held (the baseline
    # calibration replaced).
    PolicyCase(
        HandWrittenPaskPolicy, [{"allow_transfer": True}], has_floors=True, holds_budget=False
    ),  # fmt: skip
    PolicyCase(PositionPolicy, [{}, {"bins": 4, "expected_tokens": 8}], has_floors=True),
    PolicyCase(PositionBothPolicy, [{}, {"bins": 4, "expected_tokens": 8}], has_floors=True),
    # INT4 costs what it costs (about 0.31 + protection on the tiny model's head dim 16): a
    # budget above that is not reached, one below is held by releasing the oldest tokens.
    PolicyCase(Int4Policy, holds_budget=False, full_at_one=False),
    # INT4 like int4; below its cost, released in the span labels' order instead of by age.
    PolicyCase(LabelReleasePolicy, holds_budget=False, full_at_one=False),
    # The same store ranked by attention (SnapKV's window), by key geometry (KeyDiff) and by
    # both (R-KV).
    PolicyCase(
        SnapKVInt4Policy,
        [{}, {"observation_tokens": 8, "kernel": 3}],
        holds_budget=False,
        full_at_one=False,
    ),  # fmt: skip
    PolicyCase(KeyDiffPolicy, holds_budget=False, full_at_one=False),
    PolicyCase(RKVPolicy, [{}, {"lam": 0.5, "kernel": 3}], holds_budget=False, full_at_one=False),
]


def policy_params() -> list[Any]:
    """``pytest.param(case, kwargs)`` for every configuration, with readable ids."""
    import pytest

    out = []
    for case in ALL_POLICIES:
        for i, kwargs in enumerate(case.kwargs):
            out.append(pytest.param(case, kwargs, id=f"{case.cls.name}-{i}"))
    return out
