"""Every registered policy on one store and one byte accounting (STYLE rule 13).

A tiny random-weight Qwen2 with the default model's real tokenizer (so real prompts, real
tool grammars, real span labels and tags) serves a batch of three BFCL prompts of unequal
length through the Runtime. For each entry of ``tests/policies.py`` ``ALL_POLICIES``:

1. it runs on the batch (three results, each with generated tokens);
2. the store's measured total ``B`` at the end of each request is within ``±TOL`` of the target,
   and never above it for the score/recency baselines (they hold it exactly after each step);
3. floors hold for PASK-style policies (prompt tokens whose span label, or for
   ``position_both`` whose position, has an ``H`` floor are still high in every layer group at
   the end; ``L`` floors are still held) unless the request's usage reports the bytes released
   below them (``floor_breach_bytes``: a budget the floors cannot fit is met by release);
4. at ``B = 1`` every policy reproduces Full KV's greedy tokens exactly (``int4``, which
   quantizes at any budget, measures its own ``B`` there instead).

An unlisted registered policy name fails ``test_every_registered_policy_is_listed``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from policies import ALL_POLICIES, PolicyCase, policy_params

from pask_agent.errors import ConfigError
from pask_agent.eval.bfcl import load_bfcl
from pask_agent.grammars.tags import SPAN_LABELS
from pask_agent.policy import POLICIES, PolicyEnv, RetentionView, get_policy
from pask_agent.policy.actions import Action
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.label_rules import LabelRules
from pask_agent.policy.pask import PaskPolicy
from pask_agent.policy.position import PositionPolicy, bin_rule
from pask_agent.policy.position_both import PositionBothPolicy, prompt_bin_arrays
from pask_agent.policy.scored import ScoredSession, accumulated_mass, recency
from pask_agent.policy.snapkv import pool_scores
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.models.loading import LoadedModel, load_tokenizer
from pask_agent.runtime.runtime import Runtime

TOL = 0.03
BUDGETS = (0.33, 0.5)
MAX_NEW = 24
CONFIG = RuntimeConfig(sinks=4, window=8, prefill_chunk_tokens=192)


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    """A 6-layer random Qwen2 over the default tokenizer's vocabulary (GQA 4:2, head dim 16)."""
    from tiny_models import tiny_qwen2

    tokenizer = load_tokenizer("default")
    return LoadedModel("tiny-qwen2", Path("."), tiny_qwen2(151936), tokenizer)


@pytest.fixture(scope="module")
def cases() -> list[Any]:
    """Three prompts of unequal length (~250, ~250 and ~550 tokens): one per call shape."""
    return [
        load_bfcl("simple_python", limit=1)[0],
        load_bfcl("parallel", limit=1)[0],
        load_bfcl("multiple", limit=1)[0],
    ]


async def _batch(rt: Runtime, cases: list[Any], policy: Any, budget: float | None) -> list[Any]:
    """Run the cases concurrently as conversations, so their KV stays in the store."""
    out: list[Any] = [None] * len(cases)

    async def one(i: int) -> None:
        case = cases[i]
        conv = rt.conversation(f"{id(policy)}-{budget}-{i}")
        result = await rt.chat(
            **case.request(),
            policy=policy,
            budget=budget,
            max_new_tokens=MAX_NEW,
            conversation=conv,
        )
        out[i] = (result, conv)

    async with anyio.create_task_group() as tg:
        for i in range(len(cases)):
            tg.start_soon(one, i)
    return out


def _run(tiny: LoadedModel, cases: list[Any], policy: Any, budgets: tuple) -> dict:
    """{budget: [(ChatResult, retention per group, prompt labels)]} for one policy."""

    async def main() -> dict:
        found: dict = {}
        async with Runtime.open(tiny, config=CONFIG) as rt:
            for budget in budgets:
                rows = []
                for result, conv in await _batch(rt, cases, policy, budget):
                    seq = conv._state.seq_id
                    held = [
                        tuple(a.tolist() for a in rt.engine.store.retained_arrays(seq, g))
                        for g in range(3)
                    ]
                    rows.append((result, held))
                found[budget] = rows
            labels = []
            for case in cases:
                _, lab, _ = rt.prepare(
                    list(case.messages), case.tools(), "required", case.parallel, True
                )
                labels.append(lab)
            found["labels"] = labels
        return found

    return anyio.run(main)


@pytest.fixture(scope="module")
def full_tokens(tiny: LoadedModel, cases: list[Any]) -> list[tuple[int, ...]]:
    runs = _run(tiny, cases, get_policy("full")(), (1.0,))
    return [r.token_ids for r, _ in runs[1.0]]


def test_every_registered_policy_is_listed() -> None:
    listed = {case.cls.name for case in ALL_POLICIES}
    missing = set(POLICIES.names()) - listed
    assert not missing, f"registered but not in tests/policies.py ALL_POLICIES: {missing}"
    assert listed == set(POLICIES.names())


@pytest.mark.parametrize(("case", "kwargs"), policy_params())
def test_policy_invariants(
    tiny: LoadedModel,
    cases: list[Any],
    full_tokens: list[tuple[int, ...]],
    case: PolicyCase,
    kwargs: dict[str, Any],
) -> None:
    policy = case.cls(**kwargs)
    harder = kwargs != case.kwargs[0]  # later configurations run one budget, to stay quick
    budgets = ((BUDGETS[0],) if harder else BUDGETS) + (1.0,) if case.budgeted else (1.0,)
    runs = _run(tiny, cases, policy, budgets)
    # 4. parity at B = 1 (nothing demoted, nothing quantized)
    parity = [r.token_ids for r, _ in runs[1.0]]
    if case.full_at_one:
        assert parity == full_tokens
    for budget in budgets:
        for i, (result, held) in enumerate(runs[budget]):
            u = result.usage
            # 1. ran on the batch
            assert u.completion_tokens > 0 and u.prompt_tokens > 200
            # 2. measured B from the store's own bytes
            kv_len = u.full_kv_bytes // (tiny.model.config.num_hidden_layers * 2 * 2 * 16 * 2)
            assert kv_len >= u.prompt_tokens
            if budget == 1.0:
                assert u.measured_b == 1.0 if case.full_at_one else u.measured_b < 0.5
                continue
            if case.holds_budget:
                assert abs(u.measured_b - budget) <= TOL, (cases[i].id, budget, u.measured_b)
            if case.cls.revises and not case.has_floors:
                assert u.measured_b <= budget + 1e-9
            # 3. floors, unless the usage says the budget released below them
            if case.has_floors and not u.floor_breach_bytes:
                _assert_prompt_floors(policy, runs["labels"][i], held)


def _assert_prompt_floors(
    policy: Any, labels: list[str], held: list[tuple[list[int], list[int]]]
) -> None:
    owner = policy if isinstance(policy, PaskPolicy) else PaskPolicy(policy.table)
    table = owner.resolved_table()
    rules = LabelRules.from_table(table)
    index = {label: i for i, label in enumerate(SPAN_LABELS)}
    if isinstance(policy, PositionBothPolicy):  # every position bin has the label-free floor
        floors = prompt_bin_arrays(table, policy.bins)[1][0]
    checked = 0
    for t, label in enumerate(labels):
        for g in range(3):
            if isinstance(policy, PositionBothPolicy):
                floor = Action(int(floors[g]))
            else:
                floor = Action(int(rules.floor[index[label], g]))
            high, low = held[g]
            if floor == Action.H:
                assert t in high, f"token {t} ({label}) lost its H floor in group {g}"
                checked += 1
            elif floor == Action.L:
                assert t in high or t in low, f"token {t} ({label}) lost its L floor"
                checked += 1
    assert checked > 0


# ----------------------------------------------------------------- hand-checked units
def _costs() -> PayloadCosts:
    # 3 layers, 1 KV head, dim 8: m(H) = 32, m(L) = 12 bytes per token and group
    return PayloadCosts.from_dims(3, 1, 8)


def _view(n: int, settled: int, sinks: int, scores: np.ndarray | None = None) -> RetentionView:
    high = np.arange(sinks, settled, dtype=np.int64)
    empty = np.zeros(0, np.int64)
    sc = None if scores is None else (scores, scores, scores)
    return RetentionView(n, settled, sinks, (high,) * 3, (empty,) * 3, sc, sc, True)


def test_drop_mode_keeps_top_scores_within_budget() -> None:
    env = PolicyEnv(_costs(), sinks=2, window=2)
    scores = np.array([9, 9, 5, 1, 7, 3, 8, 2, 6, 4, 0, 0], float)
    session = ScoredSession(env, 0.5, accumulated_mass)
    # 12 tokens → allowed 0.5·12·32 = 192 bytes = 6 tokens; sinks 2 + window 2 → room for 2
    demotions = session.revise(_view(12, 10, 2, scores))
    assert {d.group for d in demotions} == {0, 1, 2}
    released = sorted(demotions[0].positions)
    assert demotions[0].action == Action.R
    assert sorted(set(range(2, 10)) - set(released)) == [4, 6]  # scores 7 and 8


def test_recency_and_recent_window_break_ties() -> None:
    env = PolicyEnv(_costs(), sinks=2, window=2)
    session = ScoredSession(env, 0.5, recency)
    kept = set(range(2, 10)) - set(session.revise(_view(12, 10, 2))[0].positions)
    assert kept == {8, 9}
    scores = np.zeros(12)
    h2o = ScoredSession(env, 0.5, accumulated_mass, recent=3)  # 9, 10, 11 outrank mass
    kept = set(range(2, 10)) - set(h2o.revise(_view(12, 10, 2, scores))[0].positions)
    assert kept == {9, 8}  # 9 by the recent rule, then the newest tie


def test_tiered_mode_quantizes_before_releasing() -> None:
    env = PolicyEnv(_costs(), sinks=2, window=2)
    view = _view(20, 18, 2, np.arange(20, dtype=float))  # priority = position
    # allowed floor(0.6·20·32) = 384; sinks 2 + window 2 = 128 → room 256 for 16 settled tokens
    session = ScoredSession(env, 0.6, accumulated_mass, tiered=True)
    by_action = {d.action: set(d.positions) for d in session.revise(view) if d.group == 0}
    # all 16 fit at INT4 (192 bytes); the 64 left keep 64 // (32 − 12) = 3 tokens high
    assert Action.R not in by_action
    assert by_action[Action.L] == set(range(2, 15))
    ratio = ScoredSession(env, 0.6, accumulated_mass, tiered=True, high_ratio=0.5)
    by_action = {d.action: set(d.positions) for d in ratio.revise(view) if d.group == 0}
    # 22 bytes per kept token → 11 kept, 5 high (160) + 6 low (72) = 232 ≤ 256
    assert by_action[Action.R] == set(range(2, 7))
    assert by_action[Action.L] == set(range(7, 13))


def test_budget_one_never_demotes_and_bad_budgets_raise() -> None:
    env = PolicyEnv(_costs(), sinks=2, window=2)
    assert ScoredSession(env, 1.0, recency).revise(_view(12, 10, 2)) == []
    for name in ("streaming", "h2o", "snapkv", "mikv"):
        cls = get_policy(name)
        with pytest.raises(ConfigError, match=r"\(0, 1\]"):
            cls(budget=0.0)
        with pytest.raises(ConfigError, match=r"\(0, 1\]"):
            cls().start(PolicyEnv(_costs(), 2, 2, budget=1.5))


def test_snapkv_pooling_and_position_bins() -> None:
    x = np.array([0, 1, 0, 0, 0, 5, 0], float)
    assert pool_scores(x, 3, "max").tolist() == [1, 1, 1, 0, 5, 5, 5]
    assert pool_scores(np.array([0, 3, 0, 0.0]), 3, "avg").tolist() == [1.5, 1, 1, 0]
    assert [bin_rule(k, 10) for k in (0, 1, 2, 4, 5, 9)] == [
        ("H", "L"), ("H", "L"), ("L", "L"), ("L", "L"), ("L", "R"), ("L", "R"),
    ]  # fmt: skip
    session = PositionPolicy(bins=4, expected_tokens=8).start(PolicyEnv(_costs(), 2, 2, 0.5))
    decisions = [session.on_token(None) for _ in range(12)]
    assert all(len(d) == 3 for d in decisions)
    assert session.generated == 12
    with pytest.raises(ConfigError, match="bins"):
        PositionPolicy(bins=0)
