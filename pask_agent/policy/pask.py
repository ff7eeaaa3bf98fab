"""``pask``: the frozen table's prefill plan for prompt spans and the online decode controller
for generated tokens (paper §3.5, §3.6)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pask_agent.grammars.tags import Tag
from pask_agent.policy.actions import Action
from pask_agent.policy.base import Actions, Policy, PolicyEnv
from pask_agent.policy.controller import DecodeController, DecodeLookup
from pask_agent.policy.default_table import DEFAULT_TABLE_PATH
from pask_agent.policy.planner import PrefillPlanner
from pask_agent.policy.registry import register_policy
from pask_agent.policy.table import PolicyTable


@dataclass
class PaskSession:
    controller: DecodeController
    planner: PrefillPlanner

    def plan_prefill(self, labels: Sequence[str]) -> Sequence[Actions]:
        plan = self.planner.plan(labels, protected=[False] * len(labels))
        return [tuple(Action(int(a)) for a in row) for row in plan.actions]  # type: ignore[misc]

    def on_token(self, tag: Tag | None, *, is_stop: bool = False) -> Actions:
        return self.controller.on_token(tag, is_stop=is_stop).actions  # type: ignore[return-value]


@register_policy("pask")
@dataclass(frozen=True)
class PaskPolicy(Policy):
    """PASK over a frozen table (the shipped default table unless one is given)."""

    table: PolicyTable | None = None
    _lookup: dict = field(default_factory=dict, compare=False, repr=False)
    name = "pask"
    needs_tags = True
    needs_labels = True

    def resolved_table(self) -> PolicyTable:
        if self.table is not None:
            return self.table
        if "table" not in self._lookup:
            self._lookup["table"] = PolicyTable.from_json(
                DEFAULT_TABLE_PATH.read_text(), origin=str(DEFAULT_TABLE_PATH)
            )
        return self._lookup["table"]

    def start(self, env: PolicyEnv) -> PaskSession:
        table = self.resolved_table()
        if "decode" not in self._lookup:
            self._lookup["decode"] = DecodeLookup.from_table(table)
        return PaskSession(
            DecodeController(table, env.costs, budget=env.budget, lookup=self._lookup["decode"]),
            PrefillPlanner(table, env.costs, budget=env.budget),
        )
