"""The prompt's share of B knows which answer follows (``policy/pask.py``, ``PolicyEnv``).

A function-calling answer is planned at the calibrated decode budget and the expected answer
length, as before. A SQL answer, whose buckets the shipped table carries over from the
hand-written prior (critical tokens held ``H``), is planned kept whole, and the prompt is
sized so that even ``max_new_tokens`` of answer stay within ``B + BUDGET_TOLERANCE``.
Shipped table, default-model dimensions (24 layers, 2 KV heads, head dim 64).
"""

from __future__ import annotations

import random

import pytest

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


def _session(family: str | None, max_new_tokens: int | None = 160) -> PaskSession:
    env = PolicyEnv(COSTS, 4, 16, 0.33, answer_family=family, max_new_tokens=max_new_tokens)
    return PaskPolicy().start(env)


def _planned_bytes(session: PaskSession, labels: list[str]) -> int:
    return sum(COSTS.token_cost(row) for row in session.plan_prefill(labels))


def test_the_shipped_table_measured_function_calling_but_not_sql() -> None:
    table = PaskPolicy().resolved_table()
    assert table.decode_measured("function_calling")
    assert not table.decode_measured("sql")
    hand = PolicyTable.read(HAND_WRITTEN_TABLE_PATH)  # never calibrated: nothing measured
    assert not hand.decode_measured("function_calling") and not hand.decode_measured("sql")


@pytest.mark.parametrize("n", [600, 1213, 3000])
def test_a_sql_prompt_leaves_room_for_the_longest_answer_kept_whole(n: int) -> None:
    labels, cap, full = _prompt(n), 160, COSTS.full_bytes_per_token
    sql = _planned_bytes(_session("sql", cap), labels)
    # the longest answer the request allows, every token kept BF16, stays within B + 0.03
    assert (sql + cap * full) / ((n + cap) * full) <= 0.33 + BUDGET_TOLERANCE + 1e-9
    # and a typical answer (the table's expected length) still lands under B
    expected = PaskPolicy().resolved_table().expected_output_tokens or 0
    assert (sql + expected * full) / ((n + expected) * full) <= 0.33 + 1e-9
    # a function-calling answer is planned as before: at B_D and the expected length
    calls = _planned_bytes(_session("function_calling", cap), labels)
    assert calls == _planned_bytes(_session(None, None), labels)
    assert sql < calls


def test_without_a_cap_sql_is_still_planned_kept_whole() -> None:
    labels = _prompt(1213)
    uncapped = _planned_bytes(_session("sql", None), labels)
    capped = _planned_bytes(_session("sql", 160), labels)
    calls = _planned_bytes(_session("function_calling", None), labels)
    assert capped < uncapped < calls
