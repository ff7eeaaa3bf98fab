"""``pask``: the frozen table's prefill plan for prompt spans and the online decode controller
for generated tokens (paper §3.5, §3.6), held to the target *total* budget.

The two stage budgets are both set to the target ``B`` (``B_P = B_D = B``). Two things make the
measured total exceed the stage plans: the store keeps sinks and the recent window high whatever
was scheduled for them, and decode floors can leave ledger debt (App. B.6). The prompt's sinks
and last ``window`` tokens are therefore planned ``H`` (inside ``T_P``, so the guard never
over-demotes for a window that is about to move on), and after each step a
budget guard (``revise``) checks each layer group's live bytes against ``B ×`` its Full-KV bytes
and, when over, demotes settled *prompt* tokens one adjacent step at a time (H→L, L→R), lowest
prefill priority first, never below their floors; what floors alone cannot absorb stays over
(and is visible in the measured ``B``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pask_agent.grammars.tags import SPAN_LABELS, Tag
from pask_agent.policy.actions import Action
from pask_agent.policy.base import (
    Actions,
    DecodeDemand,
    Demotion,
    Policy,
    PolicyEnv,
    RetentionView,
)
from pask_agent.policy.controller import DecodeController, DecodeLookup
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.default_table import DEFAULT_TABLE_PATH
from pask_agent.policy.planner import PrefillPlanner
from pask_agent.policy.registry import register_policy
from pask_agent.policy.table import NUM_GROUPS, PolicyTable


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
            entries = table.prefill.get(label)
            if entries is None and label in table.prefill_fallback:
                entries = table.prefill[table.prefill_fallback[label]]
            for c, e in enumerate(entries or table.prefill_default):
                floor[i, c] = Action.parse(e.floor)
                priority[i, c] = (e.priority["R->L"], e.priority["L->H"])
        return cls(floor, priority)


@dataclass
class PaskSession:
    controller: DecodeController
    planner: PrefillPlanner
    costs: PayloadCosts | None = None  # None: no budget guard
    budget: float = 1.0
    rules: LabelRules | None = None
    sinks: int = 0  # the store's protection, planned as H so the plan's bytes are the real ones
    window: int = 0
    _labels: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _prompt_start: int = -1  # -1 until the prompt of the last plan is fully processed

    def plan_prefill(self, labels: Sequence[str]) -> Sequence[Actions]:
        n = len(labels)
        protected = [i < self.sinks or i >= n - self.window for i in range(n)]
        plan = self.planner.plan(labels, protected=protected)
        index = {label: i for i, label in enumerate(SPAN_LABELS)}
        self._labels = np.array([index[x] for x in labels], np.int64)
        self._prompt_start = -1
        return [tuple(Action(int(a)) for a in row) for row in plan.actions]  # type: ignore[misc]

    def on_token(self, tag: Tag | None, *, is_stop: bool = False) -> Actions:
        return self.controller.on_token(tag, is_stop=is_stop).actions  # type: ignore[return-value]

    def decode_demand(self, costs: PayloadCosts) -> DecodeDemand:
        """``b = B_D · C_full`` per generated token and the largest reserve ``Γ`` (App. B.4)."""
        reserve = self.controller.reserve
        return DecodeDemand(
            self.controller.ledger.allowance_per_token,
            0,
            max([reserve.pooled, *reserve.by_state.values()]),
        )

    def revise(self, view: RetentionView) -> list[Demotion]:
        """The budget guard: while the sequence's live bytes exceed ``B`` × its Full-KV bytes,
        demote settled prompt tokens one step (H→L, L→R), lowest priority first, above floors.

        The check is over all layer groups together: the planner and controller may spend
        more in one group than another, so only the total is held to ``B``.
        """
        if self.costs is None or self.rules is None or self.budget >= 1 or not view.prefill_done:
            return []
        if self._prompt_start < 0:
            self._prompt_start = view.length - len(self._labels)
        costs = self.costs
        protected = min(view.sinks, view.length) + view.length - max(view.settled, view.sinks)
        live = sum(
            (protected + len(view.high[g])) * costs.cost(Action.H, g)
            + len(view.low[g]) * costs.cost(Action.L, g)
            for g in range(NUM_GROUPS)
        )
        excess = live - math.floor(self.budget * view.length * costs.full_bytes_per_token)
        if excess <= 0:
            return []
        moves = self._moves(view)
        moves.sort(key=lambda m: (m[0], -m[1], m[2]))
        chosen: dict[tuple[int, int], list[int]] = {}
        for _, p, g, a in moves:
            if excess <= 0:
                break
            chosen.setdefault((g, a), []).append(p)
            excess -= costs.cost(Action(a), g) - costs.cost(Action(a - 1), g)
        return [Demotion(g, tuple(ps), Action(a - 1)) for (g, a), ps in sorted(chosen.items())]

    def _moves(self, view: RetentionView) -> list[tuple[float, int, int, int]]:
        """``(priority lost, position, group, current action)`` of every allowed demotion."""
        rules = self.rules
        start, n = self._prompt_start, len(self._labels)
        moves: list[tuple[float, int, int, int]] = []
        for g in range(NUM_GROUPS):
            for held, action in ((view.high[g], Action.H), (view.low[g], Action.L)):
                pos = held[(held >= start) & (held < start + n)]
                lab = self._labels[pos - start]
                ok = rules.floor[lab, g] < action  # type: ignore[union-attr]
                lost = rules.priority[lab[ok], g, int(action) - 1]  # type: ignore[union-attr]
                moves += [
                    (float(s), int(p), g, int(action)) for s, p in zip(lost, pos[ok], strict=True)
                ]
        return moves


@register_policy("pask")
@dataclass(frozen=True)
class PaskPolicy(Policy):
    """PASK over a frozen table (the shipped default table unless one is given).

    Parameters
    ----------
    table:
        The frozen table; the shipped default when None.
    guard:
        Hold the measured total to the target ``B`` with the budget guard (see module doc).
    allow_transfer:
        Use the table on a model or tokenizer other than the one it was calibrated for (paper
        §4.5); by default that is a ``PolicyTableError``.
    """

    table: PolicyTable | None = None
    guard: bool = True
    allow_transfer: bool = False
    _lookup: dict = field(default_factory=dict, compare=False, repr=False)
    name = "pask"
    needs_tags = True
    needs_labels = True
    revises = True

    def resolved_table(self, env: PolicyEnv | None = None) -> PolicyTable:
        """The table, checked against ``env``'s model and tokenizer when it names them.

        Raises
        ------
        PolicyTableError
            The table was calibrated for another model or tokenizer (and ``allow_transfer`` is
            off), or the shipped table file is unreadable or corrupt.
        """
        if "table" not in self._lookup:
            self._lookup["table"] = self.table or PolicyTable.read(DEFAULT_TABLE_PATH)
        table: PolicyTable = self._lookup["table"]
        if env is not None and env.tokenizer_hash is not None and not self.allow_transfer:
            key = ("checked", env.model_id, env.tokenizer_hash)
            if key not in self._lookup:
                table.check_model(
                    model_id=env.model_id or table.model_id, tokenizer_hash=env.tokenizer_hash
                )
                self._lookup[key] = True
        return table

    def start(self, env: PolicyEnv) -> PaskSession:
        table = self.resolved_table(env)
        if "decode" not in self._lookup:
            self._lookup["decode"] = DecodeLookup.from_table(table)
            self._lookup["rules"] = LabelRules.from_table(table)
        return PaskSession(
            DecodeController(table, env.costs, budget=env.budget, lookup=self._lookup["decode"]),
            PrefillPlanner(table, env.costs, budget=env.budget),
            costs=env.costs if self.guard else None,
            budget=table.budget_prefill if env.budget is None else env.budget,
            rules=self._lookup["rules"],
            sinks=env.sinks if self.guard else 0,
            window=env.window if self.guard else 0,
        )
