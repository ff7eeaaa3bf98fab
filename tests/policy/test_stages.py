"""Stage budgets (``policy/stages.py``): one solution for calibration and serving.

Hand-computed cases of the rule, then PASK sessions on a small table: decoding is planned at
the table's calibrated ``B_D`` when it is below ``B`` (the controller really decodes there),
the bytes it frees raise ``B_P``, floors that do not fit are released and reported, and a
budget outside ``(0, 1]`` is refused before any plan.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from pask_agent.errors import ConfigError, PolicyTableError
from pask_agent.grammars.tags import Tag
from pask_agent.policy import get_policy
from pask_agent.policy.actions import Action
from pask_agent.policy.base import PolicyEnv
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.pask import PaskPolicy
from pask_agent.policy.stages import solve_stage_budgets
from pask_agent.policy.table import PolicyTable
from pask_agent.policy.table_entries import BudgetPlan

H, L, R = Action.H, Action.L, Action.R
FN, PC = "function_name", "protected_content"


def _solve(total: float, decode: float | None, n: int, a: float | None, *, s: int = 0, w: int = 0):
    return solve_stage_budgets(
        total, decode=decode, prompt_tokens=n, answer_tokens=a, sinks=s, window=w
    )


def test_decode_at_calibrated_b_d_and_the_prompt_gets_the_rest() -> None:
    # B = 0.5, n = 100, a = 40 with a 10-token window: the answer keeps 10 + 0.2 · 30 = 16
    # token-equivalents, so B_P · 100 = 0.5 · 140 − 16 = 54.
    st = _solve(0.5, 0.2, 100, 40, s=2, w=10)
    assert st.decode == Fraction(1, 5) and st.prompt == pytest.approx(0.54)
    assert st.total == Fraction(1, 2)
    # the old rule decoded at max(B_D, B) = 0.5: 10 + 15 = 25 and B_P = 0.45
    assert st.prompt > 0.45


def test_a_whole_prompt_returns_the_rest_to_decoding_and_b_one_is_full() -> None:
    st = _solve(0.9, 0.2, 10, 40, w=10)  # B_P would be (45 − 10 − 6) / 10 = 2.9
    assert st.prompt == 1.0 and st.decode == Fraction(45 - 10 - 10, 30)
    full = _solve(1.0, 0.2, 300, 40, s=4, w=10)
    assert (full.prompt, full.decode) == (1.0, Fraction(1))


def test_the_prompt_never_plans_below_protection() -> None:
    # n = 40 with 4 sinks + 10 window = 14 protected; B = 0.2, a = 60: 0.2 · 100 = 20, the
    # answer's window 10 + B_D 0.15 · 50 = 17.5 leaves 2.5 < 14 for the prompt. The prompt is
    # planned at its protection and the ledger gives up the difference: (20 − 14 − 10) < 0,
    # so no B_D meets B and the calibrated one stays.
    st = _solve(0.2, 0.15, 40, 60, s=4, w=10)
    assert st.prompt == pytest.approx(14 / 40) and st.decode == Fraction(15, 100)
    # with room left after protection the ledger pays it: 0.3 · 100 = 30 − 14 − 10 = 6 → 0.12
    st = _solve(0.3, 0.15, 40, 60, s=4, w=10)
    assert st.prompt == pytest.approx(14 / 40) and st.decode == Fraction(6, 50)


def test_nothing_to_trade_and_unmeasured_answers() -> None:
    assert _solve(0.4, 0.2, 100, None, s=4, w=10).decode == Fraction(2, 5)  # both at B
    assert _solve(0.4, 0.2, 100, None, s=4, w=10).prompt == pytest.approx(0.4)
    # an unmeasured family: the prompt is planned for the answer kept whole, ledger at B
    st = _solve(0.5, None, 100, 40, w=10)
    assert st.prompt == pytest.approx((70 - 40) / 100) and st.decode == Fraction(1, 2)


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5, float("nan"), True])
def test_a_budget_outside_0_1_is_a_typed_error(bad: float) -> None:
    with pytest.raises(ConfigError, match=r"\(0, 1\]"):
        _solve(bad, 0.2, 100, 40)


# ------------------------------------------------------------------ PASK sessions
@pytest.fixture
def table(make_table, entries):
    """Function names floor ``H``, content free; every decode token starts ``H`` with an
    ``R`` floor; calibrated ``B_D`` 0.4 for a 40-token answer (above ``small_costs``' INT4
    share, 0.375, so the decode floor does not bind)."""
    return make_table(
        prefill={FN: entries.prefill("H", "H", 1.0, 1.0), PC: entries.prefill("L", "R", 1, 1)},
        decode_default=entries.uniform("H", "R"),
        budget_decode=0.4,
        sink_tokens=1,
        window_tokens=2,
    ).model_copy(update={"expected_output_tokens": 40.0, "budget_total": 0.5})


def _session(table, small_costs, budget: float, **env):
    return PaskPolicy(table).start(PolicyEnv(small_costs, 1, 2, budget, **env))


def test_decode_is_planned_at_the_tables_b_d_below_b(table, small_costs) -> None:
    session = _session(table, small_costs, 0.5)
    session.plan_prefill([PC] * 60)
    stages = session.stages
    assert stages is not None and stages.decode == Fraction(2, 5) < stages.total
    assert session.budget_decode == Fraction(2, 5)
    # B_P = (0.5 · 100 − 2 − 0.4 · 38) / 60; the bytes the answer does not use went here
    assert stages.prompt == pytest.approx((50 - 2 - 15.2) / 60) and stages.prompt > 0.5
    assert session.stage_plan is not None and session.stage_plan.budget_decode == 0.4
    # the controller decodes at 0.4 · 96 = 38.4 bytes per token: an H start (96) is demoted,
    # so the answer's tokens keep 0.4 of Full KV on average, not 0.5
    tag = Tag("schema_bearing", "dispatch_key", "critical", "no_lookahead")
    kept = sum(small_costs.token_cost(session.on_token(tag)) for _ in range(40))
    assert kept <= 0.4 * 96 * 40
    assert session.controller.ledger.measured_ratio == pytest.approx(0.4, abs=0.05)


def test_a_calibrated_b_d_below_int4_cost_is_lifted_to_it(table, small_costs) -> None:
    low = table.model_copy(update={"budget_decode": 0.25})
    session = PaskPolicy(low).start(PolicyEnv(small_costs, 1, 2, 0.5))
    session.plan_prefill([PC] * 60)
    assert small_costs.int4_share == Fraction(3, 8)
    assert session.stages is not None and session.stages.decode == Fraction(3, 8)


def test_max_new_tokens_caps_the_answer_the_prompt_is_planned_for(table, small_costs) -> None:
    capped = _session(table, small_costs, 0.5, max_new_tokens=10)
    capped.plan_prefill([PC] * 60)
    # a 10-token answer: 2 in the window + 0.4 · 8 = 5.2; B_P = (0.5 · 70 − 5.2) / 60
    assert capped.stages is not None and capped.stages.prompt == pytest.approx(29.8 / 60)


def test_floors_the_budget_cannot_hold_are_released_and_reported(table, small_costs) -> None:
    labels = [PC] + [FN] * 58 + [PC]
    session = _session(table, small_costs, 0.4)  # planned: INT4 costs 0.375 here
    plan = session.plan_prefill(labels)
    kept = sum(small_costs.token_cost(row) for row in plan)
    stages = session.stages
    assert stages is not None
    assert kept <= stages.prompt * 60 * 96  # met, although the H floors cost 1.0 of it
    breach = session.stage_plan.floor_breach_bytes  # type: ignore[union-attr]
    assert breach > 0 and breach == 60 * 96 - kept
    assert all(row == (H, H, H) for row in (plan[0], plan[-1], plan[-2]))  # protection stays
    # at a budget the floors fit, nothing is released below them
    roomy = _session(table, small_costs, 1.0)
    assert all(row == (H, H, H) for row in roomy.plan_prefill(labels))
    assert roomy.stage_plan.floor_breach_bytes == 0  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ["pask", "position", "position_both", "int4"])
@pytest.mark.parametrize("bad", [0.0, 1.01])
def test_a_bad_budget_is_refused_before_any_plan(name: str, bad: float, small_costs) -> None:
    policy = get_policy(name)()
    if hasattr(policy, "allow_transfer"):
        policy = get_policy(name)(allow_transfer=True)
    with pytest.raises(ConfigError, match=r"\(0, 1\]"):
        policy.start(PolicyEnv(small_costs, 1, 2, bad))


def test_decode_is_not_planned_below_int4_cost_while_the_total_allows() -> None:
    """Releasing answer tokens is what a B_D below INT4's cost asks for, and the calibration
    that chose B_D cannot validate it: the floor lifts B_D to INT4's cost, or to B if lower."""
    floor = PayloadCosts.from_dims(24, 2, 64).int4_share
    assert floor == Fraction(17, 64)  # 4-bit codes + FP16 scale per 64-dim row, over BF16
    kw = dict(prompt_tokens=800, answer_tokens=59, sinks=4, window=16)
    for total, want in ((0.33, floor), (0.2, Fraction(1, 5)), (0.1, Fraction(157, 1000))):
        floored = solve_stage_budgets(total, decode=0.157, decode_floor=floor, **kw)
        assert floored.decode == want
        plain = solve_stage_budgets(total, decode=0.157, **kw)
        assert plain.decode == Fraction(157, 1000)
        # what decoding keeps more, the prompt gives up
        assert (floored.prompt < plain.prompt) == (want > Fraction(157, 1000))


def _planned(table, budget: float, small_costs) -> tuple[list, object]:
    session = _session(table, small_costs, budget)
    actions = session.plan_prefill([FN] * 10 + [PC] * 50)
    return [a[0] for a in actions], session.stage_plan


def test_a_table_with_several_plans_serves_each_budget_its_own_or_the_next_stricter(
    table, small_costs, entries
) -> None:
    """Issue 30 item 2: one table, a prompt plan per calibrated budget. The 0.4 plan keeps
    function names only INT4; the 0.6 plan keeps them BF16; a request at 0.5 gets the 0.4 plan
    (the next stricter), and ``usage``'s ``plan_budget`` says which plan served. (These costs
    put INT4 at 0.375 of BF16; below that no plan serves: ``test_below_int4s_cost...``.)"""
    strict = {FN: entries.prefill("L", "L", 0.0, 0.0), PC: entries.prefill("R", "R", 1, 1)}
    plans = [
        BudgetPlan(
            budget_total=0.4,
            budget_prefill=0.38,
            prefill=strict,
            prefill_default=strict[PC],
            choice="strict",
        ),
        BudgetPlan(
            budget_total=0.6,
            budget_prefill=table.budget_prefill,
            prefill=table.prefill,
            prefill_default=table.prefill_default,
            choice="loose",
        ),
    ]
    multi = table.model_copy(update={"plans": plans})
    loose, at_high = _planned(multi, 0.6, small_costs)
    assert at_high.plan_budget == 0.6 and loose[1:10] == [H] * 9
    picked, at_half = _planned(multi, 0.5, small_costs)
    only_strict = table.model_copy(update={"prefill": strict, "prefill_default": strict[PC]})
    only_loose, _ = _planned(table, 0.5, small_costs)
    assert at_half.plan_budget == 0.4 and picked == _planned(only_strict, 0.5, small_costs)[0]
    assert picked != only_loose
    assert at_half.budget_prompt > 0.4  # the plan is the stricter one; B is still the asked 0.5
    with pytest.raises(PolicyTableError, match="no plan for budget 0.38"):
        _session(multi, small_costs, 0.38)
    # the plans survive a save and load, checksum and all; a table without plans has no key
    again = PolicyTable.from_json(multi.to_json())
    assert again.plans == multi.plans and '"plans"' not in table.to_json()


def test_plans_must_have_increasing_budgets(table) -> None:
    plan = BudgetPlan(
        budget_total=0.3,
        budget_prefill=0.2,
        prefill=table.prefill,
        prefill_default=table.prefill_default,
    )
    with pytest.raises(ValueError, match="strictly increasing"):
        PolicyTable.model_validate({**table.model_dump(), "plans": [plan, plan]})
