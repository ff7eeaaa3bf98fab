"""``streaming`` (StreamingLLM, Xiao et al. 2024): attention sinks + the most recent tokens.

Budget-targeted: after each step the newest settled tokens that fit the target total ``B``
stay high and older ones are released, so the retained span slides during decode. The store's
sinks and recent window count inside ``B`` (see :mod:`pask_agent.policy.scored`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pask_agent.policy.base import Policy, PolicyEnv
from pask_agent.policy.registry import register_policy
from pask_agent.policy.scored import ScoredSession, check_budget, recency, resolve_budget


@register_policy("streaming")
@dataclass(frozen=True, slots=True)
class StreamingPolicy(Policy):
    """Sinks + recent tokens within ``B``.

    Parameters
    ----------
    budget:
        Target total ``B`` used when the request names none.
    """

    budget: float = 0.33
    name = "streaming"
    revises = True

    def __post_init__(self) -> None:
        check_budget(self.budget)

    def start(self, env: PolicyEnv) -> ScoredSession:
        return ScoredSession(env, resolve_budget(env, self.budget), recency)
