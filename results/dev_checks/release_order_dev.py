"""pask_release with other label orders than the policy's default, on the 200 BFCL dev cases at
B = 0.20:

    python results/dev_checks/release_order_dev.py hand     # the hand-written table's order
    python results/dev_checks/release_order_dev.py hybrid   # copied values first, format next
    python results/dev_checks/release_order_dev.py tail     # hand, template tail above scaffold
    python results/dev_checks/release_order_dev.py spread   # tail, scaffold released evenly

``hand``: names, keys, enum values and the request rank first, then types, descriptions,
scaffold, template text (the hand-written table's ``R->L`` priorities). ``hybrid``: the same top
rank, then the scaffold and the template's own text (under ``hand`` answers spelled the forced
JSON in one-character tokens and ran to the token limit), then types, then descriptions (under
the calibrated table's order answers lost the enum values they had to copy). Each registers its
variant under its own name for this run only and hands the rest to bfcl_eval.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from pask_agent.eval import bfcl_eval
from pask_agent.policy.label_release import LabelReleasePolicy, LabelReleaseSession
from pask_agent.policy.pask import HAND_WRITTEN_TABLE_PATH
from pask_agent.policy.registry import register_policy
from pask_agent.policy.table import PolicyTable
from pask_agent.policy.table_entries import PrefillEntry

HYBRID = {
    "protected_content": 3.0, "function_name": 3.0, "parameter_key": 3.0,
    "enum_constraint": 3.0, "schema_scaffold": 2.0, "template_text": 2.0,
    "type_constraint": 1.5, "schema_description": 1.0,
}  # fmt: skip


def hybrid_table() -> PolicyTable:
    hand = PolicyTable.read(HAND_WRITTEN_TABLE_PATH)
    prefill = {}
    for label, rank in HYBRID.items():
        entries = hand.prefill.get(label) or hand.prefill_default
        prefill[label] = [
            PrefillEntry(base=e.base, floor=e.floor, priority={"R->L": rank, "L->H": 0.0})
            for e in entries
        ]
    return hand.model_copy(update={"prefill": prefill})


SCHEMA_LABELS = {
    "schema_scaffold", "function_name", "parameter_key", "type_constraint",
    "enum_constraint", "schema_description",
}  # fmt: skip
TAIL_RANK = 0.6  # above the scaffold (0.5, 0.45, 0.4), below descriptions (1.0, 0.9, 0.8)


class TailSession(LabelReleaseSession):
    """Template text after the last schema token ranks ``TAIL_RANK`` in every group."""

    def plan_prefill(self, labels):  # type: ignore[no-untyped-def]
        out = super().plan_prefill(labels)
        last = max((i for i, x in enumerate(labels) if x in SCHEMA_LABELS), default=-1)
        tail = np.array([i > last and x == "template_text" for i, x in enumerate(labels)])
        self.prompt_rank[tail] = TAIL_RANK
        return out


def spread(n: int) -> np.ndarray:
    """``[n]`` in ``[0, 1)``: the van der Corput sequence's ranks, so that releasing the lowest
    first thins a span evenly instead of cutting it from one end."""
    out = np.zeros(n)
    for i in range(n):
        x, f, k = 0.0, 0.5, i + 1
        while k:
            x, k, f = x + f * (k & 1), k >> 1, f / 2
        out[i] = x
    return out


class SpreadSession(TailSession):
    """The tail's order, and the scaffold's tokens ranked by an even spread, not by age."""

    def plan_prefill(self, labels):  # type: ignore[no-untyped-def]
        out = super().plan_prefill(labels)
        scaffold = np.array([x == "schema_scaffold" for x in labels])
        self.prompt_rank[scaffold] += 0.04 * spread(int(scaffold.sum()))[:, None]
        return out


def variant(name: str, table: PolicyTable, session: type = LabelReleaseSession) -> None:
    """Register ``pask_release`` over ``table`` as ``name`` (for this run only)."""

    @dataclass(frozen=True)
    class Variant(LabelReleasePolicy):
        def __post_init__(self) -> None:
            super().__post_init__()
            if self.table is None:
                object.__setattr__(self, "table", table)

        def start(self, env):  # type: ignore[no-untyped-def]
            base = super().start(env)
            return session(
                env, base.budget, base.priority, tiered=True, high_ratio=0.0,
                label_rank=base.label_rank,
            )  # fmt: skip

    Variant.name = name
    register_policy(name)(Variant)


if __name__ == "__main__":
    order = sys.argv[1] if len(sys.argv) > 1 else "hand"
    hand = PolicyTable.read(HAND_WRITTEN_TABLE_PATH)
    table = hybrid_table() if order == "hybrid" else hand
    session = {"tail": TailSession, "spread": SpreadSession}.get(order, LabelReleaseSession)
    variant(f"pask_release_{order}", table, session)
    sys.exit(
        bfcl_eval.main(
            [
                "--split", "dev", "--policies", f"pask_release_{order}", "--budgets", "0.20",
                "--reference", "none",
                "--out", f"results/dev_checks/bfcl_dev_b020_release_{order}",
            ]
        )
    )  # fmt: skip
