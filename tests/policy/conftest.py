"""Small hand-checkable tables and costs for the policy tests.

Costs: 3 layers (one per group), 1 KV head, head dim 8, so per token and group
m(H) = 2 B × 2 × 8 = 32 bytes, m(L) = 2 rows × (8/2 + 2) = 12 bytes, m(R) = 0 and C_full = 96.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from pask_agent.grammars.tags import SPAN_LABELS, VOCABULARIES
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.table import PolicyTable
from pask_agent.policy.table_entries import (
    NUM_GROUPS,
    DecodeEntry,
    PrefillEntry,
    Reserve,
    ReserveRow,
    tie_key,
)

SMALL_HASH = "ab" * 32
GroupSpec = tuple[str, str, tuple[float, float], tuple[float, float] | None]


def decode_entries(*groups: GroupSpec) -> list[DecodeEntry]:
    """``(base, floor, (R->L, L->H), (H->L, L->R) or None)`` per group."""
    out = []
    for base, floor, (rl, lh), down in groups:
        data: dict[str, Any] = {"base": base, "floor": floor, "upgrade": {"R->L": rl, "L->H": lh}}
        if down is not None:
            data["downgrade"] = {"H->L": down[0], "L->R": down[1]}
        out.append(DecodeEntry.model_validate(data))
    return out


def uniform(base: str, floor: str, up: float = 1.0) -> list[DecodeEntry]:
    return decode_entries(*[(base, floor, (up, up), None)] * NUM_GROUPS)


def prefill_entries(base: str, floor: str, rl: float, lh: float) -> list[PrefillEntry]:
    return [
        PrefillEntry(base=base, floor=floor, priority={"R->L": rl, "L->H": lh})
        for _ in range(NUM_GROUPS)
    ]


DEFAULT_TIE = [tie_key(c, m) for m in ("R->L", "L->H", "H->L", "L->R") for c in range(3)]


@pytest.fixture
def small_costs() -> PayloadCosts:
    return PayloadCosts.from_dims(3, 1, 8)


@pytest.fixture
def make_table() -> Callable[..., PolicyTable]:
    def build(
        *,
        decode: dict[str, list[DecodeEntry]] | None = None,
        decode_default: list[DecodeEntry] | None = None,
        decode_fallback: dict[str, str] | None = None,
        prefill: dict[str, list[PrefillEntry]] | None = None,
        reserve_rows: list[ReserveRow] | None = None,
        tie_order: list[str] | None = None,
        budget_decode: float = 0.5,
        budget_prefill: float = 0.5,
        sink_tokens: int = 0,
        window_tokens: int = 0,
        model_id: str = "tiny-test-model",
    ) -> PolicyTable:
        return PolicyTable(
            source="test",
            model_id=model_id,
            tokenizer_hash=SMALL_HASH,
            num_layers=3,
            layer_boundaries=(1, 2),
            num_kv_heads=1,
            head_dim=8,
            families=["function_calling"],
            vocabularies={
                "function_calling": {
                    k: list(v) for k, v in VOCABULARIES["function_calling"].items()
                }
            },
            span_labels=list(SPAN_LABELS),
            decode=decode or {},
            decode_default=decode_default or uniform("R", "R"),
            decode_fallback=decode_fallback or {},
            prefill=prefill or {},
            prefill_default=prefill_entries("R", "R", 0.0, 0.0),
            tie_order=tie_order or DEFAULT_TIE,
            reserve=Reserve(
                beta=0.8,
                horizon=8,
                rows=reserve_rows or [ReserveRow(budget=0.5, by_state={}, pooled=0.0)],
            ),
            budget_decode=budget_decode,
            budget_prefill=budget_prefill,
            sink_tokens=sink_tokens,
            window_tokens=window_tokens,
            alpha_decode=0.01,
            alpha_prefill=0.01,
        )

    return build


@pytest.fixture
def entries() -> SimpleNamespace:
    """Entry builders: ``entries.decode``, ``entries.uniform``, ``entries.prefill``."""
    return SimpleNamespace(decode=decode_entries, uniform=uniform, prefill=prefill_entries)
