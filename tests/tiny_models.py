"""The one tiny random-weight model the unit tests build (offline, from a config)."""

from __future__ import annotations

import torch


def tiny_qwen2(vocab_size: int = 512):
    """A 6-layer Qwen2 with random weights (GQA 4:2, head dim 16), seeded."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config).eval()
