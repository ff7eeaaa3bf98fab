"""Budget-targeted retention for the score- and recency-based baselines (STYLE rule 2).

Every baseline (``streaming``, ``h2o``, ``snapkv``, ``mikv``) plans every token ``H`` and then,
after each engine step, *revises*: it keeps the highest-priority settled tokens that fit the
target total budget ``B`` and demotes the rest (paper App. C.3: "budget-flexible methods are
adjusted to the target KV budget"). A baseline only says how to rank positions; the top-k under
a byte budget is written once, here.

Budget per layer group ``c`` after a step over ``n`` tokens (App. B.3 accounting)::

    allowed_c = floor(B · n · m(H, c))            # bytes this group may hold
    room_c    = allowed_c − protected · m(H, c)   # sinks + recent window are always high

and the settled tokens (neither sinks nor in the window) must fit in ``room_c``. Groups are
budgeted separately, so the total never exceeds ``B · n · C_full`` (the measured ``B`` is
``≤ B`` up to one token's bytes per group), whatever the layer split.

Two retention modes:

* drop (H2O, SnapKV, StreamingLLM): keep the top ``floor(room_c / m(H, c))`` tokens high and
  release the rest;
* tiered (MiKV): keep as many tokens as fit at INT4 (lowest priority released first), then hold
  the highest-priority ones high with what is left; or, with ``high_ratio``, hold that fraction
  of the kept tokens high and as many others as fit at INT4.

Promotion is impossible (App. B.2): a released token stays released, a quantized one stays low.
Compression starts once the prompt is fully processed (the prompt's scores are then complete);
from then on the budget holds after every step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pask_agent.errors import ConfigError
from pask_agent.grammars.tags import Tag
from pask_agent.policy.actions import Action
from pask_agent.policy.base import Actions, DecodeDemand, Demotion, PolicyEnv, RetentionView
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.ledger import as_fraction

# priority(view, group) -> float [length]: higher is kept first; ties keep the newer token.
Priority = Callable[[RetentionView, int], np.ndarray]

_KEEP_ALL: Actions = (Action.H, Action.H, Action.H)


def check_budget(budget: float, *, name: str = "budget") -> float:
    """A target total budget in ``(0, 1]``.

    Raises
    ------
    ConfigError
        Not a number in ``(0, 1]``.
    """
    if isinstance(budget, bool) or not isinstance(budget, int | float) or not 0 < budget <= 1:
        raise ConfigError(f"{name} must be a number in (0, 1] (a share of Full KV), got {budget!r}")
    return float(budget)


def resolve_budget(env: PolicyEnv, default: float) -> float:
    """The request's target ``B``: the runtime's if given, else the policy's default."""
    return check_budget(default if env.budget is None else env.budget)


@dataclass
class ScoredSession:
    """Per-request state of a budget-targeted baseline: the budget and how to rank tokens.

    Parameters
    ----------
    env:
        Costs, sink and window sizes of the store.
    budget:
        Target total ``B`` in ``(0, 1]``; ``1.0`` never demotes anything (Full-KV parity).
    priority:
        ``priority(view, group)`` → ``[length]`` float scores; higher is kept first.
    tiered:
        Demote to INT4 before releasing (MiKV) instead of releasing outright.
    high_ratio:
        Tiered only: fraction of the kept settled tokens held high; None keeps as many tokens
        as fit at INT4 and spends the rest on high precision for the top-ranked ones.
    recent:
        The newest ``recent`` tokens outrank every score (H2O's recent budget, Table 8).
    """

    env: PolicyEnv
    budget: float
    priority: Priority
    tiered: bool = False
    high_ratio: float | None = None
    recent: int = 0

    def plan_prefill(self, labels: Sequence[str]) -> Sequence[Actions]:
        return [_KEEP_ALL] * len(labels)

    def on_token(self, tag: Tag | None, *, is_stop: bool = False) -> Actions:
        return _KEEP_ALL

    def decode_demand(self, costs: PayloadCosts) -> DecodeDemand:
        """After the prompt, every step holds the total to ``B`` of Full KV (the prompt itself
        is planned high, so admission reserves it whole); a token may end up released."""
        b = as_fraction(self.budget, name="budget") * costs.full_bytes_per_token
        beta = float(b / costs.full_bytes_per_token)
        shares = ((beta,) * 3, (0.0,) * 3)  # generated tokens wait high until revised
        return DecodeDemand(b, 0, quantizes_late=self.tiered, row_shares=shares)

    def revise(self, view: RetentionView) -> list[Demotion]:
        """Demotions that bring every layer group back within ``B`` of its Full-KV bytes."""
        if not view.prefill_done or self.budget >= 1.0:
            return []
        out: list[Demotion] = []
        for g in range(3):
            out.extend(self._fit_group(view, g))
        return out

    def rank(self, view: RetentionView, group: int) -> np.ndarray:
        """``[length]`` priorities of one group's positions (higher is kept first)."""
        prio = np.array(self.priority(view, group), dtype=np.float64)
        if self.recent > 0:
            prio[max(0, view.length - self.recent) :] = np.inf
        return prio

    def _fit_group(self, view: RetentionView, g: int) -> list[Demotion]:
        h_cost, l_cost = self.env.costs.cost(Action.H, g), self.env.costs.cost(Action.L, g)
        high, low = view.high[g], view.low[g]
        protected = min(view.sinks, view.length) + view.length - max(view.settled, view.sinks)
        room = math.floor(self.budget * view.length * h_cost) - protected * h_cost
        if len(high) * h_cost + len(low) * l_cost <= room:
            return []
        room = max(room, 0)
        positions = np.concatenate([high, low])
        is_high = np.concatenate([np.ones(len(high), bool), np.zeros(len(low), bool)])
        prio = self.rank(view, g)[positions]
        order = np.lexsort((-positions, -prio))  # best first; ties keep the newer token
        positions, is_high = positions[order], is_high[order]
        if not self.tiered:
            keep = min(room // h_cost, len(positions))
            to_h = np.zeros(len(positions), bool)
            to_h[:keep] = True
            return _demotions(g, positions, is_high, to_h, np.zeros_like(to_h))
        keep, n_high = self._tiers(room, h_cost, l_cost, len(positions))
        kept_high = np.flatnonzero(is_high[:keep])[:n_high]  # top-ranked tokens still high
        to_h = np.zeros(len(positions), bool)
        to_h[kept_high] = True
        to_l = np.zeros(len(positions), bool)
        to_l[:keep] = True
        to_l &= ~to_h
        return _demotions(g, positions, is_high, to_h, to_l)

    def _tiers(self, room: int, h_cost: int, l_cost: int, n: int) -> tuple[int, int]:
        """How many tokens to keep and how many of them high, within ``room`` bytes."""
        if self.high_ratio is None:
            keep = min(n, room // l_cost)
            n_high = (room - keep * l_cost) // (h_cost - l_cost)
            return keep, min(n_high, keep)
        per_token = self.high_ratio * h_cost + (1 - self.high_ratio) * l_cost
        keep = min(n, int(room // per_token))
        n_high = int(self.high_ratio * keep)
        while keep and n_high * h_cost + (keep - n_high) * l_cost > room:
            keep -= 1
            n_high = int(self.high_ratio * keep)
        return keep, n_high


def _demotions(
    g: int, positions: np.ndarray, is_high: np.ndarray, to_h: np.ndarray, to_l: np.ndarray
) -> list[Demotion]:
    # Already-low tokens can only stay low or go; H is honoured only for tokens still high.
    quantize = positions[is_high & to_l]
    release = positions[~(to_h | to_l)]
    out = []
    if quantize.size:
        out.append(Demotion(g, tuple(int(p) for p in quantize), Action.L))
    if release.size:
        out.append(Demotion(g, tuple(int(p) for p in release), Action.R))
    return out


def recency(view: RetentionView, group: int) -> np.ndarray:
    """Newer tokens first (StreamingLLM's rule; also SnapKV's rule for generated tokens)."""
    return np.arange(view.length, dtype=np.float64)


def accumulated_mass(view: RetentionView, group: int) -> np.ndarray:
    """Attention mass each position received over all steps (H2O's heavy-hitter score)."""
    if view.scores is None:
        raise ConfigError("this policy ranks by attention mass; its class must set needs_scores")
    return view.scores[group].astype(np.float64)
