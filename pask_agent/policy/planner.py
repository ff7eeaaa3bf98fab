"""The prefill companion's planner: prompt span labels → a frozen R/L/H plan (§3.6, App. B.4).

Given the span label of every prompt token, the planner fills the target
``T_P = B_P · n · C_full`` bytes:

1. protected tokens (sinks and the recent window) are ``H`` in every layer group, always;
2. every other token × layer group starts at its floor. If the floors alone exceed ``T_P``,
   the budget wins: floor moves are undone (H→L, then L→R) lowest stored priority first,
   quantizing before releasing and older tokens first on a tie, until the plan fits, and the
   bytes released below floors are recorded (``floor_breach_bytes``), so a budget the floors
   cannot meet is met by release and says so instead of being exceeded silently. Only
   protection is never released: what it alone keeps beyond ``T_P`` is recorded as
   ``floor_excess_bytes``;
3. otherwise adjacent upgrades (R→L, L→H) are applied greedily in priority order while they
   fit in what is left of ``T_P``. Upgrades that move a token toward its bucket's base action
   come first (so a target equal to the base plan's cost reproduces the base plan), then
   higher stored priority; ties follow token position, then layer group. An upgrade is never
   ranked ahead of the upgrade it depends on (L→H of a token that starts at R inherits the
   rank of its R→L if that is worse).

The greedy runs vectorized in ``O(n log n)``: one lexicographic sort of the ``≤ 2·|C|·n``
candidate moves, then prefix sums; each pass that meets a move too large for the remaining
target drops every move at least that large, so there are at most as many passes as distinct
move costs (≤ 2·|C|). Planned bytes never exceed ``T_P`` unless floors force it, and fall short
of it by less than one token-group's full cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import floor

import numpy as np

from pask_agent.errors import ConfigError
from pask_agent.grammars.tags import SPAN_LABELS
from pask_agent.policy.actions import Action
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.ledger import as_fraction
from pask_agent.policy.table import PolicyTable
from pask_agent.policy.table_entries import NUM_GROUPS

_UP = ("R->L", "L->H")


@dataclass(frozen=True, slots=True, eq=False)
class PrefillPlan:
    """A retention plan for one prompt.

    Attributes
    ----------
    actions:
        ``uint8 [n, |C|]`` read-only array of ``int(Action)`` per prompt token and layer group.
    planned_bytes:
        ``Σ_t Σ_c m(a_tc, c)``: the payload the plan keeps.
    target_bytes:
        ``T_P = B_P · n · C_full`` (exact).
    floor_bytes:
        Payload of the floors-and-protection plan, the least any plan can keep.
    floor_excess_bytes:
        ``[planned_bytes − T_P]_+``, rounded up: how far protection alone overshoots.
    full_bytes:
        ``n · C_full``: the Full-KV payload of the prompt.
    floor_breach_bytes:
        Bytes released below the floors to meet ``T_P`` (0 when the floors fit).
    """

    actions: np.ndarray
    planned_bytes: int
    target_bytes: Fraction
    floor_bytes: int
    floor_excess_bytes: int
    full_bytes: int
    floor_breach_bytes: int = 0

    @property
    def num_tokens(self) -> int:
        return int(self.actions.shape[0])

    @property
    def measured_ratio(self) -> float:
        """Planned bytes over Full-KV bytes (0.0 for an empty prompt)."""
        return self.planned_bytes / self.full_bytes if self.full_bytes else 0.0

    def action(self, token: int, group: int) -> Action:
        return Action(int(self.actions[token, group]))

    def counts(self, action: Action) -> tuple[int, ...]:
        """Per layer group, how many tokens get ``action`` (``H_c``, ``L_c`` of App. B.4)."""
        return tuple(int(x) for x in (self.actions == int(action)).sum(axis=0))


class PrefillPlanner:
    """Plans prompt KV retention from span labels; holds only the frozen table's prefill side.

    Parameters
    ----------
    table:
        The frozen policy (prefill buckets, sinks, window, default ``B_P``).
    costs:
        Payload costs of the served model (3 layer groups).
    budget:
        Prefill stage budget ``B_P`` in ``[0, 1]``; defaults to ``table.budget_prefill``.
    """

    def __init__(
        self, table: PolicyTable, costs: PayloadCosts, *, budget: float | Fraction | None = None
    ) -> None:
        if costs.num_groups != NUM_GROUPS:
            raise ConfigError(f"cost model has {costs.num_groups} groups, expected {NUM_GROUPS}")
        b_p = as_fraction(table.budget_prefill if budget is None else budget, name="budget")
        if not 0 <= b_p <= 1:
            raise ConfigError(f"prefill budget B_P={budget} must lie in [0, 1]")
        self._budget = b_p
        self._sinks = table.sink_tokens
        self._window = table.window_tokens
        self._costs = costs
        self._label_index = {label: i for i, label in enumerate(SPAN_LABELS)}
        n_labels, g = len(SPAN_LABELS), NUM_GROUPS
        self._base = np.zeros((n_labels, g), dtype=np.int8)
        self._floor = np.zeros((n_labels, g), dtype=np.int8)
        self._priority = np.zeros((n_labels, g, 2), dtype=np.float64)
        for i, label in enumerate(SPAN_LABELS):
            for c, entry in enumerate(table.prefill_entries(label)):
                self._base[i, c] = Action.parse(entry.base)
                self._floor[i, c] = Action.parse(entry.floor)
                self._priority[i, c] = [entry.priority[m] for m in _UP]

    @classmethod
    def from_arrays(
        cls,
        base: np.ndarray,
        floor_: np.ndarray,
        priority: np.ndarray,
        costs: PayloadCosts,
        *,
        budget: float | Fraction,
        sinks: int,
        window: int,
    ) -> PrefillPlanner:
        """A planner over per-label arrays (``[labels, 3]`` base and floor, ``[labels, 3, 2]``
        priorities): calibration plans candidate tables this way before any table exists."""
        planner = cls.__new__(cls)
        planner._budget = as_fraction(budget, name="budget")
        planner._sinks, planner._window, planner._costs = sinks, window, costs
        planner._label_index = {label: i for i, label in enumerate(SPAN_LABELS)}
        planner._base = np.asarray(base, np.int8)
        planner._floor = np.asarray(floor_, np.int8)
        planner._priority = np.asarray(priority, np.float64)
        return planner

    def plan_indices(
        self,
        labels: np.ndarray,
        *,
        protected: Sequence[bool] | None = None,
        budget: float | Fraction | None = None,
    ) -> PrefillPlan:
        """:meth:`plan` for labels given as class indices (into ``SPAN_LABELS``, or into the
        arrays a planner :meth:`from_arrays` was built with)."""
        lab = np.asarray(labels, np.int64)
        return self._plan(lab, self._base, self._floor, self._priority, protected, budget)

    def default_protection(self, n: int) -> np.ndarray:
        """Sinks (first tokens) and the recent window (last tokens) of an ``n``-token prompt."""
        mask = np.zeros(n, dtype=bool)
        mask[: self._sinks] = True
        if self._window:
            mask[max(0, n - self._window) :] = True
        return mask

    def plan(
        self,
        labels: Sequence[str],
        *,
        protected: Sequence[bool] | None = None,
        budget: float | Fraction | None = None,
    ) -> PrefillPlan:
        """Plan one prompt. ``labels[t]`` is token ``t``'s span label (``SPAN_LABELS``).

        ``protected`` defaults to :meth:`default_protection` (table sinks and window);
        ``budget`` overrides the planner's ``B_P`` for this prompt.

        Raises
        ------
        ConfigError
            An unknown label, or ``protected`` of another length than ``labels``.
        """
        try:
            lab = np.fromiter(
                (self._label_index[x] for x in labels), dtype=np.int64, count=len(labels)
            )
        except KeyError as exc:
            raise ConfigError(
                f"unknown span label {exc.args[0]!r}; expected one of {list(SPAN_LABELS)}"
            ) from None
        return self._plan(lab, self._base, self._floor, self._priority, protected, budget)

    def plan_candidates(
        self, label_sets: Sequence[Sequence[str]], *, protected: Sequence[bool] | None = None
    ) -> PrefillPlan:
        """Plan a prompt whose cross-boundary tokens carry several labels (App. A.3).

        Each token's candidates combine conservatively per layer group: the highest base,
        floor and priorities among them. ``label_sets`` matches
        ``grammars.span_labels.token_label_candidates``.

        Raises
        ------
        ConfigError
            An empty or unknown label set, or ``protected`` of the wrong length.
        """
        classes: dict[tuple[int, ...], int] = {}
        lab = np.empty(len(label_sets), dtype=np.int64)
        for t, labels in enumerate(label_sets):
            try:
                key = tuple(sorted({self._label_index[x] for x in labels}))
            except KeyError as exc:
                raise ConfigError(
                    f"token {t}: unknown span label {exc.args[0]!r}; expected one of "
                    f"{list(SPAN_LABELS)}"
                ) from None
            if not key:
                raise ConfigError(f"token {t} has no label; give at least 'protected_content'")
            lab[t] = classes.setdefault(key, len(classes))
        members = list(classes)
        base = np.array([self._base[list(m)].max(axis=0) for m in members], np.int8)
        floor_ = np.array([self._floor[list(m)].max(axis=0) for m in members], np.int8)
        priority = np.array([self._priority[list(m)].max(axis=0) for m in members])
        shape = (len(members), NUM_GROUPS)
        return self._plan(
            lab,
            base.reshape(shape),
            floor_.reshape(shape),
            priority.reshape((*shape, 2)),
            protected,
        )

    def _plan(
        self,
        lab: np.ndarray,
        base: np.ndarray,
        floor_: np.ndarray,
        priority: np.ndarray,
        protected: Sequence[bool] | None,
        budget: float | Fraction | None = None,
    ) -> PrefillPlan:
        # lab: [n] class index; base, floor_: [classes, g]; priority: [classes, g, 2]
        n = len(lab)
        prot = self.default_protection(n) if protected is None else np.asarray(protected, bool)
        if prot.shape != (n,):
            raise ConfigError(f"protected has {prot.shape[0]} entries for {n} labels")
        cost = np.asarray(self._costs.bytes_by_group, dtype=np.int64)  # [g, 3]
        g = NUM_GROUPS
        acts = floor_[lab].astype(np.int8)  # [n, g]
        acts[prot] = Action.H
        full = n * self._costs.full_bytes_per_token
        b_p = self._budget if budget is None else as_fraction(budget, name="budget")
        target = b_p * full
        floor_bytes = int(cost[np.arange(g), acts].sum())
        if floor_bytes > target:
            over = -floor(-(floor_bytes - target))
            breach = _release_below_floors(acts, prot, priority[lab], cost, over)
            planned = floor_bytes - breach
            excess = max(0, -floor(-(planned - target)))
            return _freeze(acts, planned, target, floor_bytes, excess, full, breach)
        planned = floor_bytes + _greedy_upgrades(
            acts, lab, prot, base, priority, cost, int(floor(target - floor_bytes))
        )
        return _freeze(acts, planned, target, floor_bytes, 0, full)


def _freeze(
    acts: np.ndarray,
    planned: int,
    target: Fraction,
    floor_bytes: int,
    excess: int,
    full: int,
    breach: int = 0,
) -> PrefillPlan:
    out = acts.astype(np.uint8)
    out.flags.writeable = False
    return PrefillPlan(out, planned, target, floor_bytes, excess, full, breach)


def _release_below_floors(
    acts: np.ndarray,
    prot: np.ndarray,
    priority: np.ndarray,
    cost: np.ndarray,
    need: int,
) -> int:
    """Undo floor moves in ``acts`` (in place) until ``need`` bytes are saved or only
    protection is left; return the bytes saved.

    ``acts`` starts at the floors; ``priority`` (``[n, g, 2]``) is per token. A move H→L ranks by
    the token's L→H priority and L→R by its R→L priority; an L→R that needs an H→L first
    inherits that move's rank when it is better, so the prefix taken is always legal. Ties
    quantize before they release (as MiKV's tiers), then go to the older token, then the
    lower group.
    """
    tok, grp = np.nonzero(~prot[:, None] & (acts > Action.R))
    start = acts[tok, grp].astype(np.int64)
    from_h = start == Action.H
    # step 1 lowers every candidate once; step 2 (only from H) releases it afterwards
    first_score = np.where(from_h, priority[tok, grp, 1], priority[tok, grp, 0])
    t2, g2 = tok[from_h], grp[from_h]
    second_score = np.maximum(priority[t2, g2, 0], first_score[from_h])
    all_tok = np.concatenate([tok, t2])
    all_grp = np.concatenate([grp, g2])
    all_score = np.concatenate([first_score, second_score])
    all_step = np.concatenate([np.zeros(len(tok), np.int64), np.ones(len(t2), np.int64)])
    all_from = np.concatenate([start, np.full(len(t2), Action.L, np.int64)])
    saved = cost[all_grp, all_from] - cost[all_grp, all_from - 1]
    order = np.lexsort((all_grp, all_tok, all_step, all_score))
    total = np.cumsum(saved[order])
    take = order[: int(np.searchsorted(total, need, side="left")) + 1]
    np.subtract.at(acts, (all_tok[take], all_grp[take]), 1)
    return int(saved[take].sum())


def _greedy_upgrades(
    acts: np.ndarray,
    lab: np.ndarray,
    prot: np.ndarray,
    base: np.ndarray,
    priority: np.ndarray,
    cost: np.ndarray,
    room: int,
) -> int:
    """Apply upgrades to ``acts`` in place within ``room`` bytes; return the bytes added."""
    n, g = acts.shape
    tok, grp = np.nonzero(~prot[:, None] & (acts < Action.H))
    start = acts[tok, grp].astype(np.int64)
    lb = lab[tok]
    # Step 1 upgrades from `start`; step 2 (only when start is R) is L→H after step 1.
    first_from = start
    first_tier = (first_from + 1 > base[lb, grp]).astype(np.int64)
    first_score = priority[lb, grp, first_from]
    has_second = start == Action.R
    t2, g2, l2 = tok[has_second], grp[has_second], lb[has_second]
    second_tier = np.maximum((Action.H > base[l2, g2]).astype(np.int64), first_tier[has_second])
    own = priority[l2, g2, 1]
    prereq = first_score[has_second]
    # Inherit the prerequisite's rank when it is worse (same tier, lower score).
    worse = (second_tier == first_tier[has_second]) & (prereq < own)
    second_score = np.where(worse, prereq, own)
    m1 = len(tok)
    all_tok = np.concatenate([tok, t2])
    all_grp = np.concatenate([grp, g2])
    all_tier = np.concatenate([first_tier, second_tier])
    all_score = np.concatenate([first_score, second_score])
    all_step = np.concatenate([np.zeros(m1, np.int64), np.ones(len(t2), np.int64)])
    all_from = np.concatenate([first_from, np.full(len(t2), Action.L, np.int64)])
    prereq_of = np.concatenate([np.full(m1, -1, np.int64), np.nonzero(has_second)[0]])
    # Sort: tier asc, score desc, position asc, group asc, step asc (prerequisite first).
    order = np.lexsort((all_step, all_grp, all_tok, -all_score, all_tier))
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    delta = cost[all_grp, all_from + 1] - cost[all_grp, all_from]
    d_sorted = delta[order]
    dep_sorted = np.where(prereq_of[order] >= 0, rank[np.maximum(prereq_of[order], 0)], -1)
    alive = np.ones(len(order), dtype=bool)
    applied = np.zeros(len(order), dtype=bool)
    added, left, pos = 0, room, 0
    while pos < len(order):
        idx = np.nonzero(alive[pos:])[0] + pos
        if len(idx) == 0:
            break
        fits = int(np.searchsorted(np.cumsum(d_sorted[idx]), left, side="right"))
        take = idx[:fits]
        applied[take] = True
        spent = int(d_sorted[take].sum())
        added, left = added + spent, left - spent
        if fits == len(idx):
            break
        pos = int(idx[fits])
        # Nothing at least this large fits any more; nor what depends on a dropped move.
        tail = np.arange(len(order)) >= pos
        alive &= ~(tail & (d_sorted > left))
        has_dep = dep_sorted >= 0
        alive[has_dep] &= alive[dep_sorted[has_dep]] | applied[dep_sorted[has_dep]]
    chosen = order[applied]
    np.add.at(acts, (all_tok[chosen], all_grp[chosen]), 1)
    return added
