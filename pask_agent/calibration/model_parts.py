"""The pieces of a decoder-only transformers model that the teacher-forced replay runs layer by
layer (``teacher.py``), and the stored forms of a K/V row (BF16, INT4 round trip) it attends
over, so the replay sees exactly what the KV store would hand back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pask_agent.kernels.int4 import dequantize_int4_ref, quantize_int4_ref
from pask_agent.policy.actions import LayerGroups


def stored_high(x: torch.Tensor) -> torch.Tensor:
    """What the store hands back for a high row: a BF16 copy (identity when computing in BF16)."""
    return x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16).to(x.dtype)


def stored_low(x: torch.Tensor) -> torch.Tensor:
    """What the store hands back for an INT4 row: quantized, then dequantized (App. B.5)."""
    codes, scales = quantize_int4_ref(x)
    return dequantize_int4_ref(codes, scales, x.shape[-1], dtype=x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass(frozen=True)
class ModelParts:
    """The pieces of a decoder-only transformers model the replay runs layer by layer."""

    embed: Any
    layers: Any
    norm: Any
    lm_head_weight: torch.Tensor  # [V, d]
    rotary: Any
    num_heads: int
    num_kv_heads: int
    head_dim: int
    groups: LayerGroups
    dtype: torch.dtype
    # [layers, Hkv, D]: what the store centers INT4-stored keys on (runtime/models/key_offsets.py);
    # None: keys quantized as they are
    key_offsets: torch.Tensor | None = None

    @classmethod
    def of(cls, model: Any, key_offsets: torch.Tensor | None = None) -> ModelParts:
        cfg = model.config
        heads = int(cfg.num_attention_heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        return cls(
            embed=model.model.embed_tokens,
            layers=model.model.layers,
            norm=model.model.norm,
            lm_head_weight=model.lm_head.weight,
            rotary=model.model.rotary_emb,
            num_heads=heads,
            num_kv_heads=int(cfg.num_key_value_heads),
            head_dim=head_dim,
            groups=LayerGroups.for_layers(len(model.model.layers)),
            dtype=next(model.parameters()).dtype,
            key_offsets=None if key_offsets is None else key_offsets.to(next(model.parameters())),
        )

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def low_keys(self, layer: int, k: torch.Tensor) -> torch.Tensor:
        """Keys ``[.., Hkv, D]`` as an INT4 row hands them back: centered as the store keeps
        a PASK request's keys, quantized, dequantized, and moved back (the shift cancels in
        the softmax, so only the quantization error remains)."""
        if self.key_offsets is None:
            return stored_low(k)
        mu = self.key_offsets[layer].to(k.dtype)
        return stored_low(k - mu) + mu

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x [..., T, heads, D]; cos/sin [T, D]
        return x * cos[:, None, :] + _rotate_half(x) * sin[:, None, :]

    def qkv(
        self, layer: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normed input → RoPE'd ``q [.., T, Hq, D]``, ``k``, ``v [.., T, Hkv, D]``."""
        attn = self.layers[layer].self_attn
        shape = (*x.shape[:-1], -1, self.head_dim)
        q = self.rope(attn.q_proj(x).view(shape), cos, sin)
        k = self.rope(attn.k_proj(x).view(shape), cos, sin)
        return q, k, attn.v_proj(x).view(shape)
