"""pask_release with the hand-written table's label order (names, keys, enum values and the
request first; types, then descriptions; scaffold and template text last) instead of the shipped
calibrated table's, on the 200 BFCL dev cases at B = 0.20, beside int4 in the same run.

    python results/dev_checks/release_order_dev.py

Registers the variant under its own name for this run only and hands the rest to bfcl_eval.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from pask_agent.eval import bfcl_eval
from pask_agent.policy.label_release import LabelReleasePolicy
from pask_agent.policy.pask import HAND_WRITTEN_TABLE_PATH
from pask_agent.policy.registry import register_policy
from pask_agent.policy.table import PolicyTable


@register_policy("pask_release_hand")
@dataclass(frozen=True)
class HandOrderRelease(LabelReleasePolicy):
    name = "pask_release_hand"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.table is None:
            object.__setattr__(self, "table", PolicyTable.read(HAND_WRITTEN_TABLE_PATH))


if __name__ == "__main__":
    sys.exit(
        bfcl_eval.main(
            [
                "--split", "dev", "--policies", "pask_release_hand", "--budgets", "0.20",
                "--reference", "none", "--out", "results/dev_checks/bfcl_dev_b020_release_hand",
            ]
        )
    )  # fmt: skip
