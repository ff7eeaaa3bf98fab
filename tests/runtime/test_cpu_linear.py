"""The model's linear layers through oneDNN: same logits, a tied head still tied to its
embedding, weight bytes counted as before, and other dtypes left alone."""

from __future__ import annotations

import copy

import torch
from tiny_models import tiny_qwen2
from torch import nn

from pask_agent.runtime.cpu_linear import (
    OneDNNLinear,
    prepack_linear_layers,
    step_weight_bytes,
)


def _linears(model: nn.Module) -> int:
    return sum(type(m) is nn.Linear for m in model.modules())


def test_prepacked_model_gives_the_same_logits() -> None:
    dense = tiny_qwen2()
    packed = copy.deepcopy(dense)
    n_linear = _linears(dense)
    before = step_weight_bytes(dense)
    assert prepack_linear_layers(packed) == n_linear > 0
    assert _linears(packed) == 0
    assert sum(isinstance(m, OneDNNLinear) for m in packed.modules()) == n_linear
    ids = torch.randint(0, 512, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want, got = dense(ids).logits, packed(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert step_weight_bytes(packed) == before  # the same bytes, now held by oneDNN


def test_tied_head_keeps_reading_the_embedding() -> None:
    model = tiny_qwen2()
    embedding = model.get_input_embeddings().weight
    prepack_linear_layers(model)
    head = model.lm_head
    assert isinstance(head, OneDNNLinear)
    assert head.weight.data_ptr() == embedding.data_ptr()  # no second dense copy
    q_proj = model.model.layers[0].self_attn.q_proj
    assert q_proj.weight.shape == (q_proj.out_features, q_proj.in_features)


def test_other_dtypes_are_left_as_they_are() -> None:
    model = tiny_qwen2().to(torch.bfloat16)
    assert prepack_linear_layers(model) == 0
    assert _linears(model) > 0
