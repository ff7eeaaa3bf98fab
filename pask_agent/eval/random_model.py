"""A random-weight model of a real model's shape, with a byte-level tokenizer built in memory.

Why: the GPU readiness check (``scripts/gpu_check.py``) runs on a machine that nothing may be
downloaded to and that no weights travel to. Speed, memory and kernel parity depend on the
model's shape, not its weights, so a model built from a config with the real model's layer,
head and vocabulary sizes measures what the real one would; accuracy is not the point.

The tokenizer is what the engine needs of one (stop ids, banned ids, text of generated
tokens, the key-offset prompt): 256 byte-level tokens and three control tokens. Ids between
its vocabulary and the model's are banned from generated text (``special_token_ids``), so a
random model still writes decodable bytes, while every step computes the full-width logits.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # imported by random_model(): the shapes import neither transformers nor triton
    from pask_agent.runtime.models.loading import LoadedModel

__all__ = ["QWEN3_4B", "SMOKE", "ModelShape", "byte_tokenizer", "random_model"]


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The ``Qwen3Config`` fields that set a model's cost (names as transformers spells them)."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = True

    def config_kwargs(self) -> dict[str, Any]:
        fields = asdict(self)
        del fields["name"]
        return fields


QWEN3_4B = ModelShape(
    name="random-qwen3-4b",
    vocab_size=151_936,
    hidden_size=2560,
    intermediate_size=9728,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40_960,
)
"""Qwen3-4B's published config: 36 layers, GQA 32:8, head dim 128, 151,936-token vocabulary."""

SMOKE = ModelShape(
    name="random-qwen3-smoke",
    vocab_size=1024,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=3,  # the fewest that form the store's three layer groups
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=4096,
)
"""The same family at a size a CPU runs in seconds (the CI smoke run)."""

CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def byte_tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast`` over the 256 byte-level symbols plus ``CONTROL_TOKENS``
    (``<|im_end|>`` is its eos): any text encodes, one token per byte, and decodes back."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    end_text, start, end_turn = CONTROL_TOKENS
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=end_turn,
        pad_token=end_text,
        additional_special_tokens=[start],
    )


def random_model(
    shape: ModelShape, *, device: str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0
) -> LoadedModel:
    """A ``Qwen3ForCausalLM`` of ``shape`` with seeded random weights, built on ``device``
    (a 4B model is initialised where it will run: no host copy of its 8 GB)."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from pask_agent.runtime.models.loading import LoadedModel

    config = Qwen3Config(**shape.config_kwargs())
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    return LoadedModel(name=shape.name, path=Path("."), model=model, tokenizer=byte_tokenizer())
