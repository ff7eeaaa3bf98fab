"""``mikv`` (MiKV, Yang et al. 2024): importance decides high vs INT4 instead of keep vs drop.

Importance is H2O's accumulated attention mass (paper App. C.3: "We use H2O-style
cumulative-attention importance"). Within the target total ``B`` the least important settled
tokens move to INT4 first; only when even INT4 does not fit are the least important released,
and the most important stay high with whatever budget is left. ``high_ratio`` (Table 8's
high-precision ratio) instead fixes the fraction of kept tokens held high. The low tier is the
store's INT4 format (App. B.5), so Table 8's bit width and group size are fixed here.
"""

from __future__ import annotations

from dataclasses import dataclass

from pask_agent.errors import ConfigError
from pask_agent.policy.base import Policy, PolicyEnv
from pask_agent.policy.registry import register_policy
from pask_agent.policy.scored import (
    ScoredSession,
    accumulated_mass,
    check_budget,
    resolve_budget,
)


@register_policy("mikv")
@dataclass(frozen=True, slots=True)
class MiKVPolicy(Policy):
    """Mixed precision by accumulated attention mass, within ``B``.

    Parameters
    ----------
    budget:
        Target total ``B`` used when the request names none.
    high_ratio:
        Fraction of kept settled tokens held in high precision, in ``[0, 1]``; None (default)
        keeps as many tokens as fit at INT4 and spends the remainder on the most important.
    """

    budget: float = 0.33
    high_ratio: float | None = None
    name = "mikv"
    needs_scores = True
    revises = True
    stores_int4 = True

    def __post_init__(self) -> None:
        check_budget(self.budget)
        if self.high_ratio is not None and not 0 <= self.high_ratio <= 1:
            raise ConfigError(f"high_ratio must lie in [0, 1] or be None, got {self.high_ratio}")

    def start(self, env: PolicyEnv) -> ScoredSession:
        return ScoredSession(
            env,
            resolve_budget(env, self.budget),
            accumulated_mass,
            tiered=True,
            high_ratio=self.high_ratio,
        )
