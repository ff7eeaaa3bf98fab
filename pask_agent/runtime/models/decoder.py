"""The engine's forward for Llama-family decoders, written out: one function call per layer part.

A decode step at one request runs a 24-layer model on one row. Through transformers' modules
that is some 700 small torch calls (module dispatch, shape plumbing, a causal mask our attention
never reads), about 10 ms of a 31 ms step on this CPU with int4 weights
(``python -m pask_agent.eval.step_profile --weights int4``). ``DecoderForward`` runs the same
modules' parameters through the same operations in the same order, so its logits equal the
transformers forward bit for bit (``tests/runtime/test_decoder_forward.py``), and
adds two things the module structure hides:

- the q/k/v projections run as one matmul and gate/up as another when the layers hold quantized
  weights (``quantized_linear.fuse_rows``: the parts' codes become views of the fused layer's,
  and each output column is computed exactly as before);
- attention goes straight to the store, with the keys, values and queries in the store's
  ``[tokens, heads, dim]`` layout, no transposes in between.

Architectures outside the family (a decoder with other parts) get ``None`` from ``of`` and
the engine keeps the transformers forward through the seam (``seam.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from pask_agent.runtime.memory.kv_layout import StepBatch
from pask_agent.runtime.memory.kv_store import KVStore
from pask_agent.runtime.models.loading import LoadedModel
from pask_agent.runtime.models.quantized_linear import fuse_rows
from pask_agent.runtime.models.seam import PaskCache, forward_step, use_pask_attention

__all__ = ["DecoderForward", "engine_forward"]

StepForward = Callable[[StepBatch, torch.Tensor], torch.Tensor]

# model types whose decoder layer is exactly: norm, attention (q/k/v/o, optional q/k norms,
# RoPE), residual, norm, gated MLP, residual; anything else keeps the transformers forward
FAMILY = frozenset({"llama", "qwen2", "qwen3", "mistral"})


@dataclass(frozen=True, slots=True)
class _Layer:
    """One decoder layer and its fused projections (``None`` where the parts run apart).

    The unfused linear layers are looked up on each call, not held: an engine may swap them
    for oneDNN copies after this was built (``cpu_linear.py``).
    """

    attn: nn.Module
    mlp: nn.Module
    input_norm: Callable[[torch.Tensor], torch.Tensor]
    post_norm: Callable[[torch.Tensor], torch.Tensor]
    qkv: nn.Module | None
    gate_up: nn.Module | None
    act: Callable[[torch.Tensor], torch.Tensor]


def _rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x [T, H, D]``: transformers' ``x*cos + rotate_half(x)*sin``.

    ``rotate_half(x) = cat(-x2, x1)``; with ``signed_sin = cat(-sin1, sin2)`` (once per step)
    its product is ``roll(x) * signed_sin``, equal bit for bit (a sign moves exactly through a
    product), in two operations where ``rotate_half`` takes four.
    """
    return (x * cos) + (x.roll(x.shape[-1] // 2, dims=-1) * signed_sin)


def _fast_norm(module: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``torch.rms_norm`` in place of a family RMSNorm module (the same operations as its
    ``forward``, one call instead of six); anything else is called as it is."""
    eps, weight = getattr(module, "variance_epsilon", None), getattr(module, "weight", None)
    if not type(module).__name__.endswith("RMSNorm") or eps is None or weight is None:
        return module
    return functools.partial(torch.rms_norm, normalized_shape=weight.shape, weight=weight, eps=eps)


class DecoderForward:
    """``forward(store, step, input_ids) -> logits [B, V]`` for one packed step of the engine."""

    def __init__(self, model: nn.Module) -> None:
        body = model.model
        self.embed = body.embed_tokens
        self.rotary = body.rotary_emb
        self.norm = _fast_norm(body.norm)
        self.head = model.lm_head
        cfg = model.config
        self.num_heads = int(cfg.num_attention_heads)
        self.num_kv_heads = int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads)
        self.scale = self.head_dim**-0.5
        self.layers = [self._layer(layer) for layer in body.layers]

    @classmethod
    def of(cls, model: nn.Module) -> DecoderForward | None:
        """The written-out forward for ``model``, or ``None`` when it is not of the family."""
        config = getattr(model, "config", None)
        if getattr(config, "model_type", None) not in FAMILY:
            return None
        body = getattr(model, "model", None)
        parts = ("embed_tokens", "rotary_emb", "norm", "layers")
        if body is None or not all(hasattr(body, p) for p in parts):
            return None
        return cls(model)

    @staticmethod
    def _layer(layer: nn.Module) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        return _Layer(
            attn=attn,
            mlp=mlp,
            input_norm=_fast_norm(layer.input_layernorm),
            post_norm=_fast_norm(layer.post_attention_layernorm),
            qkv=fuse_rows([attn.q_proj, attn.k_proj, attn.v_proj]),
            gate_up=fuse_rows([mlp.gate_proj, mlp.up_proj]),
            act=F.silu if type(mlp.act_fn).__name__ == "SiLUActivation" else mlp.act_fn,
        )

    def __call__(self, store: KVStore, step: StepBatch, input_ids: torch.Tensor) -> torch.Tensor:
        positions = step.positions.view(1, -1)
        x = self.embed(input_ids.view(1, -1))  # [1, T, hidden]
        cos, sin = self.rotary(x, positions)  # [1, T, D]
        cos, sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)  # [T, 1, D] over heads
        half = sin.shape[-1] // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)  # _rope's signed_sin
        x = x[0]
        for index, layer in enumerate(self.layers):
            x = x + self._attention(store, step, index, layer, layer.input_norm(x), cos, sin)
            x = x + self._mlp(layer, layer.post_norm(x))
        rows = step.last_token_rows().to(x.device)
        return self.head(self.norm(x[rows])).float()

    def _attention(
        self,
        store: KVStore,
        step: StepBatch,
        index: int,
        layer: _Layer,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        tokens, d, attn = h.shape[0], self.head_dim, layer.attn
        heads, kv_heads = self.num_heads, self.num_kv_heads
        if layer.qkv is not None and not hasattr(attn, "q_norm"):
            qkv = layer.qkv(h)  # RoPE once over the query and key heads side by side
            qk = _rope(qkv[:, : (heads + kv_heads) * d].view(tokens, -1, d), cos, sin)
            q, k = qk[:, :heads], qk[:, heads:]
            v = qkv[:, (heads + kv_heads) * d :].view(tokens, kv_heads, d)
        else:
            if layer.qkv is not None:
                q, k, v = layer.qkv(h).split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
            else:
                q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
            q, k = q.view(tokens, heads, d), k.view(tokens, kv_heads, d)
            v = v.view(tokens, kv_heads, d)
            if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm per head before RoPE
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        k = store.centered_keys(index, step, k)
        store.write(index, step, k, v)
        out = store.attend(index, step, q, k, v, scale=self.scale)
        return attn.o_proj(out.to(h.dtype).reshape(tokens, -1))

    @staticmethod
    def _mlp(layer: _Layer, h: torch.Tensor) -> torch.Tensor:
        mlp = layer.mlp
        if layer.gate_up is not None:
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
        else:
            gate, up = mlp.gate_proj(h), mlp.up_proj(h)
        return mlp.down_proj(layer.act(gate) * up)


def engine_forward(loaded: LoadedModel, store: KVStore) -> StepForward:
    """``forward(step, input_ids) -> logits [B, V]`` over ``store``: written out for the family
    (built once per loaded model, so its fused layers exist once), else transformers' forward
    through the seam. The model is switched to the seam's attention either way, so a plain
    ``model(...)`` call with a ``PaskCache`` also reads the store."""
    use_pask_attention(loaded.model)
    decoder = loaded.shared("decoder_forward", lambda: DecoderForward.of(loaded.model))
    if decoder is not None:
        return functools.partial(decoder, store)
    return functools.partial(forward_step, loaded.model, PaskCache(store))
