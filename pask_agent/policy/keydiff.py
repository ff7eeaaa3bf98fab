"""``keydiff`` (KeyDiff, Park et al. 2025, arXiv 2504.15364): keep the keys least like the
average key, release the rest; query-agnostic and attention-free.

KeyDiff observes that tokens whose keys point away from the cache's mean key draw the sharpest
attention from any future query, so it ranks without looking at a query: per layer and KV head
the score is ``−cos(k_i, ū)``, ``ū`` the mean of the unit keys. Query-agnostic scoring suits an
agent, whose tool prompt is reused by requests not yet seen, and it needs no attention weights
(it was built for resource-constrained devices). Here the score is averaged over a layer
group's layers and KV heads (the store releases a token per group, not per head) and ranks the
prompt over ``int4``'s store, as ``snapkv_int4`` and PASK's label release do; the answer
outranks every prompt token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pask_agent.errors import ConfigError
from pask_agent.policy.base import Policy, PolicyEnv, RetentionView
from pask_agent.policy.frozen_rank import FrozenRankSession
from pask_agent.policy.registry import register_policy
from pask_agent.policy.scored import check_budget, resolve_budget
from pask_agent.policy.uniform import Int4Session


def anchor_cosines(view: RetentionView, group: int, upto: int) -> np.ndarray:
    """``[n, m]`` each position's cosine with the mean unit key of positions ``< upto``."""
    if view.keys is None:
        raise ConfigError("this policy ranks by key geometry; its class must set needs_keys")
    dots, norm = view.keys.to_mean(group, upto)
    return dots / np.maximum(norm, 1e-12)


@dataclass
class KeyDiffSession(FrozenRankSession, Int4Session):
    def score_prompt(self, view: RetentionView, group: int) -> np.ndarray:
        cos = anchor_cosines(view, group, view.length)
        return -cos.mean(axis=1) if cos.size else np.zeros(view.length)


@register_policy("keydiff")
@dataclass(frozen=True, slots=True)
class KeyDiffPolicy(Policy):
    """INT4 outside sinks and window; over ``B``, release the prompt keys most like the mean.

    Parameters
    ----------
    budget:
        Target total ``B`` when the request names none (1.0: never release).
    """

    budget: float = 1.0
    name = "keydiff"
    needs_keys = True
    revises = True
    stores_int4 = True

    def __post_init__(self) -> None:
        check_budget(self.budget)

    def start(self, env: PolicyEnv) -> KeyDiffSession:
        return KeyDiffSession.open(env, resolve_budget(env, self.budget))
