"""``full``: keep every token in high precision (the Full-KV reference)."""

from __future__ import annotations

from dataclasses import dataclass

from pask_agent.policy.actions import Action
from pask_agent.policy.base import Policy, PolicyEnv, UniformSession
from pask_agent.policy.registry import register_policy


@register_policy("full")
@dataclass(frozen=True, slots=True)
class FullPolicy(Policy):
    name = "full"

    def start(self, env: PolicyEnv) -> UniformSession:
        return UniformSession((Action.H,) * 3)
