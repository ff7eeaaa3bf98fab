"""``UniformPolicy``: one fixed action for every token, prompt and generated alike.

Not a compression method to serve (so not in the registry, whose names the policy invariants
test and the server take): it exercises the store's mechanics through the one decode loop —
``pask-agent generate --int4-after W`` quantizes every token once it leaves a ``W``-token
window, ``--release-after W`` releases it — and the store tests build on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pask_agent.policy.actions import Action
from pask_agent.policy.base import Policy, PolicyEnv, UniformSession


@dataclass(frozen=True, slots=True)
class UniformPolicy(Policy):
    """Every token gets ``action`` in all three layer groups when it leaves the window."""

    action: Action = Action.H
    name = "uniform"

    @property
    def stores_int4(self) -> bool:  # type: ignore[override]
        return self.action == Action.L

    def start(self, env: PolicyEnv | None = None) -> UniformSession:
        return UniformSession((self.action,) * 3)
