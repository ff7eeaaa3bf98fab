"""Decode controller (§3.5, App. B.6, B.7, E.1, E.3) on hand-computed cases.

Costs come from ``small_costs``: per group m(H) = 32, m(L) = 12, m(R) = 0 bytes, C_full = 96,
so a promotion R→L adds 12 bytes and L→H adds 20.
"""

from __future__ import annotations

import itertools
import random
import statistics
import time
from fractions import Fraction
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pask_agent.errors import ConfigError
from pask_agent.grammars.tags import VOCABULARIES, Tag
from pask_agent.policy.actions import Action
from pask_agent.policy.controller import DecodeController, DecodeLookup
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.default_table import build_default_table
from pask_agent.policy.table import PolicyTable
from pask_agent.policy.table_entries import ReserveRow

H, L, R = Action.H, Action.L, Action.R
SB = Tag("schema_bearing", "optional", "boundary", "no_lookahead")  # → "schema_bearing"
CRIT = Tag("schema_bearing", "required", "critical", "no_lookahead")  # → ".../critical"


def scored_table(make_table, entries: SimpleNamespace, **kwargs) -> PolicyTable:
    """schema_bearing: base L, floor R; upgrade/downgrade scores differ per group."""
    return make_table(
        decode={
            # group: (base, floor, (R->L, L->H), (H->L, L->R))
            "schema_bearing": entries.decode(
                ("L", "R", (3.0, 2.0), (2.0, 3.0)),
                ("L", "R", (1.0, 5.0), (5.0, 1.0)),
                ("L", "R", (4.0, 1.0), (1.0, 4.0)),
            ),
            "schema_bearing/required/critical": entries.uniform("H", "H"),
            "free_generation": entries.decode(
                ("R", "R", (3.0, 2.0), None),
                ("R", "R", (1.0, 5.0), None),
                ("R", "R", (4.0, 1.0), None),
            ),
        },
        **kwargs,
    )


def test_fallback_chain(make_table, entries, small_costs: PayloadCosts) -> None:
    table = make_table(
        decode={
            "schema_bearing/required/critical/lookahead_critical": entries.uniform("H", "H"),
            "schema_bearing/required/critical": entries.uniform("L", "L"),
            "schema_bearing/required": entries.uniform("L", "R"),
            "schema_bearing": entries.uniform("R", "R"),
            "free_generation/optional": entries.uniform("L", "L"),
        },
        decode_fallback={"pure_scaffold": "free_generation/optional"},
    )
    lookup = DecodeLookup.from_table(table)
    cases = {
        Tag("schema_bearing", "required", "critical", "lookahead_critical"): (
            "schema_bearing/required/critical/lookahead_critical"
        ),
        Tag("schema_bearing", "required", "critical", "no_lookahead"): (
            "schema_bearing/required/critical"
        ),
        Tag("schema_bearing", "required", "boundary", "lookahead_critical"): (
            "schema_bearing/required"
        ),
        Tag("schema_bearing", "optional", "boundary", "no_lookahead"): "schema_bearing",
        # no entry on any level → table default
        Tag("free_generation", "required", "boundary", "no_lookahead"): "<default>",
        # class "pure_scaffold" has no entry but a fallback map to another bucket
        Tag("pure_scaffold", "dispatch_key", "critical", "no_lookahead"): (
            "free_generation/optional"
        ),
        # a role outside the FC vocabulary still walks the parents at lookup time
        Tag("schema_bearing", "relation", "stable", "no_lookahead"): "schema_bearing",
    }
    for tag, key in cases.items():
        assert lookup.resolve(tag).key == key, tag
    assert lookup.resolve(None).key == "<default>"
    # At B_D = 0 every token drops to its floors, which shows which bucket was used.
    ctl = DecodeController(table, small_costs, budget=0)
    floors = [ctl.on_token(tag).actions for tag in cases]
    assert floors == [(H,) * 3, (L,) * 3, (R,) * 3, (R,) * 3, (R,) * 3, (L,) * 3, (R,) * 3]


def test_floor_debt_then_demotion_order(make_table, entries, small_costs) -> None:
    # B_D = 1/4 → b = 24 bytes per token; no reserve.
    ctl = DecodeController(scored_table(make_table, entries), small_costs, budget=Fraction(1, 4))
    # t=1: R=24; start L,L,L = 36 > 24 → demote lowest L→R score: group 1 (1.0) → L,R,L = 24.
    d = ctl.on_token(SB)
    assert (d.actions, d.payload_bytes, d.balance_after) == ((L, R, L), 24, 0)
    # t=2: critical, floors H,H,H = 96 > R=24; nothing may go below a floor → debt 72.
    d = ctl.on_token(CRIT)
    assert (d.actions, d.floors, d.payload_bytes, d.balance_after) == ((H,) * 3, (H,) * 3, 96, -72)
    # t=3: R = −72 + 24 = −48 → B_t = 0: demote in score order g1 (1), g0 (3), g2 (4) → R,R,R.
    assert ctl.on_token(SB).actions == (R, R, R)
    assert ctl.ledger.balance == -48
    # t=4: R=−24 → R,R,R; t=5: R=0 → R,R,R; t=6: R=24 → L,R,L again (debt paid back).
    assert [ctl.on_token(SB).actions for _ in range(3)] == [(R, R, R), (R, R, R), (L, R, L)]
    assert ctl.ledger.balance == 0
    assert ctl.ledger.charged_bytes == 24 + 96 + 24 == 144 == 6 * 24


def test_promotions_by_score(make_table, entries, small_costs) -> None:
    # B_D = 1/2 → b = 48.
    ctl = DecodeController(scored_table(make_table, entries), small_costs, budget=Fraction(1, 2))
    # t=1: R=48; L,L,L = 36; best L→H is group 1 (5.0) but 36+20 = 56 > 48 → nothing fits.
    assert ctl.on_token(SB).actions == (L, L, L)
    # t=2: R = 96 − 36 = 60 → group 1 to H: 56 ≤ 60; group 0 next (2.0): 76 > 60 → stop.
    d = ctl.on_token(SB)
    assert (d.actions, d.balance_after) == ((L, H, L), 4)
    # t=3: R = 52 → 56 does not fit → L,L,L (balance 16); t=4: R = 64 → L,H,L (balance 8).
    assert [ctl.on_token(SB).actions for _ in range(2)] == [(L, L, L), (L, H, L)]
    assert ctl.ledger.balance == 8


def test_two_steps_per_group_and_chained_ranking(make_table, entries, small_costs) -> None:
    # free_generation: base R everywhere. B_D = 1/2 → R_1 = 48.
    ctl = DecodeController(scored_table(make_table, entries), small_costs, budget=Fraction(1, 2))
    tag = Tag("free_generation", "optional", "boundary", "no_lookahead")
    # R→L scores g0 3, g1 1, g2 4: g2 first (12), then g0 (24); then g0's L→H (2.0) beats
    # g1 R→L (1.0) and g2 L→H (1.0): 24+20 = 44 ≤ 48. Next both remaining cost > 4 → stop.
    d = ctl.on_token(tag)
    assert (d.actions, d.payload_bytes) == ((H, R, L), 44)


def test_tie_order(make_table, entries, small_costs) -> None:
    # Equal scores everywhere; b = 12 (B_D = 1/8) pays for exactly one R→L promotion.
    tag = Tag("free_generation", "optional", "boundary", "no_lookahead")
    others = ["0:L->H", "1:L->H", "2:L->H", "0:H->L", "1:H->L", "2:H->L"]
    demotes = ["0:L->R", "1:L->R", "2:L->R"]
    first_2 = make_table(
        decode={"free_generation": entries.uniform("R", "R")},
        tie_order=["2:R->L", "0:R->L", "1:R->L", *others, *demotes],
    )
    first_1 = make_table(
        decode={"free_generation": entries.uniform("R", "R")},
        tie_order=["1:R->L", "2:R->L", "0:R->L", *others, *demotes],
    )
    assert DecodeController(first_2, small_costs, budget=Fraction(1, 8)).on_token(tag).actions == (
        R,
        R,
        L,
    )
    assert DecodeController(first_1, small_costs, budget=Fraction(1, 8)).on_token(tag).actions == (
        R,
        L,
        R,
    )
    # Demotion ties: start H,H,H = 96, b = 76 (B_D = 19/24) → exactly one H→L (−20) needed.
    ups = ["0:R->L", "1:R->L", "2:R->L", "0:L->H", "1:L->H", "2:L->H"]
    demote_1 = make_table(
        decode={"free_generation": entries.uniform("H", "R")},
        tie_order=[*ups, "1:H->L", "0:H->L", "2:H->L", *demotes],
    )
    d = DecodeController(demote_1, small_costs, budget=Fraction(19, 24)).on_token(tag)
    assert (d.actions, d.payload_bytes) == ((H, L, H), 76)


def test_reserve_holds_budget_back(make_table, entries, small_costs) -> None:
    # Γ at B_D = 0.5 in units of C_full (96 bytes): boundary 0.25 → 24, critical 0.5 → 48.
    rows = [ReserveRow(budget=0.5, by_state={"boundary": 0.25, "critical": 0.5}, pooled=0.125)]
    table = scored_table(make_table, entries, reserve_rows=rows)
    ctl = DecodeController(table, small_costs, budget=Fraction(1, 2))
    # t=1 (boundary): R=48, B = 48 − 24 = 24 → L,L,L = 36 > 24 → demote group 1 → L,R,L.
    d = ctl.on_token(SB)
    assert (d.actions, d.reserve_bytes, d.balance_after) == ((L, R, L), 24, 24)
    # t=2: a critical state, but role "optional" has no critical bucket, so the bucket is still
    # "schema_bearing"; only the reserve changes. R = 72, B = 72 − 48 = 24.
    crit_sb = Tag("schema_bearing", "optional", "critical", "no_lookahead")
    d = ctl.on_token(crit_sb)
    assert (d.actions, d.reserve_bytes, d.balance_after) == ((L, R, L), 48, 48)
    # t=3 (boundary): R = 96, B = 72 → L,L,L 36 + group-1 L→H = 56 ≤ 72; group 0: 76 > 72.
    d = ctl.on_token(SB)
    assert (d.actions, d.balance_after) == ((L, H, L), 40)
    # Untagged tokens use the pooled reserve: 0.125 · 96 = 12 bytes.
    assert ctl.on_token(None).reserve_bytes == 12
    # Without the reserve, t=1 would have kept L,L,L.
    plain = DecodeController(scored_table(make_table, entries), small_costs, budget=Fraction(1, 2))
    assert plain.on_token(SB).actions == (L, L, L)


def test_reserve_interpolates_between_budgets(make_table, small_costs) -> None:
    rows = [
        ReserveRow(budget=0.25, by_state={"critical": 1.0}, pooled=0.5),
        ReserveRow(budget=0.75, by_state={"critical": 0.0}, pooled=0.0),
    ]
    table = make_table(reserve_rows=rows)
    # B_D = 0.5 is halfway: critical 0.5 · 96 = 48, pooled 0.25 · 96 = 24 (also unseen states).
    mid = DecodeController(table, small_costs, budget=0.5).reserve
    assert (mid.for_state("critical"), mid.for_state("boundary"), mid.for_state(None)) == (
        48,
        24,
        24,
    )
    # Outside the calibrated budgets the end rows apply.
    assert DecodeController(table, small_costs, budget=0.1).reserve.for_state("critical") == 96
    assert DecodeController(table, small_costs, budget=0.9).reserve.for_state("critical") == 0


def test_cross_boundary_token_combines_conservatively(make_table, entries, small_costs) -> None:
    rows = [ReserveRow(budget=0.5, by_state={"boundary": 0.25, "critical": 0.5}, pooled=0.0)]
    table = scored_table(make_table, entries, reserve_rows=rows)
    ctl = DecodeController(table, small_costs, budget=Fraction(1, 2))
    # SB alone has floors R; with a critical candidate the H floors and the larger reserve
    # (0.5 · 96 = 48) apply: H,H,H = 96 is charged against R_1 = 48.
    d = ctl.on_token(SB, candidates=(CRIT,))
    assert (d.floors, d.actions, d.reserve_bytes) == ((H,) * 3, (H,) * 3, 48)
    assert d.bucket == "schema_bearing|schema_bearing/required/critical"
    assert ctl.ledger.balance == 48 - 96


def test_stop_token_costs_nothing(make_table, entries, small_costs) -> None:
    ctl = DecodeController(scored_table(make_table, entries), small_costs, budget=Fraction(1, 2))
    ctl.on_token(SB)
    before = ctl.ledger
    d = ctl.on_token(None, is_stop=True)
    assert d.is_stop and d.payload_bytes == 0 and d.actions == (R, R, R)
    assert d.index == 1
    assert ctl.ledger == before  # neither allowance nor charge


def test_rollback_restores_ledger_and_pending(make_table, entries, small_costs) -> None:
    table = scored_table(make_table, entries, window_tokens=2)
    tags = [SB, CRIT, SB, SB, None, CRIT, SB, SB]
    reference = DecodeController(table, small_costs, budget=Fraction(1, 3))
    expected = [reference.on_token(t) for t in tags]
    ctl = DecodeController(table, small_costs, budget=Fraction(1, 3), max_rollback=4)
    for t in tags[:5]:
        ctl.on_token(t)
    ledger_5, pending_5 = ctl.ledger, ctl.pending()
    assert [d.index for d in pending_5] == [3, 4]  # window of 2: tokens 3 and 4 not executed
    # A speculative branch of 3 rejected tokens (plus a stop), then rolled back.
    for t in (CRIT, CRIT, CRIT):
        ctl.on_token(t)
    ctl.on_token(None, is_stop=True)
    ctl.rollback(4)
    assert ctl.ledger == ledger_5
    assert ctl.pending() == pending_5
    # Continuing gives exactly what the un-branched run gave.
    assert [ctl.on_token(t) for t in tags[5:]] == expected[5:]
    with pytest.raises(ConfigError, match="max_rollback"):
        ctl.rollback(5)


def _expected_floors(table: PolicyTable, tag: Tag) -> tuple[Action, ...]:
    # Independent re-implementation of the fallback chain on the raw table.
    for key in tag.parents():
        key = key if key in table.decode else table.decode_fallback.get(key, key)
        if key in table.decode:
            return tuple(Action.parse(e.floor) for e in table.decode[key])
    return tuple(Action.parse(e.floor) for e in table.decode_default)


_DEFAULT = build_default_table()
_QWEN = PayloadCosts.from_dims(24, 2, 64)
_TAGS = [
    Tag(*fields)
    for family in ("function_calling", "sql")
    for fields in itertools.product(*VOCABULARIES[family].values())
]


@settings(max_examples=60, deadline=None)
@given(
    budget=st.fractions(min_value=0, max_value=1, max_denominator=1000),
    picks=st.lists(st.integers(0, len(_TAGS)), min_size=1, max_size=120),
)
def test_floors_never_break(budget: Fraction, picks: list[int]) -> None:
    ctl = DecodeController(_DEFAULT, _QWEN, budget=budget)
    charged = 0
    for i in picks:
        tag = _TAGS[i] if i < len(_TAGS) else None
        d = ctl.on_token(tag)
        if tag is None:
            floors = tuple(Action.parse(e.floor) for e in _DEFAULT.decode_default)
        else:
            floors = _expected_floors(_DEFAULT, tag)
        assert d.floors == floors
        assert all(a >= f for a, f in zip(d.actions, d.floors, strict=True))
        assert d.payload_bytes == _QWEN.token_cost(d.actions)
        charged += d.payload_bytes
    b = budget * _QWEN.full_bytes_per_token
    assert ctl.ledger.balance == len(picks) * b - charged


def test_per_token_time_is_flat() -> None:
    # Complexity check (App. E.3): the median cost of a token does not grow with history.
    rng = random.Random(0)
    tags = [rng.choice(_TAGS) for _ in range(10_000)]
    ctl = DecodeController(_DEFAULT, _QWEN, budget=0.33)
    times = []
    for tag in tags:
        start = time.perf_counter()
        ctl.on_token(tag)
        times.append(time.perf_counter() - start)
    early = statistics.median(times[10:510])
    late = statistics.median(times[9_500:10_000])
    assert late < 3 * early, (early, late)
    assert len(ctl.pending()) <= _DEFAULT.window_tokens


def test_rejects_bad_config(make_table, small_costs) -> None:
    table = make_table()
    with pytest.raises(ConfigError):
        DecodeController(table, small_costs, budget=1.5)
    with pytest.raises(ConfigError):
        DecodeController(table, small_costs, max_rollback=-1)
    ledger = DecodeController(table, small_costs, budget=0.25).ledger
    with pytest.raises(ConfigError, match="differs"):
        DecodeController(table, small_costs, budget=0.5, ledger=ledger)
    with pytest.raises(ConfigError, match="C_full"):
        DecodeController(table, PayloadCosts.from_dims(24, 2, 64), ledger=ledger)


def test_ledger_continues_across_controllers(make_table, entries, small_costs) -> None:
    # A conversation passes its ledger on: the second controller starts in debt.
    table = scored_table(make_table, entries)
    first = DecodeController(table, small_costs, budget=Fraction(1, 4))
    first.on_token(CRIT)  # 96 charged against R_1 = 24 → −72
    second = DecodeController(table, small_costs, ledger=first.ledger)
    d = second.on_token(SB)  # R_2 = −48 → everything demoted to the R floors
    assert (d.index, d.actions, d.balance_after) == (1, (R, R, R), -48)
