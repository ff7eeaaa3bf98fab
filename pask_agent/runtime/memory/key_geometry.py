"""Unit keys per stored position, for the baselines that rank tokens by key geometry (KeyDiff,
R-KV): how similar a token's key is to the others.

Both methods compare a key with the *mean* of the cache's unit keys: KeyDiff keeps the keys
least like that anchor; R-KV's redundancy is a key's mean cosine similarity to every other key,
which is ``(n · k̂_i · ū − 1) / (n − 1)`` with ``ū`` the mean unit key, so one dot product per
position and head gives either, with no ``n × n`` matrix. The book keeps each tracked
sequence's unit keys (FP16, as the attention saw them: before the store's key centering, after
RoPE) until the sequence goes; only sequences whose policy sets ``needs_keys`` are tracked, so
nothing else pays for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from pask_agent.policy.actions import LayerGroups

_STORE = torch.float16


class KeyGeometryBook:
    """Per tracked sequence and layer: ``[capacity, Hkv, D]`` unit keys by absolute position."""

    def __init__(self, groups: LayerGroups, num_layers: int) -> None:
        self.groups = groups
        self.num_layers = num_layers
        self._keys: dict[str, list[torch.Tensor]] = {}
        self._length: dict[str, int] = {}

    def track(self, seq_id: str) -> None:
        self._keys[seq_id] = [torch.zeros(0) for _ in range(self.num_layers)]
        self._length[seq_id] = 0

    def tracks_any(self, seq_ids: tuple[str, ...]) -> bool:
        return bool(self._keys) and any(s in self._keys for s in seq_ids)

    def add(
        self, layer: int, seq_ids: tuple[str, ...], q_offsets: list[int], positions: torch.Tensor,
        k: torch.Tensor,
    ) -> None:  # fmt: skip
        """Keep the unit keys of one layer's new rows ``[T, Hkv, D]`` of the tracked sequences."""
        for b, seq_id in enumerate(seq_ids):
            if seq_id not in self._keys:
                continue
            lo, hi = q_offsets[b], q_offsets[b + 1]
            pos = positions[lo:hi].cpu()
            unit = torch.nn.functional.normalize(k[lo:hi].float(), dim=-1).to(_STORE).cpu()
            rows = self._keys[seq_id]
            end = int(pos.max()) + 1
            held = rows[layer].shape[0]
            if held < end:
                grown = torch.zeros((max(end, 2 * held), *unit.shape[1:]), dtype=_STORE)
                if held:
                    grown[:held] = rows[layer]
                rows[layer] = grown
            rows[layer][pos] = unit
            if layer == self.num_layers - 1:
                self._length[seq_id] = max(self._length[seq_id], end)

    def truncate(self, seq_id: str, length: int) -> None:
        if seq_id in self._length:
            self._length[seq_id] = min(self._length[seq_id], length)

    def copy(self, src_id: str, dst_id: str) -> None:
        if src_id in self._keys:
            self._keys[dst_id] = [t.clone() for t in self._keys[src_id]]
            self._length[dst_id] = self._length[src_id]

    def drop(self, seq_id: str) -> None:
        self._keys.pop(seq_id, None)
        self._length.pop(seq_id, None)

    def view(self, seq_id: str, length: int) -> StoredKeyGeometry:
        """The first ``length`` positions' keys, read only when a policy asks."""
        return StoredKeyGeometry(self, seq_id, min(length, self._length.get(seq_id, 0)))

    def to_mean(
        self, seq_id: str, length: int, group: int, upto: int
    ) -> tuple[np.ndarray, np.ndarray]:
        keys = self._keys.get(seq_id)
        upto = min(upto, length)
        if keys is None or upto <= 0:
            return np.zeros((length, 0)), np.zeros(0)
        unit = torch.cat([keys[i][:length] for i in self.groups.layers_of(group)], dim=1).float()
        mean = unit[:upto].mean(dim=0)  # [m, D]
        dots = torch.einsum("nmd,md->nm", unit, mean)
        return dots.double().numpy(), mean.norm(dim=-1).double().numpy()


@dataclass(frozen=True)
class StoredKeyGeometry:
    """``policy.base.KeyGeometry`` over one sequence's first ``length`` positions."""

    book: KeyGeometryBook
    seq_id: str
    length: int

    def to_mean(self, group: int, upto: int) -> tuple[np.ndarray, np.ndarray]:
        return self.book.to_mean(self.seq_id, self.length, group, upto)
