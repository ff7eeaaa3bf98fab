"""The three persistence actions and the layer groups they apply to (paper App. A.2, B.2).

Actions are ordered by how much they keep: ``R < L < H``. ``max`` over that order is how a
protection floor is enforced (``a = max(a0, a_floor)``) and how cross-boundary tokens get the
conservative combination of their candidate actions.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Action(enum.IntEnum):
    """Keep in high precision (H), keep packed INT4 (L), or release (R)."""

    R = 0
    L = 1
    H = 2

    @classmethod
    def parse(cls, text: str) -> Action:
        try:
            return cls[text.strip().upper()]
        except KeyError as exc:
            raise ValueError(f"unknown action {text!r}; expected one of H, L, R") from exc


@dataclass(frozen=True, slots=True)
class LayerGroups:
    """Lower / middle / upper layer groups: ``[0, b1)``, ``[b1, b2)``, ``[b2, L)``.

    ``b1 = floor((L + 2) / 3)`` and ``b2 = floor((2L + 2) / 3)`` (App. A.2). Layers in one group
    share actions but keep their own tensors.
    """

    num_layers: int
    b1: int
    b2: int

    @classmethod
    def for_layers(cls, num_layers: int) -> LayerGroups:
        if num_layers < 3:
            raise ValueError(f"need at least 3 layers to form 3 layer groups, got {num_layers}")
        return cls(num_layers, (num_layers + 2) // 3, (2 * num_layers + 2) // 3)

    @property
    def count(self) -> int:
        return 3

    def group_of(self, layer: int) -> int:
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} outside [0, {self.num_layers})")
        return 0 if layer < self.b1 else (1 if layer < self.b2 else 2)

    def layers_of(self, group: int) -> range:
        bounds = (0, self.b1, self.b2, self.num_layers)
        return range(bounds[group], bounds[group + 1])
