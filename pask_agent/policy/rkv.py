"""``rkv`` (R-KV, Cai et al. 2025, arXiv 2505.24133): attention importance less redundancy.

R-KV was built for reasoning models, whose long outputs repeat themselves: a token is worth
keeping when the observation window attends to it *and* its key is not a near copy of others.
Per KV head, importance ``I`` is the window's attention, max-pooled over neighbouring
positions; redundancy ``R`` is a softmax over positions of each key's mean cosine similarity to
the other keys (the observation window's own keys left out); the score is ``λ·I − (1−λ)·R``
with the paper's ``λ = 0.1``. Here ``I`` is the window's attention mass summed over a layer
group's heads and layers and normalized to sum to one, like the per-head softmax it stands for;
``R`` is averaged over the group's layers and KV heads; the mean similarity comes from one dot
product with the mean unit key (``runtime/memory/key_geometry.py``). It ranks the prompt over
``int4``'s store, as ``snapkv_int4``, ``keydiff`` and PASK's label release do; the answer
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
from pask_agent.policy.snapkv import pool_scores
from pask_agent.policy.uniform import Int4Session


def redundancy(dots: np.ndarray, upto: int) -> np.ndarray:
    """``[n]``: per column of ``dots`` (a key's dot with the mean unit key of the first
    ``upto`` keys), the softmax over positions of its mean similarity to the other keys,
    averaged over columns."""
    if dots.size == 0 or upto < 2:
        return np.zeros(dots.shape[0])
    mean_sim = (upto * dots - 1.0) / (upto - 1)  # self-similarity (1) left out
    z = np.exp(mean_sim - mean_sim.max(axis=0))
    return (z / z.sum(axis=0)).mean(axis=1)


@dataclass
class RKVSession(FrozenRankSession, Int4Session):
    lam: float = 0.1
    kernel: int = 5
    window: int = 8

    def score_prompt(self, view: RetentionView, group: int) -> np.ndarray:
        if view.step_scores is None or view.keys is None:
            raise ConfigError("rkv needs attention scores and keys; set needs_scores, needs_keys")
        n = view.length
        importance = pool_scores(view.step_scores[group][:n], self.kernel, "max")
        importance = importance / max(float(importance.sum()), 1e-12)
        upto = max(n - self.window, 0)
        dots, _ = view.keys.to_mean(group, upto)
        return self.lam * importance - (1 - self.lam) * redundancy(dots, upto)


@register_policy("rkv")
@dataclass(frozen=True, slots=True)
class RKVPolicy(Policy):
    """INT4 outside sinks and window; over ``B``, release by R-KV's importance − redundancy.

    Parameters
    ----------
    budget:
        Target total ``B`` when the request names none (1.0: never release).
    lam:
        Weight of importance against redundancy (the paper's ``λ = 0.1``).
    kernel:
        Max-pooling width over positions for importance (the reference code's 5).
    """

    budget: float = 1.0
    lam: float = 0.1
    kernel: int = 5
    name = "rkv"
    needs_scores = True
    needs_keys = True
    observation_tokens = 8  # the paper's observation window α = 8
    revises = True
    stores_int4 = True

    def __post_init__(self) -> None:
        check_budget(self.budget)
        if not 0 <= self.lam <= 1:
            raise ConfigError(f"lam must be in [0, 1], got {self.lam}")
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise ConfigError(f"kernel must be a positive odd number, got {self.kernel}")

    def start(self, env: PolicyEnv) -> RKVSession:
        return RKVSession.open(
            env,
            resolve_budget(env, self.budget),
            lam=self.lam,
            kernel=self.kernel,
            window=self.observation_tokens,
        )
