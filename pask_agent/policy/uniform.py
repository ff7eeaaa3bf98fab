"""``UniformPolicy``: one fixed action for every token, prompt and generated alike; and its
served form ``int4``, uniform INT4 of everything outside the sinks and the recent window.

``UniformPolicy`` is not a compression method to serve (so not in the registry, whose names
the policy invariants test and the server take): it exercises the store's mechanics through
the one decode loop — ``pask-agent generate --int4-after W`` quantizes every token once it
leaves a ``W``-token window, ``--release-after W`` releases it — and the store tests build on
it.

``int4`` is what a user already gets from llama.cpp's or Ollama's ``q4_0`` KV cache (and
vLLM/SGLang with FP8/FP4 KV): no token is chosen, every one is stored at INT4 once it leaves
the window. Its ``B`` is whatever that measures (about 0.27–0.29 of Full KV on the default
model: ``(d/2 + 2) / 2d`` per row plus the BF16 sinks and window); a budget at or above it
changes nothing. Asked for less, it releases the oldest settled tokens, in every layer group,
until the total fits (``ScoredSession``'s tiered fit with no high tier, ranked by recency),
because quantization alone cannot go lower and a parser-free method has nothing better than
age to choose by. So it is the baseline every structured choice has to beat below ~0.27.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

from pask_agent.grammars.tags import Tag
from pask_agent.policy.actions import Action
from pask_agent.policy.base import Actions, DecodeDemand, Policy, PolicyEnv, UniformSession
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.registry import register_policy
from pask_agent.policy.scored import ScoredSession, check_budget, recency, resolve_budget

_INT4 = UniformSession((Action.L,) * 3)


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


@dataclass
class Int4Session(ScoredSession):
    """Every token INT4 once it leaves the window; the lowest-ranked (here: the oldest)
    released when over ``B``."""

    @classmethod
    def open(cls, env: PolicyEnv, budget: float, **fields: Any) -> Self:
        """A session holding ``budget`` with INT4 rows only (no high tier)."""
        return cls(env, budget, recency, tiered=True, high_ratio=0.0, **fields)

    def plan_prefill(self, labels: Sequence[str]) -> Sequence[Actions]:
        return _INT4.plan_prefill(labels)

    def on_token(self, tag: Tag | None, *, is_stop: bool = False) -> Actions:
        return _INT4.on_token(tag, is_stop=is_stop)

    def decode_demand(self, costs: PayloadCosts) -> DecodeDemand:
        """An INT4 row per generated token (a release only ever frees one)."""
        return _INT4.decode_demand(costs)


@register_policy("int4")
@dataclass(frozen=True, slots=True)
class Int4Policy(Policy):
    """Uniform INT4 KV outside sinks and window (llama.cpp / Ollama ``q4_0``), within ``B``.

    Parameters
    ----------
    budget:
        Target total ``B`` when the request names none; 1.0 (the default) never releases, so
        the measured ``B`` is INT4's own.
    """

    budget: float = 1.0
    name = "int4"
    revises = True
    stores_int4 = True

    def __post_init__(self) -> None:
        check_budget(self.budget)

    def start(self, env: PolicyEnv) -> Int4Session:
        b = resolve_budget(env, self.budget)
        return Int4Session.open(env, b)
