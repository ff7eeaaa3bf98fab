"""Value types of the KV store: the model's KV shape, protection settings, one step's batch and
write plan, byte reports."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pask_agent.errors import KVStoreError
from pask_agent.kernels.attention import PoolView, QueryChunk
from pask_agent.policy.actions import LayerGroups


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Shape of a model's KV: layers, KV heads, head dim, and the three layer groups."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def from_config(cls, config: object) -> KVLayout:
        text = getattr(config, "text_config", config)
        heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        return cls(text.num_hidden_layers, heads, head_dim)

    @property
    def groups(self) -> LayerGroups:
        return LayerGroups.for_layers(self.num_layers)

    @property
    def high_row_bytes(self) -> int:
        """Bytes of one token's K and V in one layer at BF16."""
        return 2 * self.num_kv_heads * self.head_dim * 2

    @property
    def low_row_bytes(self) -> int:
        """Bytes of one token's packed INT4 K and V codes in one layer (odd dims padded)."""
        return 2 * self.num_kv_heads * ((self.head_dim + 1) // 2)

    @property
    def scale_row_bytes(self) -> int:
        """Bytes of one token's FP16 K and V scales in one layer (one per KV head)."""
        return 2 * self.num_kv_heads * 2


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Protection settings. ``sinks`` first tokens and the last ``window`` tokens stay high.

    ``rows_per_pool`` sizes a store made without a byte capacity (tests, tools): that many
    rows in each of its six pools (high and low, per layer group).
    """

    sinks: int = 4
    window: int = 16
    high_dtype: torch.dtype = torch.bfloat16
    rows_per_pool: int = 256
    attention_backend: str = "auto"  # kernels/attention.py: "auto", "native", "torch", "triton"

    def __post_init__(self) -> None:
        if self.sinks < 0 or self.window < 1:
            raise KVStoreError(f"need sinks >= 0 and window >= 1, got {self.sinks}, {self.window}")
        if self.rows_per_pool < 1:
            raise KVStoreError("rows_per_pool must be >= 1")


@dataclass(frozen=True, slots=True)
class GroupWrite:
    """Where one layer group stores a step's ``[T]`` new rows; rows in neither are released."""

    high_rows: torch.Tensor | None  # [Th] int64 rows of the step kept high; None: all, in order
    high_slots: torch.Tensor  # [Th] int64
    low_rows: torch.Tensor  # [Tl] int64 rows quantized straight into the low pool
    low_slots: torch.Tensor  # [Tl] int64


@dataclass(frozen=True, slots=True)
class StepBatch:
    """One forward step: which sequences write how many new tokens, packed on one token axis.

    ``q_offsets[b]:q_offsets[b+1]`` are sequence b's rows in the packed ``[T]`` axis;
    ``positions`` are their absolute positions; ``high``/``low`` are per-group views of the
    stored keys each sequence reads (taken before this step's tokens are added).
    """

    seq_ids: tuple[str, ...]
    q_offsets: torch.Tensor  # [B+1] int64
    positions: torch.Tensor  # [T] int64
    writes: tuple[GroupWrite, ...]  # per group: where each new token's K/V goes
    high: tuple[PoolView, ...]  # per group
    low: tuple[PoolView, ...]  # per group
    want_scores: bool = False
    # [T, 1, 1] 1.0 on the rows of sequences whose keys are stored centered, else 0.0; None
    # when the step has none (``KVStore.centered_keys``)
    centered_rows: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.positions.numel())

    def chunk(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> QueryChunk:
        """One layer's queries ``[T, Hq, D]`` and new keys/values ``[T, Hkv, D]`` of this step,
        as the attention backends take them."""
        return QueryChunk(q, self.q_offsets, self.positions, k, v)

    def last_token_rows(self) -> torch.Tensor:
        """[B] row of each sequence's last token in the packed axis (where logits are needed)."""
        return self.q_offsets[1:] - 1


@dataclass(frozen=True, slots=True)
class KVReport:
    """Exact payload bytes: B = (high + low + scales) / full for the same tokens (App. B.3)."""

    tokens: int
    high_bytes: int
    low_bytes: int
    scale_bytes: int
    full_bytes: int
    peak_bytes: int
    sinks: int
    window: int
    prompt_tokens: int = 0  # the turn's prompt: positions before its first generated token
    prompt_bytes: int = 0  # live payload of those positions
    prompt_full_bytes: int = 0

    @property
    def live_bytes(self) -> int:
        return self.high_bytes + self.low_bytes + self.scale_bytes

    @property
    def measured_b_prompt(self) -> float:
        """The prompt's share of Full KV kept (the paper's realized B_P)."""
        return self.prompt_bytes / self.prompt_full_bytes if self.prompt_full_bytes else 0.0

    @property
    def measured_b_answer(self) -> float:
        """The generated tokens' share of Full KV kept (the paper's realized B_D)."""
        full = self.full_bytes - self.prompt_full_bytes
        return (self.live_bytes - self.prompt_bytes) / full if full > 0 else 0.0

    @property
    def measured_b(self) -> float:
        return self.live_bytes / self.full_bytes if self.full_bytes else 0.0

    def as_dict(self) -> dict[str, int | float]:
        return {
            "tokens": self.tokens,
            "high_bytes": self.high_bytes,
            "low_bytes": self.low_bytes,
            "scale_bytes": self.scale_bytes,
            "full_bytes": self.full_bytes,
            "measured_b": round(self.measured_b, 6),
            "peak_bytes": self.peak_bytes,
            "sinks": self.sinks,
            "window": self.window,
            "prompt_tokens": self.prompt_tokens,
            "prompt_bytes": self.prompt_bytes,
            "prompt_full_bytes": self.prompt_full_bytes,
        }
