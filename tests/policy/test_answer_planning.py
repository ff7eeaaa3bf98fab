"""The prompt's share of B knows which answer follows (``policy/pask.py``, ``PolicyEnv``).

A function-calling answer is planned at the calibrated decode budget and the expected answer
length, as before. A SQL answer, whose buckets the shipped table carries over from the
hand-written prior (critical tokens held ``H``), is planned kept whole for the table's expected
length, and the ``AnswerCeiling`` keeps any longer answer within ``B + BUDGET_TOLERANCE``.
Shipped table, default-model dimensions (24 layers, 2 KV heads, head dim 64).
"""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from pask_agent.grammars.tags import Tag
from pask_agent.policy.actions import Action
from pask_agent.policy.base import PolicyEnv
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.default_table import HAND_WRITTEN_TABLE_PATH
from pask_agent.policy.pask import BUDGET_TOLERANCE, PaskPolicy, PaskSession
from pask_agent.policy.table import PolicyTable

COSTS = PayloadCosts.from_dims(24, 2, 64)
LABELS = ("function_name", "parameter_key", "enum_constraint", "schema_description")


def _prompt(n: int) -> list[str]:
    rng = random.Random(n)
    return ["protected_content"] * 40 + [rng.choice(LABELS) for _ in range(n - 40)]


def _session(family: str | None) -> PaskSession:
    env = PolicyEnv(COSTS, 4, 16, 0.33, answer_family=family)
    return PaskPolicy().start(env)


def _planned_bytes(session: PaskSession, labels: list[str]) -> int:
    return sum(COSTS.token_cost(row) for row in session.plan_prefill(labels))


def test_the_shipped_table_measured_function_calling_but_not_sql() -> None:
    table = PaskPolicy().resolved_table()
    assert table.decode_measured("function_calling")
    assert not table.decode_measured("sql")
    hand = PolicyTable.read(HAND_WRITTEN_TABLE_PATH)  # never calibrated: nothing measured
    assert not hand.decode_measured("function_calling") and not hand.decode_measured("sql")


def _old_worst_case_share(n: int, cap: int, window: int = 16) -> float:
    """``B_P`` of the plan before the ceiling: a ``cap``-token answer kept BF16 within 0.36."""
    return ((0.33 + 0.03) * (n + cap) - cap) / n


@pytest.mark.parametrize("n", [600, 1213, 3000])
def test_a_sql_prompt_is_planned_for_the_expected_answer_kept_whole(n: int) -> None:
    labels, full = _prompt(n), COSTS.full_bytes_per_token
    sql = _planned_bytes(_session("sql"), labels)
    expected = PaskPolicy().resolved_table().expected_output_tokens or 0
    # the table's expected answer, every token kept BF16, lands at B (not far under it) ...
    total = (sql + expected * full) / ((n + expected) * full)
    assert 0.33 - 0.01 <= total <= 0.33 + 1e-9
    # ... so on prompts short enough for the old worst case to bind, the prompt keeps more
    # than the plan for the longest allowed answer did
    if n < 3000:
        assert sql > _old_worst_case_share(n, 160) * n * full
    # a function-calling answer is planned as before: at B_D and the expected length
    calls = _planned_bytes(_session("function_calling"), labels)
    assert calls == _planned_bytes(_session(None), labels)
    assert sql < calls


CRITICAL = Tag("schema_bearing", "projection", "critical", "no_lookahead")


def _stops(session: PaskSession, labels: list[str], answer: int) -> list[float]:
    """Measured B at every possible stop of a ``answer``-token answer: the prompt's plan, the
    scheduled payload of tokens that left the recent window and the window held BF16."""
    full, window, n = COSTS.full_bytes_per_token, session.window, len(labels)
    prompt = _planned_bytes(session, labels)
    costs = [COSTS.token_cost(session.on_token(CRITICAL)) for _ in range(answer)]
    out = []
    for stop in range(window, answer + 1):
        kept = prompt + sum(costs[: stop - window]) + window * full
        out.append(kept / ((n + stop) * full))
    return out


@pytest.mark.parametrize("n", [600, 1213, 3000])
def test_the_ceiling_holds_every_stop_of_a_long_sql_answer_within_tolerance(n: int) -> None:
    labels = _prompt(n)
    session = _session("sql")
    stops = _stops(session, labels, 400)
    assert max(stops) <= 0.33 + float(BUDGET_TOLERANCE) + 1e-9
    assert session.ceiling is not None and session.ceiling.demoted_tokens > 0
    # without the ceiling the same answer, kept BF16, runs far past it
    bare = _session("sql")
    bare.ceiling = None
    assert max(_stops(bare, labels, 400)) > 0.33 + float(BUDGET_TOLERANCE) + 0.02


def test_a_typical_sql_answer_is_never_touched_by_the_ceiling() -> None:
    session = _session("sql")
    labels = _prompt(1213)
    stops = _stops(session, labels, 40)
    assert session.ceiling is not None and session.ceiling.demoted_tokens == 0
    assert max(stops) <= 0.33 + 1e-9


def test_the_ceiling_stores_int4_and_never_releases_generated_tokens() -> None:
    session = _session("sql")
    session.plan_prefill(_prompt(600))
    actions = [session.on_token(CRITICAL) for _ in range(300)]
    assert all(Action.R not in row for row in actions)
    demoted = [row for row in actions if Action.H not in row]
    assert demoted and all(set(row) == {Action.L} for row in demoted)


def test_measured_families_and_full_budget_have_no_ceiling() -> None:
    assert _session("function_calling").ceiling is None
    env = PolicyEnv(COSTS, 4, 16, 1.0, answer_family="sql")
    assert PaskPolicy().start(env).ceiling is None
    assert PaskPolicy().start(PolicyEnv(COSTS, 4, 16, 1.0)).ceiling is None
    assert _session("sql").ceiling.limit == Fraction(33, 100) + BUDGET_TOLERANCE  # type: ignore[union-attr]


@pytest.mark.parametrize("answer", [64, 400])
def test_free_text_is_held_at_b_itself(answer: int) -> None:
    """Prose has no tags, so the table's default bucket would keep every token BF16 (a
    64-token answer took a 512-token request to B 0.39): its ceiling is B, no tolerance. The
    first stops hold the recent window BF16, which the prompt plan counted at B_D: they may
    sit up to 0.006 over B; from 64 tokens on the request is within B."""
    session = _session(None)
    assert session.ceiling is not None and session.ceiling.limit == Fraction(33, 100)
    full, window, labels = COSTS.full_bytes_per_token, session.window, _prompt(512)
    prompt = _planned_bytes(session, labels)
    costs = [COSTS.token_cost(session.on_token(None)) for _ in range(answer)]
    stops = [
        (prompt + sum(costs[: stop - window]) + window * full) / ((512 + stop) * full)
        for stop in range(window, answer + 1)
    ]
    assert max(stops) <= 0.336 and max(stops[64 - window :]) <= 0.33 + 1e-9
    assert session.ceiling.demoted_tokens > answer / 2  # counted: usage reports them
