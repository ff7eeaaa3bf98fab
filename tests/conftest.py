"""Shared, offline, session-scoped fixtures: a tiny random model and the two bundled models."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings

# Property tests draw the same examples on every run, so CI cannot turn red by chance; run
# with HYPOTHESIS_PROFILE=explore to search afresh.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Triton reads TRITON_INTERPRET when it is first imported, and other test modules import it
# (through transformers) before tests/kernels is collected: set it here, before anything.
if os.environ.get("PASK_KERNEL_DEVICE", "cpu") != "cuda":
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def tiny_model():
    """A 6-layer Qwen2 with random weights (GQA 4:2, head dim 16): fast store/seam tests."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config).eval()
    return model


@pytest.fixture(scope="session")
def smollm2():
    from pask_agent.runtime.models import load_model

    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def default_model():
    from pask_agent.runtime.models import load_model

    return load_model("default")
