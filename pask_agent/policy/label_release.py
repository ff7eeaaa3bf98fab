"""``pask_release``: below INT4's cost, release prompt tokens in the order of their span labels.

Uniform INT4 (``int4``) costs about 0.27 of Full KV; a budget under that must *release* tokens,
and then which tokens go is the whole game. ``int4`` releases the oldest first: it has nothing
else to go by. This policy stores every token INT4 outside the sinks and the recent window, as
``int4`` does, and when the request's bytes pass ``B`` it releases settled tokens in the order
the table's span labels give (``LabelRules``: each label's ``R→L`` priority in each layer
group, the lowest first; older first within a label). The answer being decoded outranks every
prompt token, so it is never released while prompt is left: at ``B = 0.20`` on BFCL dev,
releasing answer tokens made parallel answers loop to the token limit (``policy/stages.py``).

It differs from ``int4`` in one thing, the ranking, so the difference between the two is the
labels' doing; and from ``pask`` in that nothing is planned at prefill: the prompt is cut as
the answer grows, so the cut is sized by the real answer, not the expected one, and every
step ends within ``B`` (``ScoredSession``'s tiered fit, per layer group).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from pask_agent.grammars.tags import SPAN_LABELS, Tag
from pask_agent.policy.actions import Action
from pask_agent.policy.base import Actions, DecodeDemand, Policy, PolicyEnv, RetentionView
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.pask import HAND_WRITTEN_TABLE_PATH, LabelRules
from pask_agent.policy.registry import register_policy
from pask_agent.policy.scored import ScoredSession, check_budget, recency, resolve_budget
from pask_agent.policy.table import PolicyTable

_INT4: Actions = (Action.L, Action.L, Action.L)
_LABEL_INDEX = {label: i for i, label in enumerate(SPAN_LABELS)}


@dataclass
class LabelReleaseSession(ScoredSession):
    """INT4 everywhere; over ``B``, the lowest-ranked settled tokens are released."""

    label_rank: np.ndarray = field(default_factory=lambda: np.zeros((len(SPAN_LABELS), 3)))
    ranks: list[np.ndarray] = field(default_factory=list)  # per group: [positions so far]

    def plan_prefill(self, labels: Sequence[str]) -> Sequence[Actions]:
        """Every prompt token INT4; its rank comes from its label (the whole prompt is
        planned each turn, so the ranks restart from position 0)."""
        index = np.array([_LABEL_INDEX.get(x, -1) for x in labels], dtype=np.int64)
        fallback = self.label_rank.min(axis=0)  # a label the table lacks goes first
        rows = np.where(index[:, None] >= 0, self.label_rank[np.maximum(index, 0)], fallback)
        self.ranks = [rows[:, g].copy() for g in range(3)]
        return [_INT4] * len(labels)

    def on_token(self, tag: Tag | None, *, is_stop: bool = False) -> Actions:
        answer = self.label_rank.max() + 1.0  # above every prompt label
        self.ranks = [np.append(r, answer) for r in self.ranks]
        return _INT4

    def rank(self, view: RetentionView, group: int) -> np.ndarray:
        """``[length]``: each position's label rank (positions the session has not seen, if
        any, rank with the lowest label)."""
        out = np.full(view.length, float(self.label_rank.min()), dtype=np.float64)
        if self.ranks:
            n = min(len(self.ranks[group]), view.length)
            out[:n] = self.ranks[group][:n]
        return out

    def decode_demand(self, costs: PayloadCosts) -> DecodeDemand:
        """An INT4 row per generated token (a release only ever frees one)."""
        cost = costs.token_cost(_INT4)
        return DecodeDemand(
            Fraction(cost),
            cost,
            row_shares=((0.0,) * 3, (1.0,) * 3),  # type: ignore[arg-type]
        )


@register_policy("pask_release")
@dataclass(frozen=True)
class LabelReleasePolicy(Policy):
    """INT4 outside sinks and window; over ``B``, release by span label, answer last.

    Parameters
    ----------
    budget:
        Target total ``B`` when the request names none (1.0: never release).
    table:
        The table whose prompt priorities rank the labels (the hand-written one if None).
    """

    budget: float = 1.0
    table: PolicyTable | None = None
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    name = "pask_release"
    needs_labels = True
    revises = True
    stores_int4 = True

    def __post_init__(self) -> None:
        check_budget(self.budget)

    def start(self, env: PolicyEnv) -> LabelReleaseSession:
        if "rank" not in self._cache:
            table = self.table or PolicyTable.read(HAND_WRITTEN_TABLE_PATH)
            self._cache["rank"] = LabelRules.from_table(table).priority[:, :, 0]
        return LabelReleaseSession(
            env, resolve_budget(env, self.budget), recency, tiered=True, high_ratio=0.0,
            label_rank=self._cache["rank"],
        )  # fmt: skip
