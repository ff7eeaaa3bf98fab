"""``snapkv`` (SnapKV, Li et al. 2024): the prompt's observation window votes which prompt
tokens to keep.

The last ``observation_tokens`` prompt tokens run as their own chunk (the engine honours
``observation_tokens``), so the attention mass of that step is exactly the observation
window's. At the end of prefill each prompt position's mass is smoothed by 1-D pooling over
neighbouring positions (``kernel``; ``pooling`` max or avg) and the best prompt tokens that
fit the target total ``B`` stay high (paper App. C.3). Generated tokens follow a recency rule:
they rank above every prompt token, newest first, so as decoding grows the weakest remaining
prompt tokens are released and the total stays at ``B``.

``snapkv_int4`` ranks the same way over ``int4``'s store (every token INT4, released lowest
score first): below INT4's cost a BF16-only method keeps a fifth of the tokens where an INT4
one keeps most of them, so this is the attention-ranked baseline PASK's label release meets
on equal terms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pask_agent.errors import ConfigError
from pask_agent.policy.base import Policy, PolicyEnv, RetentionView
from pask_agent.policy.frozen_rank import FrozenRankSession
from pask_agent.policy.registry import register_policy
from pask_agent.policy.scored import check_budget, recency, resolve_budget
from pask_agent.policy.uniform import Int4Session


@dataclass
class SnapKVSession(FrozenRankSession):
    """Pools the observation window's attention at the end of prefill."""

    kernel: int = 7
    pooling: str = "max"

    def score_prompt(self, view: RetentionView, group: int) -> np.ndarray:
        if view.step_scores is None:
            raise ConfigError("snapkv needs attention scores; set needs_scores on the class")
        return pool_scores(view.step_scores[group][: view.length], self.kernel, self.pooling)


@dataclass
class SnapKVInt4Session(SnapKVSession, Int4Session):
    """SnapKV's ranking over ``int4``'s store: every token INT4, released lowest score first."""


def pool_scores(scores: np.ndarray, kernel: int, pooling: str) -> np.ndarray:
    """``[n]`` scores smoothed over a centred window of ``kernel`` positions (stride 1)."""
    x = np.asarray(scores, dtype=np.float64)
    half = kernel // 2
    if half == 0 or x.size == 0:
        return x
    fill = -np.inf if pooling == "max" else 0.0
    padded = np.pad(x, half, constant_values=fill)
    windows = np.lib.stride_tricks.sliding_window_view(padded, kernel)
    if pooling == "max":
        return windows.max(axis=1)
    counts = np.convolve(np.ones_like(x), np.ones(kernel), mode="same")
    return windows.sum(axis=1) / counts


@register_policy("snapkv")
@dataclass(frozen=True, slots=True)
class SnapKVPolicy(Policy):
    """Observation-window prompt selection, within ``B``.

    Parameters
    ----------
    budget:
        Target total ``B`` used when the request names none.
    observation_tokens:
        Last prompt tokens whose attention scores the prompt (Table 8: 16–128). 16 was best on
        the BFCL dev split at B = 0.33 (30.0 % vs 17.5 % at 32 and 10.0 % at 64).
    kernel:
        Odd pooling width in positions (Table 8: 3, 5, 7).
    pooling:
        ``"max"`` or ``"avg"``.
    """

    budget: float = 0.33
    observation_tokens: int = 16  # type: ignore[misc]  # a per-instance knob here
    kernel: int = 7
    pooling: str = "max"
    name = "snapkv"
    needs_scores = True
    revises = True

    def __post_init__(self) -> None:
        check_budget(self.budget)
        if self.observation_tokens < 1:
            raise ConfigError(f"observation_tokens must be >= 1, got {self.observation_tokens}")
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise ConfigError(f"kernel must be a positive odd number, got {self.kernel}")
        if self.pooling not in ("max", "avg"):
            raise ConfigError(f"pooling must be 'max' or 'avg', got {self.pooling!r}")

    def start(self, env: PolicyEnv) -> SnapKVSession:
        return SnapKVSession(
            env,
            resolve_budget(env, self.budget),
            recency,
            kernel=self.kernel,
            pooling=self.pooling,
        )


@register_policy("snapkv_int4")
@dataclass(frozen=True, slots=True)
class SnapKVInt4Policy(SnapKVPolicy):
    """SnapKV's observation-window ranking on ``int4``'s store: every token INT4 outside sinks
    and window, and over ``B`` the prompt tokens with the least pooled attention go first (the
    answer last). The same store and release as ``int4`` and PASK's label release, so the
    three differ only in how they rank: by age, by attention, by span label.

    Parameters as ``snapkv``'s; ``budget`` 1.0 never releases (INT4's own ``B``).
    """

    budget: float = 1.0
    name = "snapkv_int4"
    stores_int4 = True

    def start(self, env: PolicyEnv) -> SnapKVInt4Session:
        return SnapKVInt4Session.open(
            env, resolve_budget(env, self.budget), kernel=self.kernel, pooling=self.pooling
        )
