"""A conversation's next turn re-plans the history it reuses (PASK's prefill companion).

A turn that continues a conversation reuses the tokens earlier turns left in the store:
requests, the assistant's calls and prose, tool results. Planned only where they were new,
the conversation's measured B drifts up turn after turn (a short new suffix cannot make up
for a long history kept as it was), and old tokens are never reconsidered. So the new turn
plans its whole prompt, history labelled by structure (``grammars/json/history_spans.py``),
and every reused token the plan keeps less of moves down to the plan: H to INT4 or released,
INT4 released, an old call's scaffold before its names. Nothing moves up (released KV is
gone), sinks and the recent window stay as the store protects them, and the new suffix keeps
the plan the engine made for it at admission: its part of the same whole-prompt plan
(``admission.plan_rows``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pask_agent.policy.actions import Action
from pask_agent.policy.base import Demotion
from pask_agent.runtime.memory.kv_store import KVStore


def history_demotions(
    store: KVStore, seq_id: str, plan: Sequence[Sequence[Action]], keep: int
) -> list[Demotion]:
    """Demotions that bring positions ``[sinks, min(keep, settled))`` of ``seq_id`` down to
    ``plan``, the session's plan of the whole prompt made at admission (see the module doc)."""
    lo, hi = store.config.sinks, min(keep, store.settled(seq_id))
    if hi <= lo:
        return []
    target = np.array([[int(a) for a in row] for row in plan[lo:hi]], dtype=np.int64)
    positions = np.arange(lo, hi)
    out: list[Demotion] = []
    for g in range(target.shape[1]):
        high, low = store.retained_arrays(seq_id, g)
        in_high, in_low = np.isin(positions, high), np.isin(positions, low)
        to_low = positions[in_high & (target[:, g] == int(Action.L))]
        to_release = positions[(in_high | in_low) & (target[:, g] == int(Action.R))]
        if to_low.size:
            out.append(Demotion(g, tuple(int(p) for p in to_low), Action.L))
        if to_release.size:
            out.append(Demotion(g, tuple(int(p) for p in to_release), Action.R))
    return out
