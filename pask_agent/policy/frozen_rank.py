"""Sessions that rank the prompt once, when its prefill ends, and keep the answer above it.

SnapKV scores the prompt by its observation window's attention, KeyDiff by how unlike the
mean key each key is, R-KV by attention less redundancy: each decides once, from what the
finished prefill shows, and from then on the prompt tokens go lowest score first while the
generated tokens, newest first, outrank every prompt token. The scores restart with each
turn's prompt (a conversation's later turn is ranked from its own prefill).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pask_agent.policy.base import Actions, Demotion, RetentionView
from pask_agent.policy.scored import ScoredSession, recency

_ABOVE_PROMPT = 1e30  # generated tokens outrank any prompt score


@dataclass
class FrozenRankSession(ScoredSession):
    """A ``ScoredSession`` whose prompt ranks are fixed at the end of prefill
    (``score_prompt``, per layer group)."""

    prompt_len: int = 0
    prompt_scores: list[np.ndarray] = field(default_factory=list)

    def score_prompt(self, view: RetentionView, group: int) -> np.ndarray:
        """``[view.length]`` scores of the prompt's positions (higher is kept first)."""
        raise NotImplementedError

    def plan_prefill(self, labels: Sequence[str]) -> Sequence[Actions]:
        self.prompt_scores = []
        return super().plan_prefill(labels)

    def revise(self, view: RetentionView) -> list[Demotion]:
        if view.prefill_done and not self.prompt_scores:
            self.prompt_len = view.length
            self.prompt_scores = [self.score_prompt(view, g) for g in range(3)]
        return super().revise(view)

    def rank(self, view: RetentionView, group: int) -> np.ndarray:
        out = recency(view, group) + _ABOVE_PROMPT
        out[: self.prompt_len] = self.prompt_scores[group][: view.length]
        return out
