"""Payload cost model ``m(a, c)``: bytes one token costs in layer group ``c`` under action ``a``.

Paper App. B.3: for a layer group ``c`` with layers ``ℓ``, ``n_c = 2 Σ_ℓ H_kv,ℓ d_ℓ`` elements
per token (K and V) and ``k_c = 2 Σ_ℓ H_kv,ℓ`` scale rows per token. The byte conventions here
match the store's pools (App. B.5):

- ``H``: BF16, ``2 · n_c`` bytes.
- ``L``: every (layer, K/V, KV head) row packs two signed nibbles per byte, so ``ceil(d / 2)``
  bytes (odd ``d`` pads one nibble), plus one FP16 scale (2 bytes) per row.
- ``R``: 0 bytes (the entry is released once it leaves the recent window).

``C_full = Σ_c m(H, c)`` is the Full-KV cost of one token and the unit budgets are measured in.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from pask_agent.errors import ConfigError
from pask_agent.policy.actions import Action, LayerGroups

_BF16_BYTES = 2
_SCALE_BYTES = 2  # one FP16 scale per (token, layer, K/V, KV head) row


@dataclass(frozen=True, slots=True)
class PayloadCosts:
    """Per-group payload bytes per token for each action (App. B.3).

    Attributes
    ----------
    groups:
        The layer groups the costs are computed for.
    bytes_by_group:
        ``bytes_by_group[c][a]`` is ``m(a, c)`` in bytes, indexed by ``int(Action)``.
    elements_by_group:
        ``n_c`` (K and V elements per token) for each group.
    scale_rows_by_group:
        ``k_c`` (INT4 scale rows per token) for each group.
    """

    groups: LayerGroups
    bytes_by_group: tuple[tuple[int, int, int], ...]
    elements_by_group: tuple[int, ...]
    scale_rows_by_group: tuple[int, ...]

    @classmethod
    def from_dims(cls, num_layers: int, num_kv_heads: int, head_dim: int) -> PayloadCosts:
        """Costs for a model whose layers all have ``num_kv_heads`` heads of size ``head_dim``.

        Raises
        ------
        ConfigError
            A dimension is not a positive integer or there are fewer than 3 layers.
        """
        return cls.from_layer_dims(num_layers, [(num_kv_heads, head_dim)] * max(num_layers, 0))

    @classmethod
    def from_layer_dims(
        cls, num_layers: int, layer_dims: list[tuple[int, int]] | tuple[tuple[int, int], ...]
    ) -> PayloadCosts:
        """Costs from per-layer ``(num_kv_heads, head_dim)``; groups use each layer's own dims."""
        if num_layers < 3:
            raise ConfigError(f"need at least 3 layers to form 3 layer groups, got {num_layers}")
        if len(layer_dims) != num_layers:
            raise ConfigError(f"got dims for {len(layer_dims)} layers, expected {num_layers}")
        for layer, (heads, dim) in enumerate(layer_dims):
            if heads < 1 or dim < 1:
                raise ConfigError(
                    f"layer {layer}: num_kv_heads={heads} and head_dim={dim} must both be >= 1"
                )
        groups = LayerGroups.for_layers(num_layers)
        table: list[tuple[int, int, int]] = []
        elements: list[int] = []
        scale_rows: list[int] = []
        for c in range(groups.count):
            n_c = k_c = low = 0
            for layer in groups.layers_of(c):
                heads, dim = layer_dims[layer]
                n_c += 2 * heads * dim
                k_c += 2 * heads
                low += 2 * heads * ((dim + 1) // 2 + _SCALE_BYTES)
            table.append((0, low, _BF16_BYTES * n_c))
            elements.append(n_c)
            scale_rows.append(k_c)
        return cls(groups, tuple(table), tuple(elements), tuple(scale_rows))

    @property
    def num_groups(self) -> int:
        return len(self.bytes_by_group)

    @property
    def full_bytes_per_token(self) -> int:
        """``C_full``: bytes of one token's K and V in BF16 over all layers."""
        return sum(row[Action.H] for row in self.bytes_by_group)

    @property
    def int4_share(self) -> Fraction:
        """What storing every token INT4 costs, as a share of BF16 (App. B.5: 4-bit codes plus
        FP16 scales; 0.266 at head dim 64): the least a plan keeps without releasing."""
        low = sum(row[Action.L] for row in self.bytes_by_group)
        return Fraction(low, self.full_bytes_per_token)

    def cost(self, action: Action, group: int) -> int:
        """``m(action, group)`` in bytes per token."""
        return self.bytes_by_group[group][action]

    def token_cost(self, actions: tuple[Action, ...] | list[Action]) -> int:
        """``M(a) = Σ_c m(a_c, c)`` for one token's action vector."""
        return sum(self.bytes_by_group[c][a] for c, a in enumerate(actions))
