"""Rankings over ``int4``'s store: SnapKV's window (``snapkv_int4``), KeyDiff's key geometry
(``keydiff``) and R-KV's importance less redundancy (``rkv``).

The key geometry comes from the store itself (``runtime/memory/key_geometry.py``): unit keys as
attention saw them, before centering. Tests check the one-dot-product formulas against their
pairwise definitions, that the book follows the store (centering undone, truncate, copy,
removal), and that each policy runs end to end on SmolLM2 within its budget with the answer kept.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest
import torch

from pask_agent.errors import ConfigError
from pask_agent.policy import KeyDiffPolicy, PolicyEnv, RKVPolicy, SnapKVInt4Policy
from pask_agent.policy.base import RetentionView
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.rkv import redundancy
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.memory.kv_layout import KVLayout, StoreConfig
from pask_agent.runtime.memory.kv_store import KVStore
from pask_agent.runtime.runtime import Runtime

LAYOUT = KVLayout(num_layers=6, num_kv_heads=2, head_dim=8)
WINDOW = 16


def _store(offsets: torch.Tensor | None = None) -> KVStore:
    return KVStore(LAYOUT, StoreConfig(sinks=2, window=4, rows_per_pool=64), key_offsets=offsets)


def _write(store: KVStore, seq: str, keys: torch.Tensor) -> None:
    """Write ``keys [n, layers, Hkv, D]`` as one chunk, every layer, as the decoder does."""
    step = store.begin_step([(seq, keys.shape[0])])
    for layer in range(LAYOUT.num_layers):
        k = store.centered_keys(layer, step, keys[:, layer])
        store.write(layer, step, k, torch.zeros_like(k))
    store.end_step(step)


def _keys(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn((n, LAYOUT.num_layers, LAYOUT.num_kv_heads, LAYOUT.head_dim), generator=g)


def _pairwise_mean_similarity(unit: np.ndarray) -> np.ndarray:
    """``[n, m]``: R-KV's redundancy before its softmax, each key's mean cosine similarity to
    the *other* keys, from the n×n cosine matrix with its diagonal left out."""
    sim = np.einsum("imd,jmd->ijm", unit, unit)
    sim[np.arange(len(unit)), np.arange(len(unit))] = 0.0
    return sim.sum(axis=1) / (len(unit) - 1)


def test_the_mean_key_dot_gives_rkvs_pairwise_redundancy_and_keydiffs_cosine() -> None:
    store = _store()
    store.add_sequence("s", track_keys=True)
    keys = _keys(30)
    _write(store, "s", keys)
    geometry = store.key_geometry.view("s", 30)
    for group in range(3):
        dots, norm = geometry.to_mean(group, 30)
        layers = LAYOUT.groups.layers_of(group)
        raw = keys[:, list(layers)].reshape(30, -1, LAYOUT.head_dim).numpy()
        unit = raw / np.linalg.norm(raw, axis=-1, keepdims=True)
        pairwise = _pairwise_mean_similarity(unit)
        z = np.exp(pairwise - pairwise.max(axis=0))
        want = (z / z.sum(axis=0)).mean(axis=1)
        assert np.allclose(redundancy(dots, 30), want, atol=2e-3)  # FP16 unit keys
        anchor = unit.mean(axis=0)
        cos = np.einsum("nmd,md->nm", unit, anchor / np.linalg.norm(anchor, axis=-1)[:, None])
        assert np.allclose(dots / norm, cos, atol=2e-3)


def test_the_book_sees_keys_before_centering_and_follows_the_sequence() -> None:
    offsets = 30 * torch.ones((LAYOUT.num_layers, LAYOUT.num_kv_heads, LAYOUT.head_dim))
    store = _store(offsets)
    store.add_sequence("c", centered=True, track_keys=True)
    store.add_sequence("p", track_keys=True)
    store.add_sequence("untracked")
    keys = _keys(12, seed=1)
    _write(store, "c", keys)
    _write(store, "p", keys)
    _write(store, "untracked", keys)
    # the stored keys are shifted by 30 in every channel, the book's are not
    c, p = store.key_geometry.view("c", 12), store.key_geometry.view("p", 12)
    for g in range(3):
        assert np.allclose(c.to_mean(g, 12)[0], p.to_mean(g, 12)[0], atol=2e-3)
    assert store.key_geometry.view("untracked", 12).to_mean(0, 12)[0].shape == (0, 0)
    store.truncate("p", 5)
    assert store.key_geometry.view("p", store.length("p")).to_mean(0, 5)[0].shape[0] == 5
    store.add_sequence("copy", track_keys=True)
    store.copy_sequence("p", "copy")
    assert np.allclose(
        store.key_geometry.view("copy", 5).to_mean(1, 5)[0],
        store.key_geometry.view("p", 5).to_mean(1, 5)[0],
    )
    for seq in ("c", "p", "copy"):
        store.remove_sequence(seq)
    assert not store.key_geometry.tracks_any(("c", "p", "copy"))


def _view(n: int, step_scores: np.ndarray | None, keys: Any) -> RetentionView:
    low = np.arange(2, n - 4)
    empty = np.zeros(0, np.int64)
    scores = None if step_scores is None else (step_scores,) * 3
    return RetentionView(
        length=n, settled=n - 4, sinks=2, high=(empty,) * 3, low=(low,) * 3, scores=scores,
        step_scores=scores, prefill_done=True, keys=keys,
    )  # fmt: skip


def test_keydiff_releases_the_keys_most_like_the_mean_first() -> None:
    # thirty keys pointing one way, thirty spread out: the crowd goes first
    g = torch.Generator().manual_seed(2)
    common = torch.randn((1, LAYOUT.num_layers, LAYOUT.num_kv_heads, LAYOUT.head_dim), generator=g)
    crowd, spread = common + 0.01 * _keys(30, seed=3), _keys(30, seed=4)
    keys = torch.stack([crowd, spread], dim=1).reshape(60, *crowd.shape[1:])  # crowd at even
    store = _store()
    store.add_sequence("s", track_keys=True)
    _write(store, "s", keys)
    costs = PayloadCosts.from_dims(LAYOUT.num_layers, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    session = KeyDiffPolicy().start(PolicyEnv(costs, 2, 4, 0.3))
    session.plan_prefill(["protected_content"] * 60)
    demotions = session.revise(_view(60, None, store.key_geometry.view("s", 60)))
    released = {p for d in demotions for p in d.positions}
    assert released and released <= set(range(2, 56, 2))  # only crowd keys go


def test_rkv_weighs_attention_against_redundancy() -> None:
    keys = _keys(20, seed=5)
    store = _store()
    store.add_sequence("s", track_keys=True)
    _write(store, "s", keys)
    geometry = store.key_geometry.view("s", 20)
    costs = PayloadCosts.from_dims(LAYOUT.num_layers, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    env = PolicyEnv(costs, 2, 4, 0.15)
    attention = np.zeros(20)
    attention[[3, 9]] = 5.0  # the window looked at two tokens only

    def scores(policy: RKVPolicy) -> list[np.ndarray]:
        session = policy.start(env)
        session.plan_prefill(["protected_content"] * 20)
        session.revise(_view(20, attention, geometry))
        return session.prompt_scores

    # all importance: the attended tokens rank first
    assert set(np.argsort(-scores(RKVPolicy(lam=1.0, kernel=1))[0])[:2]) == {3, 9}
    # all redundancy: least redundant first, the similarity taken over the keys before the
    # 8-token observation window
    for g, got in enumerate(scores(RKVPolicy(lam=0.0))):
        dots, _ = geometry.to_mean(g, 12)
        assert np.allclose(got, -redundancy(dots, 12))
    with pytest.raises(ConfigError, match="lam"):
        RKVPolicy(lam=1.5)
    with pytest.raises(ConfigError, match="keys"):
        RKVPolicy().start(env).score_prompt(_view(20, attention, None), 0)


def get_weather(city: str, unit: str = "celsius") -> str:
    """Current weather for a city.

    Args:
        city: The city's name.
        unit: celsius or fahrenheit.
    """
    return "sunny"


@pytest.mark.parametrize("policy", [SnapKVInt4Policy(), KeyDiffPolicy(), RKVPolicy()])
def test_end_to_end_on_smollm2_within_budget_answer_kept(smollm2, policy: Any) -> None:
    question = [{"role": "user", "content": "What is the weather in Oslo, in fahrenheit?"}]

    async def main() -> tuple[Any, list[np.ndarray], int, bool]:
        async with Runtime.open(smollm2, config=RuntimeConfig(window=WINDOW)) as rt:
            conv = rt.conversation("rank")
            result = await rt.chat(
                question, tools=[get_weather], tool_choice="required", max_new_tokens=64,
                policy=policy, budget=0.15, parallel_tool_calls=False, conversation=conv,
            )  # fmt: skip
            store = rt.engine.store
            seq = conv._state.seq_id
            kept = [np.concatenate(store.retained_arrays(seq, g)) for g in range(3)]
            return result, kept, store.length(seq), store.key_geometry.tracks_any((seq,))

    result, kept, n, tracked = anyio.run(main)
    u = result.usage
    # a baseline's answer may be wrong here (snapkv_int4 garbles SmolLM2's call at 0.15); what
    # every one must do is hold B after each step and keep the answer it is writing
    assert u.completion_tokens > 0 and u.measured_b <= 0.15 + 1e-9
    assert tracked == policy.needs_keys
    for positions in kept:
        assert set(range(u.prompt_tokens, n)) <= set(positions.tolist())  # answer kept whole
        assert len(positions) < n  # prompt tokens were released
