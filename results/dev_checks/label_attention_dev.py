"""Span labels and attention together, on the 200 BFCL dev cases at B = 0.20:

    python results/dev_checks/label_attention_dev.py within   # labels' order, attention inside
    python results/dev_checks/label_attention_dev.py floor    # attention, top labels above it
    python results/dev_checks/label_attention_dev.py snapkv_int4,within,floor  # in one run

On the 110 never-scored test cases at B = 0.20, ``snapkv_int4`` (SnapKV's pooled
observation-window votes as the release order over ``int4``'s store) scored as well as PASK's
label release, so attention alone ranks the prompt about as well as the labels do. These ask
whether the two together do better. ``within``: PASK's label order, and inside one label the
tokens the window attended to least go first instead of the oldest (the attention percentile,
scaled below the smallest gap between two labels' ranks). ``floor``: attention orders every
token except the top-ranked labels (names, keys, enum values, the request), which stay above
all of it. Each registers its variant under its own name for this run only.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from pask_agent.eval import bfcl_eval
from pask_agent.policy.base import RetentionView
from pask_agent.policy.label_release import LabelReleasePolicy, LabelReleaseSession
from pask_agent.policy.registry import register_policy
from pask_agent.policy.snapkv import pool_scores


def percentile(x: np.ndarray) -> np.ndarray:
    """``[n]`` in ``[0, 1)``: each value's rank among ``x`` over ``n``."""
    out = np.empty(len(x))
    out[np.argsort(x, kind="stable")] = np.arange(len(x)) / max(len(x), 1)
    return out


class AttentionLabelSession(LabelReleaseSession):
    mode = "within"
    scored = False

    def revise(self, view: RetentionView):  # type: ignore[no-untyped-def]
        if view.prefill_done and not self.scored and view.step_scores is not None:
            self.scored = True
            n = min(len(self.prompt_rank), view.length)
            top = self.label_rank.max(axis=0)
            for g in range(3):
                pct = percentile(pool_scores(view.step_scores[g][:n], 7, "max"))
                ranks = self.prompt_rank[:n, g]
                if self.mode == "within":
                    ranks += 0.1 * pct
                else:
                    below = ranks < top[g]
                    ranks[below] = pct[below]
        return super().revise(view)


def variant(mode: str) -> str:
    name = f"pask_release_attn_{mode}"

    class Session(AttentionLabelSession):
        pass

    Session.mode = mode

    @dataclass(frozen=True)
    class Variant(LabelReleasePolicy):
        needs_scores = True
        observation_tokens = 16

        def start(self, env):  # type: ignore[no-untyped-def]
            base = super().start(env)
            return Session.open(env, base.budget, label_rank=base.label_rank)

    Variant.name = name
    register_policy(name)(Variant)
    return name


if __name__ == "__main__":
    modes = (sys.argv[1] if len(sys.argv) > 1 else "within").split(",")
    names = [m if m == "snapkv_int4" else variant(m) for m in modes]
    out = f"results/dev_checks/bfcl_dev_b020_attn_{'_'.join(modes)}"
    sys.exit(
        bfcl_eval.main(
            [
                "--split", "dev", "--policies", ",".join(names), "--budgets", "0.20",
                "--reference", "none", "--out", out,
            ]
        )
    )  # fmt: skip
