"""KV store mechanics on a tiny random model: parity, eviction, INT4, reclaiming, accounting."""

from __future__ import annotations

import pytest
import torch
from engine_greedy import engine_for, greedy, tiny_loaded

from pask_agent.errors import KVStoreError
from pask_agent.kernels.int4 import dequantize_int4_ref, quantize_int4_ref
from pask_agent.policy.actions import Action, LayerGroups
from pask_agent.runtime.memory.kv_layout import KVLayout, StoreConfig
from pask_agent.runtime.memory.kv_store import KVStore
from pask_agent.runtime.models.loading import load_tokenizer
from pask_agent.runtime.models.seam import PaskCache, forward_step


@pytest.fixture(scope="module")
def tiny(tiny_model):
    """The tiny random Qwen2 (vocab 512) with the default tokenizer, for the engine."""
    return tiny_loaded(tiny_model, load_tokenizer("default"))


def _prompts(lengths: list[int], seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (n,), generator=g).tolist() for n in lengths]


def _store(model, sinks: int = 4, window: int = 8, cap: int = 16) -> KVStore:
    return KVStore(
        KVLayout.from_config(model.config),
        StoreConfig(sinks=sinks, window=window, rows_per_pool=cap),
    )


def _hf_logits(model, ids: list[int], mask: torch.Tensor | None = None) -> torch.Tensor:
    """Stock sdpa forward over the whole sequence; ``mask`` [T, T] bool = may attend."""
    model.set_attn_implementation("sdpa")
    x = torch.tensor([ids])
    attn = None
    if mask is not None:
        attn = torch.zeros(1, 1, len(ids), len(ids)).masked_fill(~mask, float("-inf"))
    with torch.inference_mode():
        return model(input_ids=x, attention_mask=attn).logits[0].float()


def test_layer_groups_follow_appendix_a2() -> None:
    g = LayerGroups.for_layers(24)
    assert (g.b1, g.b2) == (8, 16)
    assert [len(g.layers_of(i)) for i in range(3)] == [8, 8, 8]
    g = LayerGroups.for_layers(30)
    assert (g.b1, g.b2) == (10, 20)
    g = LayerGroups.for_layers(32)  # LLaMA-3.1-8B in the paper: 0-10 / 11-21 / 22-31
    assert (g.b1, g.b2) == (11, 22)


def test_batched_full_kv_matches_hf_per_prompt(tiny, tiny_model) -> None:
    prompts = _prompts([5, 23, 11])
    gens = greedy(engine_for(tiny, window=8), prompts, max_new_tokens=12, keep_logits=True)
    for prompt, gen in zip(prompts, gens, strict=True):
        seq = prompt + list(gen.token_ids)
        ref = _hf_logits(tiny_model, seq)
        # step i's logits come from row len(prompt) - 1 + i of the full-sequence forward
        for i, logits in enumerate(gen.step_logits):
            row = ref[len(prompt) - 1 + i]
            assert torch.allclose(logits, row, atol=2e-3), (i, (logits - row).abs().max())
            if i < len(gen.token_ids):
                assert int(row.argmax()) == gen.token_ids[i]


def test_release_after_window_equals_masked_reference(tiny, tiny_model) -> None:
    """Released tokens vanish from attention; survivors keep their absolute RoPE positions."""
    sinks, window, n_prompt = 2, 5, 9
    prompt = _prompts([n_prompt], seed=3)[0]
    engine = engine_for(tiny, sinks=sinks, window=window)
    gen = greedy(engine, [prompt], max_new_tokens=14, action=Action.R, keep_logits=True)[0]
    seq = prompt + list(gen.token_ids)
    n = len(seq)
    mask = torch.tril(torch.ones(n, n, dtype=torch.bool))
    # A decode query at position i sees sinks, itself and keys at positions >= i - window:
    # older ones were released when they left the window (the prefill chunk sees itself whole).
    for i in range(n_prompt, n):
        for j in range(sinks, i - window):
            mask[i, j] = False
    ref = _hf_logits(tiny_model, seq, mask)
    for i, logits in enumerate(gen.step_logits):
        row = ref[n_prompt - 1 + i]
        assert torch.allclose(logits, row, atol=2e-3), (i, (logits - row).abs().max())


def test_int4_and_release_bytes_are_exact(tiny, tiny_model) -> None:
    layout = KVLayout.from_config(tiny_model.config)
    sinks, window = 3, 4
    for action in (Action.L, Action.R):
        engine = engine_for(tiny, sinks=sinks, window=window)
        store = engine.store
        gen = greedy(engine, _prompts([30]), max_new_tokens=6, action=action)[0]
        kv = gen.kv
        n = kv.tokens
        assert n == 30 + 6 - 1  # the last sampled token is never forwarded
        old = n - sinks - window
        per_layer = layout.num_layers
        assert kv.high_bytes == (sinks + window) * per_layer * layout.high_row_bytes
        assert kv.full_bytes == n * per_layer * layout.high_row_bytes
        if action == Action.L:
            assert kv.low_bytes == old * per_layer * layout.low_row_bytes
            assert kv.scale_bytes == old * per_layer * layout.scale_row_bytes
        else:
            assert kv.low_bytes == kv.scale_bytes == 0
        # The prompt never sat in the pools at BF16: its old tokens went straight to their
        # settled form. The peak is the last step's in-flight token, held high until the
        # oldest window token settled at the end of that step.
        settled_row = layout.low_row_bytes + layout.scale_row_bytes if action == Action.L else 0
        assert kv.peak_bytes == kv.live_bytes + per_layer * (layout.high_row_bytes - settled_row)
        assert kv.peak_bytes < 30 * per_layer * layout.high_row_bytes  # the prompt at BF16
        assert store.live_bytes() == 0  # the engine released every request's KV


def _one_chunk(model, actions: tuple[Action, ...]) -> tuple[KVStore, torch.Tensor]:
    """A 10-token prompt in one chunk, every token scheduled ``actions``: store and logits."""
    from pask_agent.runtime.models.seam import use_pask_attention

    store = _store(model, sinks=1, window=2)
    use_pask_attention(model)
    store.add_sequence("a")
    store.schedule_many("a", 0, [actions] * 10)
    step = store.begin_step([("a", 10)])
    with torch.inference_mode():
        logits = forward_step(model, PaskCache(store), step, torch.tensor(_prompts([10])[0]))
    store.end_step(step)
    return store, logits


def test_per_group_actions_and_int4_rows(tiny_model) -> None:
    store, logits = _one_chunk(tiny_model, (Action.H, Action.L, Action.R))
    ref, ref_logits = _one_chunk(tiny_model, (Action.H, Action.H, Action.H))
    # tokens 1..7 were written straight into INT4 (group 1) or never stored (group 2), yet the
    # chunk read its own full-precision K/V: the outputs equal those of keeping everything
    assert torch.equal(logits, ref_logits)
    rows = ref._seqs["a"].high[1]
    before_k = {p: ref.pools.high_k[3][rows.slots[rows.index[p]]] for p in range(10)}
    seq = store._seqs["a"]
    assert sorted(seq.high[0].positions) == list(range(10))
    assert sorted(seq.low[1].positions) == list(range(1, 8))
    assert sorted(seq.high[1].positions) == [0, 8, 9]
    assert sorted(seq.high[2].positions) == [0, 8, 9] and len(seq.low[2].positions) == 0
    # the peak never held the chunk at BF16: it is what the store keeps now
    assert store.report("a").peak_bytes == store.report("a").live_bytes == store.live_bytes()
    # the low pool holds exactly the B.5 quantization of the token's BF16 rows
    for pos, slot in zip(seq.low[1].positions, seq.low[1].slots, strict=True):
        codes, scales = quantize_int4_ref(before_k[pos])
        assert torch.equal(store.pools.low_k[3][slot], codes)
        assert torch.equal(store.pools.low_ks[3][slot], scales)
        deq = dequantize_int4_ref(store.pools.low_k[3][slot], store.pools.low_ks[3][slot], 16)
        assert (deq - before_k[pos].float()).abs().max() <= scales.float().max() / 2 + 1e-6
    lay = store.layout
    kv = store.report("a")
    groups = store.groups
    n0, n1, n2 = (len(groups.layers_of(g)) for g in range(3))
    assert kv.high_bytes == (10 * n0 + 3 * n1 + 3 * n2) * lay.high_row_bytes
    assert kv.low_bytes == 7 * n1 * lay.low_row_bytes
    # split at position 5: positions 0..4 are "the prompt", 5..9 "the answer"
    split = store.report("a", prompt_tokens=5)
    low_row = lay.low_row_bytes + lay.scale_row_bytes
    prompt = (5 * n0 + 1 * n1 + 1 * n2) * lay.high_row_bytes + 4 * n1 * low_row
    assert split.prompt_bytes == prompt and split.prompt_full_bytes == kv.full_bytes // 2
    assert split.measured_b_prompt == prompt / split.prompt_full_bytes
    assert split.measured_b_answer == (kv.live_bytes - prompt) / (kv.full_bytes // 2)


def test_released_slots_are_reused_not_masked(tiny) -> None:
    from pask_agent.runtime.config import RuntimeConfig
    from pask_agent.runtime.engine import Engine

    # pools that hold 64 tokens at Full KV; 64 + 40 tokens written under R fit, reused
    tokens = 64
    lay = KVLayout.from_config(tiny.model.config)
    capacity = tokens * lay.num_layers * lay.high_row_bytes
    engine = Engine(tiny, RuntimeConfig(sinks=2, window=4, kv_capacity_bytes=capacity))
    (end,) = greedy(engine, _prompts([6]), max_new_tokens=tokens + 40, action=Action.R)
    assert len(end.token_ids) == tokens + 40
    assert engine.store.allocated_bytes() == capacity  # the buffer never grew
    assert engine.store.pools.rows.high[0] < tokens + 46  # rows were reused, not added


def test_store_errors_are_typed(tiny_model) -> None:
    store = _store(tiny_model)
    with pytest.raises(KVStoreError, match="unknown sequence"):
        store.begin_step([("nope", 1)])
    store.add_sequence("a")
    with pytest.raises(KVStoreError, match="already exists"):
        store.add_sequence("a")
    with pytest.raises(KVStoreError, match="one action per layer group"):
        store.schedule("a", 0, (Action.H,))
    with pytest.raises(KVStoreError, match="at least one token"):
        store.begin_step([("a", 0)])
    with pytest.raises(KVStoreError):
        StoreConfig(window=0)
