"""``h2o`` (Heavy-Hitter Oracle, Zhang et al. 2023): accumulated attention + recent tokens.

Each token's score is the attention mass it has received from every query so far (all heads
and layers of its layer group), computed inside our attention path. After each step the
heaviest settled tokens that fit the target total ``B`` stay high and the rest are released;
sinks and the recent window are the store's (paper App. C.3; Table 8 tunes sinks and window,
which are the runtime's ``RuntimeConfig.sinks`` / ``window``).
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


@register_policy("h2o")
@dataclass(frozen=True, slots=True)
class H2OPolicy(Policy):
    """Heavy hitters by accumulated attention mass, within ``B``.

    Parameters
    ----------
    budget:
        Target total ``B`` used when the request names none.
    recent_tokens:
        The newest tokens kept ahead of heavy hitters (Table 8's recent window, 16–128). 128
        was best on the BFCL dev split at B = 0.33 (30.0 % vs 25.0 % at 64 and 2.5 % at 16).
    """

    budget: float = 0.33
    recent_tokens: int = 128
    name = "h2o"
    needs_scores = True
    revises = True

    def __post_init__(self) -> None:
        check_budget(self.budget)
        if self.recent_tokens < 0:
            raise ConfigError(f"recent_tokens must be >= 0, got {self.recent_tokens}")

    def start(self, env: PolicyEnv) -> ScoredSession:
        return ScoredSession(
            env, resolve_budget(env, self.budget), accumulated_mass, recent=self.recent_tokens
        )
