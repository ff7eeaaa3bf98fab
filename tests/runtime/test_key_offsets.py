"""Centered keys (``runtime/models/key_offsets.py``): attention unchanged, INT4 rows closer
to Full KV."""

from __future__ import annotations

import pytest
import torch
from engine_greedy import engine_for, greedy, tiny_loaded

from pask_agent.errors import KVStoreError
from pask_agent.policy.actions import Action
from pask_agent.policy.full import FullPolicy
from pask_agent.policy.mikv import MiKVPolicy
from pask_agent.policy.pask import PaskPolicy
from pask_agent.policy.snapkv import SnapKVPolicy
from pask_agent.policy.uniform import UniformPolicy
from pask_agent.runtime.memory.kv_layout import KVLayout, StoreConfig
from pask_agent.runtime.memory.kv_store import KVStore
from pask_agent.runtime.models import key_offsets as key_offsets_module
from pask_agent.runtime.models.key_offsets import (
    cached_key_offsets,
    measure_key_offsets,
    offsets_cache_key,
)
from pask_agent.runtime.models.loading import load_tokenizer
from pask_agent.runtime.models.seam import PaskCache, forward_step, use_pask_attention


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return tiny_loaded(tiny_model, load_tokenizer("default"))


def _prompt(n: int, seed: int = 3) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (n,), generator=g).tolist()


def _logits_through_store(model, ids: list[int], offsets, *, centered: bool) -> torch.Tensor:
    """Prefill ``ids`` in two chunks and decode one token, all high; logits of every step."""
    store = KVStore(
        KVLayout.from_config(model.config),
        StoreConfig(sinks=2, window=4, rows_per_pool=64),
        key_offsets=offsets,
    )
    store.add_sequence("s", centered=centered)
    cache = PaskCache(store)
    use_pask_attention(model)
    out = []
    with torch.inference_mode():
        for chunk in (ids[:9], ids[9:], [ids[0]]):
            step = store.begin_step([("s", len(chunk))])
            out.append(forward_step(model, cache, step, torch.tensor(chunk)))
    return torch.cat(out)


def test_centering_leaves_attention_unchanged(tiny_model) -> None:
    # a large offset (far larger than the keys) cancels in every query's softmax
    layout = KVLayout.from_config(tiny_model.config)
    g = torch.Generator().manual_seed(0)
    shape = (layout.num_layers, layout.num_kv_heads, layout.head_dim)
    offsets = 20 * torch.randn(shape, generator=g)
    ids = _prompt(15)
    plain = _logits_through_store(tiny_model, ids, offsets, centered=False)
    centered = _logits_through_store(tiny_model, ids, offsets, centered=True)
    assert torch.allclose(plain, centered, atol=2e-2), (plain - centered).abs().max()
    # the offsets are really applied: keys stored BF16 after a shift of 20 round differently
    assert not torch.equal(plain, centered)


def test_store_refuses_bad_offsets(tiny_model) -> None:
    layout = KVLayout.from_config(tiny_model.config)
    with pytest.raises(KVStoreError, match="key_offsets must have shape"):
        KVStore(layout, StoreConfig(rows_per_pool=8), key_offsets=torch.zeros(2, 2, 2))
    store = KVStore(layout, StoreConfig(rows_per_pool=8))
    with pytest.raises(KVStoreError, match="needs a store built with key_offsets"):
        store.add_sequence("s", centered=True)


def test_only_policies_that_may_store_int4_are_centered() -> None:
    assert PaskPolicy.stores_int4 and MiKVPolicy.stores_int4
    assert not FullPolicy.stores_int4 and not SnapKVPolicy.stores_int4
    assert UniformPolicy(Action.L).stores_int4 and not UniformPolicy(Action.R).stores_int4


def test_full_kv_is_bit_identical_with_and_without_centering(tiny) -> None:
    prompts = [_prompt(30, seed=s) for s in (1, 2)]
    on = greedy(engine_for(tiny, window=8), prompts, max_new_tokens=6, keep_logits=True)
    off = greedy(
        engine_for(tiny, window=8, center_keys=False), prompts, max_new_tokens=6, keep_logits=True
    )
    for a, b in zip(on, off, strict=True):
        assert a.token_ids == b.token_ids
        assert all(torch.equal(x, y) for x, y in zip(a.step_logits, b.step_logits, strict=True))


def test_offsets_are_the_mean_key_and_measured_once(tiny) -> None:
    offsets = tiny.key_offsets
    layout = KVLayout.from_config(tiny.model.config)
    assert offsets.shape == (layout.num_layers, layout.num_kv_heads, layout.head_dim)
    assert tiny.key_offsets is offsets  # cached on the loaded model
    again = measure_key_offsets(tiny.model, tiny.tokenizer)
    assert torch.equal(again, offsets)
    assert tiny.model.config._attn_implementation in ("pask", "sdpa")


def test_offsets_are_measured_once_per_weights_and_read_back_by_later_processes(
    smollm2, tmp_path, monkeypatch
) -> None:
    """The offsets file stands in for the forward pass only for the same weights and prompt."""
    model, tokenizer, folder = smollm2.model, smollm2.tokenizer, smollm2.path
    key = offsets_cache_key(model, tokenizer, folder)
    assert key is not None and len(key) == 24
    first = cached_key_offsets(model, tokenizer, folder, tmp_path)
    # what the model holds, which another process may have measured: equal up to fp32 rounding
    # (that process's thread count, or oneDNN layers, sum in another order)
    torch.testing.assert_close(first, smollm2.key_offsets, rtol=1e-4, atol=1e-5)
    assert [p.name for p in (tmp_path / "key_offsets").iterdir()] == [f"{key}.pt"]

    def no_forward(*args, **kwargs):
        raise AssertionError("measured again although the cache holds these weights")

    monkeypatch.setattr(key_offsets_module, "measure_key_offsets", no_forward)
    assert torch.equal(cached_key_offsets(model, tokenizer, folder, tmp_path), first)
    # a model built in memory (no weight files in its folder) has no key: always measured
    assert offsets_cache_key(model, tokenizer, tmp_path) is None
    # an unreadable file is measured again and replaced, never returned
    (tmp_path / "key_offsets" / f"{key}.pt").write_bytes(b"not a tensor")
    with pytest.raises(AssertionError, match="measured again"):
        cached_key_offsets(model, tokenizer, folder, tmp_path)
    monkeypatch.undo()
    assert torch.equal(cached_key_offsets(model, tokenizer, folder, tmp_path), first)
    assert [p.suffix for p in (tmp_path / "key_offsets").iterdir()] == [".pt"]  # no temp left


def test_other_weights_or_prompts_get_another_key(smollm2, tiny) -> None:
    key = offsets_cache_key(smollm2.model, smollm2.tokenizer, smollm2.path)
    # a random model claiming SmolLM2's folder: its config and embedding differ
    assert offsets_cache_key(tiny.model, tiny.tokenizer, smollm2.path) not in (None, key)
    # SmolLM2's weights, another tokenizer: other token ids are measured
    assert offsets_cache_key(smollm2.model, tiny.tokenizer, smollm2.path) != key


def _first_logits(loaded, ids: list[int], *, center: bool, action: Action | None) -> torch.Tensor:
    kw = {} if action is None else {"action": action}
    run = greedy(
        engine_for(loaded, center_keys=center), [ids], max_new_tokens=1, keep_logits=True, **kw
    )
    return run[0].step_logits[0].float()


def _kl(full: torch.Tensor, low: torch.Tensor) -> float:
    """KL(Full KV || every settled prompt token INT4) of the first answer token's distribution."""
    p, q = torch.log_softmax(full, -1), torch.log_softmax(low, -1)
    return float((p.exp() * (p - q)).sum())


@pytest.mark.slow
def test_centered_int4_keys_are_closer_to_full_kv_on_the_default_model(default_model) -> None:
    from pask_agent.integrations.sql import SQLiteAssistant
    from pask_agent.package_data import sample_data_dir

    assistant = SQLiteAssistant(sample_data_dir() / "school.sqlite", runtime=None)
    messages = assistant.messages("How many students are enrolled in each course?")
    prompt = default_model.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    ids = default_model.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    # Full KV is stored uncentered whatever the setting (bit-identical: tested above)
    full = _first_logits(default_model, ids, center=True, action=None)
    plain = _kl(full, _first_logits(default_model, ids, center=False, action=Action.L))
    centered = _kl(full, _first_logits(default_model, ids, center=True, action=Action.L))
    print(f"\nKL to Full KV, prompt in INT4: plain {plain:.3e}, centered {centered:.3e}")
    assert centered < 0.5 * plain


def test_calibration_replays_int4_keys_as_the_centered_store_holds_them(tiny) -> None:
    """The teacher (``calibration/teacher.py``) must see the INT4 error serving has."""
    from pask_agent.calibration.model_parts import ModelParts, stored_low

    plain = ModelParts.of(tiny.model)
    centered = ModelParts.of(tiny.model, key_offsets=tiny.key_offsets)
    layout = KVLayout.from_config(tiny.model.config)
    g = torch.Generator().manual_seed(4)
    # keys that share the layer's offset, as real keys do
    shape = (7, layout.num_kv_heads, layout.head_dim)
    mu = tiny.key_offsets[1]
    k = mu + 0.1 * torch.randn(shape, generator=g)
    assert torch.equal(plain.low_keys(1, k), stored_low(k))
    assert torch.allclose(centered.low_keys(1, k), stored_low(k - mu) + mu)
    plain_error = float((plain.low_keys(1, k) - k).norm())
    assert float((centered.low_keys(1, k) - k).norm()) < plain_error
