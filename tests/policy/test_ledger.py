"""Budget ledger arithmetic (App. B.6, B.7) and the payload cost model (App. B.3), by hand."""

from __future__ import annotations

from fractions import Fraction

import pytest

from pask_agent.errors import ConfigError
from pask_agent.policy.actions import Action
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.ledger import BudgetLedger


def test_costs_default_model() -> None:
    # Qwen2.5-Coder-0.5B: 24 layers → groups of 8; 2 KV heads × dim 64.
    costs = PayloadCosts.from_dims(24, 2, 64)
    # n_c = 2 · Σ_{8 layers} 2 · 64 = 2048 elements; H = 2 bytes each = 4096.
    assert costs.elements_by_group == (2048, 2048, 2048)
    # k_c = 2 · Σ 2 = 32 scale rows; L = 32 rows × (64/2 + 2) bytes = 1088.
    assert costs.scale_rows_by_group == (32, 32, 32)
    assert costs.cost(Action.H, 0) == 4096
    assert costs.cost(Action.L, 1) == 1088
    assert costs.cost(Action.R, 2) == 0
    assert costs.full_bytes_per_token == 3 * 4096 == 12288
    assert costs.token_cost((Action.H, Action.L, Action.R)) == 4096 + 1088


def test_costs_odd_head_dim_and_uneven_groups() -> None:
    # 4 layers → groups [0,2), [2,3), [3,4). Head dim 5 packs into ceil(5/2) = 3 bytes per row.
    costs = PayloadCosts.from_layer_dims(4, [(1, 5), (2, 5), (1, 5), (1, 5)])
    # group 0: n = 2·(1·5 + 2·5) = 30 → H = 60; rows = 2·(1+2) = 6 → L = 6·(3+2) = 30.
    assert costs.bytes_by_group[0] == (0, 30, 60)
    # groups 1, 2: n = 10 → H = 20; rows = 2 → L = 2·5 = 10.
    assert costs.bytes_by_group[1] == (0, 10, 20)
    assert costs.bytes_by_group[2] == (0, 10, 20)
    assert costs.full_bytes_per_token == 100


@pytest.mark.parametrize("dims", [(2, 2, 64), (24, 0, 64), (24, 2, 0)])
def test_costs_reject_bad_dims(dims: tuple[int, int, int]) -> None:
    with pytest.raises(ConfigError):
        PayloadCosts.from_dims(*dims)


def test_ledger_debt_carries_forward() -> None:
    # B_D = 1/4, C_full = 96 → b = 24 bytes per token.
    ledger = BudgetLedger.start(budget=Fraction(1, 4), full_bytes_per_token=96)
    assert ledger.allowance_per_token == 24
    ledger = ledger.open_token()  # R_1 = 1·24 − 0 = 24
    assert ledger.balance == 24
    ledger = ledger.charge(32)  # a floor forces 32 > 24: balance −8, excess 8
    assert ledger.balance == -8
    assert ledger.last_excess_bytes == 8
    assert ledger.debt_bytes == 8
    ledger = ledger.open_token()  # R_2 = 2·24 − 32 = 16: the debt was paid from token 2's share
    assert ledger.balance == 16
    ledger = ledger.charge(0)
    ledger = ledger.open_token()  # R_3 = 72 − 32 = 40
    assert ledger.balance == 40
    ledger = ledger.charge(12)  # 28 left, no new excess
    assert (ledger.tokens, ledger.charged_bytes, ledger.balance) == (3, 44, 28)
    assert ledger.last_excess_bytes == 0
    assert ledger.debt_bytes == 0
    assert ledger.measured_ratio == pytest.approx(44 / (3 * 96))


def test_ledger_debt_accumulates_at_zero_budget() -> None:
    ledger = BudgetLedger.start(budget=0, full_bytes_per_token=96)
    for _ in range(3):
        ledger = ledger.open_token().charge(12)
    # b = 0: each token adds 12 of debt → balance −36. The third charge's excess is measured
    # against R_3 = −24 (which already holds the earlier debt): [12 − (−24)]_+ = 36.
    assert ledger.balance == -36
    assert ledger.debt_bytes == 36
    assert ledger.last_excess_bytes == 36


def test_ledger_keeps_fractional_bits() -> None:
    # 0.33 is read as 33/100: b = 12288 · 33/100 = 101376/25 = 4055.04 bytes.
    ledger = BudgetLedger.start(budget=0.33, full_bytes_per_token=12288)
    assert ledger.allowance_per_token == Fraction(101376, 25)
    for _ in range(25):
        ledger = ledger.open_token().charge(4055)
    # 25 · 4055.04 − 25 · 4055 = 1 byte exactly: no rounding lost on the way.
    assert ledger.balance == 1


def test_stop_token_is_free_and_values_are_snapshots() -> None:
    ledger = BudgetLedger.start(budget=0.5, full_bytes_per_token=96).open_token().charge(12)
    snapshot = ledger
    after_stop = ledger.charge_stop()
    assert after_stop == snapshot  # no allowance, no charge
    later = after_stop.open_token().charge(96)
    assert later.balance == 2 * 48 - 108 == -12
    assert snapshot.balance == 36  # the old value is untouched: restoring is reusing it


@pytest.mark.parametrize("budget", [-0.1, 1.5, "abc"])
def test_ledger_rejects_bad_budget(budget: object) -> None:
    with pytest.raises(ConfigError):
        BudgetLedger.start(budget=budget, full_bytes_per_token=96)  # type: ignore[arg-type]


def test_ledger_rejects_negative_charge_and_bad_unit() -> None:
    with pytest.raises(ConfigError):
        BudgetLedger.start(budget=0.5, full_bytes_per_token=0)
    with pytest.raises(ConfigError):
        BudgetLedger.start(budget=0.5, full_bytes_per_token=96).open_token().charge(-1)
