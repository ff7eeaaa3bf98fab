"""``position_both``: the parser-free ablation on *both* stages — position bins for the prompt
plan as well as for decoding.

``position`` replaces only the decode tags with request-local position bins and keeps PASK's
prompt plan, which the schema span labels drive; at B = 0.33 the two wrote 191 of 200 identical
answers, so the labels' value was never measured. Here the prompt's span labels are replaced
too: prompt token ``t`` of ``n`` falls in bin ``min(bins − 1, ⌊bins · t / n⌋)`` and the bin is
its planner class. Everything else is PASK's: the same table, stage budgets
(``policy/stages.py``), planner greedy, floors-then-release rule, protection, decode controller,
ledger and reserve, so a difference to ``pask`` is the labels' doing.

Per-bin rules use only what the table holds for a token it cannot label: every bin gets the
table's ``prefill_default`` base and floor, and the label-free mean of the table's upgrade
priorities per layer group and move, scaled up for later bins (``0.5 + 0.5 · (k + 1) / bins``):
newer prompt text first (the user's request sits at the end; the recency prior StreamingLLM
and ``int4`` also fall back on). The scaling is hand-set, as ``position``'s decode bins are;
calibrating the bins (paper App. C.5 recalibrates each variant) is separate work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pask_agent.errors import ConfigError
from pask_agent.grammars.tags import SPAN_LABELS
from pask_agent.policy.actions import Action
from pask_agent.policy.base import Policy, PolicyEnv
from pask_agent.policy.label_rules import LabelRules
from pask_agent.policy.pask import PaskPolicy, session_parts
from pask_agent.policy.planner import PrefillPlan, PrefillPlanner
from pask_agent.policy.position import PositionSession, position_lookup
from pask_agent.policy.registry import register_policy
from pask_agent.policy.table import PolicyTable


def prompt_bin_arrays(table: PolicyTable, bins: int) -> tuple[np.ndarray, ...]:
    """``(base, floor, priority)`` per prompt bin: ``[bins, 3]``, ``[bins, 3]``, ``[bins, 3, 2]``
    (module docstring: the table's label-free default, recency-scaled priorities)."""
    base = np.array([Action.parse(e.base) for e in table.prefill_default], np.int8)
    floor = np.array([Action.parse(e.floor) for e in table.prefill_default], np.int8)
    # [3, 2]: the mean over the span labels a prompt has without a request (``unlinked_schema``
    # depends on the question, so it stays out and the bins plan as before it existed)
    priority = LabelRules.from_table(table).priority
    mean = priority[[i for i, x in enumerate(SPAN_LABELS) if x != "unlinked_schema"]].mean(axis=0)
    ramp = 0.5 + 0.5 * (np.arange(bins) + 1) / bins  # [bins]
    return (
        np.tile(base, (bins, 1)),
        np.tile(floor, (bins, 1)),
        ramp[:, None, None] * mean[None, :, :],
    )


def prompt_bins(n: int, bins: int) -> np.ndarray:
    """``[n]`` bin of each prompt token: ``min(bins − 1, ⌊bins · t / n⌋)``."""
    return np.minimum(bins - 1, np.arange(n) * bins // max(n, 1))


@dataclass
class PositionBothSession(PositionSession):
    prompt_planner: PrefillPlanner | None = None

    def plan_prompt(
        self, labels: Sequence[str], protected: Sequence[bool], budget: float
    ) -> PrefillPlan:
        if self.prompt_planner is None:
            raise ConfigError("position_both sessions are made by PositionBothPolicy.start")
        bins = prompt_bins(len(labels), self.bins)
        return self.prompt_planner.plan_indices(bins, protected=protected, budget=budget)


@register_policy("position_both")
@dataclass(frozen=True)
class PositionBothPolicy(Policy):
    """Position bins instead of span labels and tags: PASK's machinery without the parser.

    Parameters
    ----------
    bins:
        Contiguous position bins, for the prompt (over its length) and the answer.
    expected_tokens:
        Completion length the decode bins span (as ``position``).
    table:
        The table whose budgets, label-free defaults, reserve and decode fallbacks are used
        (the shipped default if None).
    """

    bins: int = 10
    expected_tokens: int = 40
    table: PolicyTable | None = None
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    name = "position_both"
    stores_int4 = True

    def __post_init__(self) -> None:
        if self.bins < 1 or self.expected_tokens < 1:
            raise ConfigError(
                f"bins and expected_tokens must be >= 1, got {self.bins}, {self.expected_tokens}"
            )

    def start(self, env: PolicyEnv) -> PositionBothSession:
        if "table" not in self._cache:
            table = PaskPolicy(self.table).resolved_table()
            self._cache["table"] = table
            self._cache["lookup"] = position_lookup(table, self.bins)
            self._cache["arrays"] = prompt_bin_arrays(table, self.bins)
        table = self._cache["table"]
        parts = session_parts(table, env, self._cache["lookup"])
        base, floor, priority = self._cache["arrays"]
        planner = PrefillPlanner.from_arrays(
            base, floor, priority, env.costs,
            budget=parts["budget"], sinks=env.sinks, window=env.window,
        )  # fmt: skip
        return PositionBothSession(
            **parts,
            bins=self.bins,
            expected_tokens=self.expected_tokens,
            prompt_planner=planner,
        )
