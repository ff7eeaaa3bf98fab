"""pask_release with other label orders than the policy's default, on the 200 BFCL dev cases at
B = 0.20:

    python results/dev_checks/release_order_dev.py hand     # the hand-written table's order
    python results/dev_checks/release_order_dev.py hybrid   # copied values first, format next

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

from pask_agent.eval import bfcl_eval
from pask_agent.policy.label_release import LabelReleasePolicy
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


def variant(name: str, table: PolicyTable) -> None:
    """Register ``pask_release`` over ``table`` as ``name`` (for this run only)."""

    @dataclass(frozen=True)
    class Variant(LabelReleasePolicy):
        def __post_init__(self) -> None:
            super().__post_init__()
            if self.table is None:
                object.__setattr__(self, "table", table)

    Variant.name = name
    register_policy(name)(Variant)


if __name__ == "__main__":
    order = sys.argv[1] if len(sys.argv) > 1 else "hand"
    hand = PolicyTable.read(HAND_WRITTEN_TABLE_PATH)
    variant(f"pask_release_{order}", hand if order == "hand" else hybrid_table())
    sys.exit(
        bfcl_eval.main(
            [
                "--split", "dev", "--policies", f"pask_release_{order}", "--budgets", "0.20",
                "--reference", "none",
                "--out", f"results/dev_checks/bfcl_dev_b020_release_{order}",
            ]
        )
    )  # fmt: skip
