"""The engine's written-out decoder forward (``runtime/models/decoder.py``) equals the
transformers forward through the seam bit for bit, on every weight format, and its fused
projections equal their parts."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import pytest
import torch
from engine_greedy import engine_for, greedy, tiny_loaded
from tiny_models import tiny_qwen2
from torch import nn

from pask_agent.policy.actions import Action
from pask_agent.runtime.models.decoder import DecoderForward
from pask_agent.runtime.models.loading import LoadedModel, load_model, load_tokenizer
from pask_agent.runtime.models.quantized_linear import (
    Int4Linear,
    Int8Linear,
    fuse_rows,
    quantize_linear_layers,
)
from pask_agent.runtime.models.seam import PaskCache, forward_step

PROMPTS = ([5, 17, 99, 3, 250, 41, 7], [300, 2, 2, 8], [11] * 23)


def _decode_both(loaded: LoadedModel, prompts, action: Action, new_tokens: int = 24):
    """Greedy decoding through the engine twice: its own forward, then transformers' forward
    through the seam on a fresh engine. Windows of 4 + 8 put most tokens in the ``action``
    pools, so the stored (BF16 or INT4) rows are read as well as the current ones."""
    ends = []
    for seam in (False, True):
        engine = engine_for(loaded, sinks=4, window=8)
        if seam:
            engine.forward = functools.partial(forward_step, loaded.model, PaskCache(engine.store))
        else:
            assert isinstance(engine.forward.func, DecoderForward)
        ends.append(greedy(engine, prompts, max_new_tokens=new_tokens, action=action,
                           keep_logits=True))  # fmt: skip
    return ends


def _assert_identical(ours, theirs) -> None:
    for a, b in zip(ours, theirs, strict=True):
        assert list(a.token_ids) == list(b.token_ids)
        assert len(a.step_logits) == len(b.step_logits) > 0
        for x, y in zip(a.step_logits, b.step_logits, strict=True):
            assert torch.equal(x, y)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("default")


@pytest.mark.parametrize("weights", ["fp32", "int8", "int4"])
@pytest.mark.parametrize("action", [Action.H, Action.L])
def test_tiny_qwen2_logits_equal_the_transformers_forward(tokenizer, weights, action) -> None:
    model = copy.deepcopy(tiny_qwen2(151936))
    quantize_linear_layers(model, weights)
    loaded = LoadedModel("tiny-qwen2", Path("."), model, tokenizer, weights=weights)
    _assert_identical(*_decode_both(loaded, PROMPTS, action))


def test_qwen3_with_head_norms_equals_the_transformers_forward(tokenizer) -> None:
    """Qwen3 normalizes each query and key head before RoPE; the q/k/v projections are not
    fused here (no bias), k and v are 64 wide: the int4 layers fuse."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(3)
    config = Qwen3Config(
        vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=4096, tie_word_embeddings=True,
    )  # fmt: skip
    model = Qwen3ForCausalLM(config).eval()
    quantize_linear_layers(model, "int4")
    loaded = LoadedModel("tiny-qwen3", Path("."), model, tokenizer, weights="int4")
    assert DecoderForward(model).layers[0].qkv is not None
    _assert_identical(*_decode_both(loaded, PROMPTS, Action.H))


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_smollm2_equals_the_transformers_forward(weights: str) -> None:
    """The real bundled model, loaded with quantized weights (its own copy in this process)."""
    loaded = load_model("smollm2", weights=weights)
    decoder = loaded.shared("decoder_forward", lambda: DecoderForward.of(loaded.model))
    assert all(layer.qkv is not None and layer.gate_up is not None for layer in decoder.layers)
    tok = loaded.tokenizer
    prompts = [tok(p)["input_ids"] for p in ("The capital of France is", "def add(a, b):")]
    _assert_identical(*_decode_both(loaded, prompts, Action.L, new_tokens=32))


def _linear(n_in: int, n_out: int, seed: int, bias: bool = True) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(n_in, n_out, bias=bias)


@pytest.mark.parametrize("kind", [Int8Linear, Int4Linear])
def test_fused_rows_equal_their_parts_and_share_their_codes(kind) -> None:
    parts = [kind(_linear(96, n, seed)) for seed, n in enumerate((128, 64, 64))]
    x = torch.randn(3, 96)
    before = [p(x) for p in parts]
    fused = fuse_rows(parts)
    assert fused is not None and fused.out_features == 256
    assert torch.equal(fused(x), torch.cat(before, dim=-1))
    for p, want in zip(parts, before, strict=True):  # the parts still compute what they did
        assert torch.equal(p(x), want)
    codes = "codes" if kind is Int8Linear else "packed"
    base = getattr(fused, codes)
    for p in parts:  # ... from views of the fused codes: one copy of the weights
        assert getattr(p, codes).untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


def test_parts_that_cannot_fuse_run_apart() -> None:
    # fp32 layers; a format mix; int4 rows cut inside a packed block of 64; other inputs
    assert fuse_rows([_linear(64, 64, 0), _linear(64, 64, 1)]) is None
    assert fuse_rows([Int8Linear(_linear(64, 64, 0)), Int4Linear(_linear(64, 64, 1))]) is None
    assert fuse_rows([Int4Linear(_linear(64, 64, 0)), Int4Linear(_linear(64, 32, 1))]) is None
    assert fuse_rows([Int8Linear(_linear(64, 64, 0)), Int8Linear(_linear(32, 64, 1))]) is None
    # a part without bias beside one with: zeros where it had none
    mixed = [Int8Linear(_linear(64, 64, 0)), Int8Linear(_linear(64, 64, 1, bias=False))]
    x = torch.randn(2, 64)
    want = torch.cat([p(x) for p in mixed], dim=-1)
    fused = fuse_rows(mixed)
    assert fused is not None and torch.equal(fused(x), want)


def test_models_outside_the_family_keep_the_transformers_forward(tokenizer) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=151936, n_embd=32, n_layer=2, n_head=2))
    assert DecoderForward.of(gpt2) is None
    assert DecoderForward.of(tiny_qwen2(512)) is not None
    engine = engine_for(tiny_loaded(tiny_qwen2(151936), tokenizer))
    assert isinstance(engine.forward.func, DecoderForward)
