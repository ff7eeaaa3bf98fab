"""``streaming`` (StreamingLLM): attention sinks + the recent window, everything else released.

The store's sink and window protection do the keeping; every token is scheduled ``R`` for when
it leaves the window.
"""

from __future__ import annotations

from dataclasses import dataclass

from pask_agent.policy.actions import Action
from pask_agent.policy.base import Policy, PolicyEnv, UniformSession
from pask_agent.policy.registry import register_policy


@register_policy("streaming")
@dataclass(frozen=True, slots=True)
class StreamingPolicy(Policy):
    name = "streaming"

    def start(self, env: PolicyEnv) -> UniformSession:
        return UniformSession((Action.R,) * 3)
