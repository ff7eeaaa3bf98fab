"""Late demotions and attention-mass accumulation in the store (for score-based baselines)."""

from __future__ import annotations

import pytest
import torch

from pask_agent.errors import KVStoreError
from pask_agent.policy.actions import Action
from pask_agent.runtime.memory.kv_layout import KVLayout, StoreConfig
from pask_agent.runtime.memory.kv_store import KVStore
from pask_agent.runtime.models.seam import PaskCache, forward_step, use_pask_attention


def _prefill(model, n: int, *, scores: bool) -> tuple[KVStore, PaskCache]:
    store = KVStore(KVLayout.from_config(model.config), StoreConfig(sinks=2, window=3))
    cache = PaskCache(store)
    use_pask_attention(model)
    store.add_sequence("a")
    step = store.begin_step([("a", n)], want_scores=scores)
    with torch.inference_mode():
        forward_step(model, cache, step, torch.arange(n) % 500)
    store.end_step(step)
    return store, cache


def test_scores_are_attention_mass(tiny_model) -> None:
    n = 12
    store, _ = _prefill(tiny_model, n, scores=True)
    lay = store.layout
    heads = tiny_model.config.num_attention_heads
    for g in range(3):
        mass = store.token_scores("a", g)
        layers = len(store.groups.layers_of(g))
        # every query row's probabilities sum to 1, per query head and layer
        assert float(mass.sum()) == pytest.approx(n * heads * layers, rel=1e-4)
        # causal prefill: the first token gets mass from every query, so it leads
        assert int(mass.argmax()) == 0
        assert torch.equal(mass, store.token_scores("a", g, latest_step=True))
    assert lay.num_layers == 6


def test_demote_settled_tokens_and_refuse_protected(tiny_model) -> None:
    store, _ = _prefill(tiny_model, 12, scores=False)
    assert store.settled("a") == 9  # 12 tokens, window 3
    store.demote("a", 0, [2, 3], Action.L)
    store.demote("a", 0, [3, 4], Action.R)  # 3 from low, 4 from high
    high, low = tuple(a.tolist() for a in store.retained_arrays("a", 0))
    assert sorted(low) == [2] and 3 not in high and 4 not in high
    assert sorted(high) == [0, 1, 5, 6, 7, 8, 9, 10, 11]
    with pytest.raises(KVStoreError, match="sinks or inside the recent window"):
        store.demote("a", 0, [1], Action.R)
    with pytest.raises(KVStoreError, match="sinks or inside the recent window"):
        store.demote("a", 0, [10], Action.R)
    with pytest.raises(KVStoreError, match="promoted"):
        store.demote("a", 0, [5], Action.H)
    with pytest.raises(KVStoreError, match="not held high"):
        store.demote("a", 0, [2], Action.L)
