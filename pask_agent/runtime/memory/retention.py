"""What a revising policy sees of one sequence after a step: a ``RetentionView``.

The score- and recency-based baselines (``revises = True``) re-rank settled tokens every step.
The view is cut from the slot maps' position arrays with vectorized masks, so the host work
per step is a handful of array operations whatever the history length (issue 11, item 3).
"""

from __future__ import annotations

from pask_agent.policy.base import Demotion, PolicySession, RetentionView
from pask_agent.runtime.memory.kv_store import KVStore


def retention_view(
    store: KVStore, seq_id: str, *, with_scores: bool, prefill_done: bool
) -> RetentionView:
    """Settled positions held high (sinks excluded) and held low per layer group, the
    attention mass per position when ``with_scores``, and the keys' geometry (read lazily)
    when the sequence's keys are tracked."""
    settled, sinks = store.settled(seq_id), store.config.sinks
    high, low, scores, latest = [], [], [], []
    for g in range(3):
        h, lo = store.retained_arrays(seq_id, g)
        high.append(h[(h >= sinks) & (h < settled)])
        low.append(lo[lo < settled])
        if with_scores:
            scores.append(store.token_scores(seq_id, g).numpy())
            latest.append(store.token_scores(seq_id, g, latest_step=True).numpy())
    return RetentionView(
        length=store.length(seq_id),
        settled=settled,
        sinks=sinks,
        high=(high[0], high[1], high[2]),
        low=(low[0], low[1], low[2]),
        scores=(scores[0], scores[1], scores[2]) if with_scores else None,
        step_scores=(latest[0], latest[1], latest[2]) if with_scores else None,
        prefill_done=prefill_done,
        keys=store.key_geometry.view(seq_id, store.length(seq_id))
        if store.key_geometry.tracks_any((seq_id,))
        else None,
    )


def revise(
    store: KVStore, seq_id: str, session: PolicySession, *, with_scores: bool, prefill_done: bool
) -> None:
    """Carry out what a revising policy's session decides after a step: its late demotions
    of settled tokens (``KVStore.demote``)."""
    view = retention_view(store, seq_id, with_scores=with_scores, prefill_done=prefill_done)
    demotions: list[Demotion] = list(session.revise(view))  # type: ignore[attr-defined]
    for d in demotions:
        if d.positions:
            store.demote(seq_id, d.group, d.positions, d.action)


__all__ = ["retention_view", "revise"]
