"""The seam into transformers: a ``Cache`` whose layers are our KV store, and an attention
function registered with ``AttentionInterface`` that reads the store.

The model itself is unchanged. It applies RoPE, hands the new K/V to ``cache.update`` (we write
them into the store's high pool and return an ``AttentionCall`` handle in place of the usual
key/value tensors), then calls the registered attention function with that handle, which runs
mixed-precision attention over the store. Sequences of a batch are packed on one token axis
(``input_ids [1, T]``) and ``position_ids`` are always the absolute (logical) positions the
store hands out, never the retained length.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin

from pask_agent.errors import KVStoreError
from pask_agent.runtime.memory.kv_layout import StepBatch
from pask_agent.runtime.memory.kv_store import KVStore

ATTENTION_NAME = "pask"


@dataclass(frozen=True, slots=True)
class AttentionCall:
    """What ``update`` returns instead of K/V tensors: everything attention needs for one layer."""

    store: KVStore
    step: StepBatch
    layer: int
    k: torch.Tensor  # [T, Hkv, D] this chunk's keys (after RoPE)
    v: torch.Tensor  # [T, Hkv, D]


def pask_attention(
    module: Any,
    query: torch.Tensor,
    key: Any,
    value: Any,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention function for ``attn_implementation="pask"``: query ``[1, Hq, T, D]``."""
    if not isinstance(key, AttentionCall):
        raise KVStoreError(
            "attn_implementation 'pask' needs a PaskCache; pass cache=PaskCache(store) or switch "
            "the model back with model.set_attn_implementation('sdpa')"
        )
    q = query[0].transpose(0, 1)  # [T, Hq, D]
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    out = key.store.attend(key.layer, key.step, q, key.k, key.v, scale=scale)
    return out.to(query.dtype).unsqueeze(0), None  # [1, T, Hq, D]


@contextmanager
def stock_attention(model: Any) -> Iterator[None]:
    """Run ``model`` with transformers' own attention (``sdpa``) inside the block, e.g. for a
    forward with a ``DynamicCache`` while an engine has switched it to ``pask``."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


def use_pask_attention(model: Any) -> None:
    """Register the attention function (idempotent) and switch ``model`` to it."""
    if ATTENTION_NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTENTION_NAME, pask_attention)
    model.set_attn_implementation(ATTENTION_NAME)


class _StoreLayer(CacheLayerMixin):
    """Per-layer face of the store for transformers' bookkeeping (lengths, mask sizes)."""

    def __init__(self, cache: PaskCache) -> None:
        super().__init__()
        self._cache = cache
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        return None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise KVStoreError("PaskCache.update handles writes; layers are not updated directly")

    def get_seq_length(self) -> int:
        return self._cache.logical_length()

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._cache.logical_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1


class PaskCache(Cache):
    """A transformers ``Cache`` backed by a ``KVStore``; ``bind(step)`` before each forward."""

    def __init__(self, store: KVStore) -> None:
        self.store = store
        self.step: StepBatch | None = None
        super().__init__(layers=[_StoreLayer(self) for _ in range(store.layout.num_layers)])

    def bind(self, step: StepBatch) -> None:
        self.step = step

    def logical_length(self) -> int:
        # Only meaningful for a single sequence; batched callers always pass position_ids.
        if self.step is None or len(self.step.seq_ids) != 1:
            return 0
        return self.store.length(self.step.seq_ids[0]) - self.step.num_tokens

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[Any, Any]:
        if self.step is None:
            raise KVStoreError("PaskCache used without bind(step): call KVStore.begin_step first")
        k = self.store.centered_keys(layer_idx, self.step, key_states[0].transpose(0, 1))
        v = value_states[0].transpose(0, 1)  # [T, Hkv, D]
        self.store.write(layer_idx, self.step, k, v)
        call = AttentionCall(self.store, self.step, layer_idx, k, v)
        return call, call


def cache_argument(model: Any) -> str:
    """The keyword ``model``'s forward takes a cache by: ``cache`` since transformers 5.2x
    (``past_key_values`` is its deprecated alias), ``past_key_values`` before (5.17 on the
    GPU machine ``scripts/gpu_check.py`` runs on)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def forward_step(
    model: Any, cache: PaskCache, step: StepBatch, input_ids: torch.Tensor
) -> torch.Tensor:
    """Run one packed forward; return fp32 logits ``[B, V]`` at each sequence's last token."""
    cache.bind(step)
    out = model(
        input_ids=input_ids.view(1, -1),
        position_ids=step.positions.view(1, -1),
        use_cache=True,
        logits_to_keep=step.last_token_rows().to(input_ids.device),
        **{cache_argument(model): cache},
    )
    return out.logits[0].float()
