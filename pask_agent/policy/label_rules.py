"""A table's prompt rules by span label, as arrays: what the label-ranked policies read.

The table stores its prefill entries per label name; ``position_both`` (the labels' mean, as
its label-free rule) and ``pask_release`` (the labels' release order) need them as one
``[label, group]`` array in ``SPAN_LABELS`` order, with the table's fallbacks resolved.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pask_agent.grammars.tags import SPAN_LABELS
from pask_agent.policy.actions import Action
from pask_agent.policy.table import PolicyTable
from pask_agent.policy.table_entries import NUM_GROUPS


@dataclass(frozen=True, slots=True)
class LabelRules:
    """Per span label and layer group: the floor and the priorities of R→L and L→H."""

    floor: np.ndarray  # int8 [labels, g]
    priority: np.ndarray  # float [labels, g, 2]

    @classmethod
    def from_table(cls, table: PolicyTable) -> LabelRules:
        floor = np.zeros((len(SPAN_LABELS), NUM_GROUPS), np.int8)
        priority = np.zeros((len(SPAN_LABELS), NUM_GROUPS, 2))
        for i, label in enumerate(SPAN_LABELS):
            for c, e in enumerate(table.prefill_entries(label)):
                floor[i, c] = Action.parse(e.floor)
                priority[i, c] = (e.priority["R->L"], e.priority["L->H"])
        return cls(floor, priority)
