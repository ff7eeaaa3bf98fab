"""The mixed-precision KV store: per layer a BF16 pool, a packed-INT4 pool, slot maps and positions.

Every token of every layer lives in exactly one of three states: high (a BF16 row pair in the
high pool), low (two packed INT4 rows plus their FP16 scales in the low pool) or released
(nothing). Layers of one layer group share actions, so they share one slot allocator and one
slot map per sequence, but each layer keeps its own tensors (paper App. B.2).

Life of a token (App. B.2, B.6): it enters the high pool when its chunk is written; the first
``sinks`` tokens stay high forever; every other token stays high while it is inside the recent
window of ``window`` tokens, then the action scheduled for it (per layer group) executes:
``H`` keeps it, ``L`` quantizes it into the low pool and frees its high slot, ``R`` frees it.
Freed slots go back to a free list and are reused by the next tokens, so storage is reclaimed,
never masked. Keys are stored after RoPE, with their absolute positions, so attention over the
gaps left by released tokens stays correct.

The store is batch-first: a step writes chunks for several sequences at once (packed into one
``[T]`` token axis) and attention reads each sequence's own slots.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from pask_agent.errors import KVStoreError
from pask_agent.kernels.attention import KeyScores, PoolView, mixed_attention
from pask_agent.kernels.int4 import quantize_int4
from pask_agent.policy.actions import Action
from pask_agent.runtime.kv_layout import KVLayout, KVReport, StoreConfig
from pask_agent.runtime.slots import SlotAllocator, SlotMap

__all__ = ["KVLayout", "KVReport", "KVStore", "StepBatch", "StoreConfig"]


@dataclass
class _Sequence:
    length: int = 0  # logical length: tokens written so far (absolute position of the next one)
    settled: int = 0  # tokens below this position have had their scheduled action executed
    high: list[SlotMap] = field(default_factory=list)  # per group
    low: list[SlotMap] = field(default_factory=list)
    pending: dict[int, tuple[Action, ...]] = field(default_factory=dict)
    peak_bytes: int = 0
    # attention mass per position and group: all steps so far, and the latest step alone
    scores: list[torch.Tensor] = field(default_factory=list)
    step_scores: list[torch.Tensor] = field(default_factory=list)


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
    new_slots: tuple[torch.Tensor, ...]  # per group: [T] int64 high slots of the new tokens
    high: tuple[PoolView, ...]  # per group
    low: tuple[PoolView, ...]  # per group
    want_scores: bool = False

    @property
    def num_tokens(self) -> int:
        return int(self.positions.numel())

    def last_token_rows(self) -> torch.Tensor:
        """[B] row of each sequence's last token in the packed axis (where logits are needed)."""
        return self.q_offsets[1:] - 1


class KVStore:
    """Per-layer BF16 + INT4 pools for many sequences, with exact byte accounting.

    Parameters
    ----------
    layout:
        The model's KV shape (``KVLayout.from_config(model.config)``).
    config:
        Sink and window protection and the high pool's storage dtype.
    device:
        Where the pools live. On CPU attention uses the torch reference kernels.
    """

    def __init__(
        self,
        layout: KVLayout,
        config: StoreConfig | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.layout = layout
        self.config = config or StoreConfig()
        self.device = torch.device(device)
        self.groups = layout.groups
        self._group_of_layer = [self.groups.group_of(i) for i in range(layout.num_layers)]
        cap = self.config.initial_capacity
        h, d, dp = layout.num_kv_heads, layout.head_dim, (layout.head_dim + 1) // 2
        self._high_alloc = [SlotAllocator(cap) for _ in range(3)]
        self._low_alloc = [SlotAllocator(cap) for _ in range(3)]
        kw = {"device": self.device}
        self.high_k = [
            torch.zeros(cap, h, d, dtype=self.config.high_dtype, **kw)
            for _ in range(layout.num_layers)
        ]
        self.high_v = [torch.zeros_like(t) for t in self.high_k]
        self.low_k = [
            torch.zeros(cap, h, dp, dtype=torch.uint8, **kw) for _ in range(layout.num_layers)
        ]
        self.low_v = [torch.zeros_like(t) for t in self.low_k]
        self.low_ks = [
            torch.ones(cap, h, 1, dtype=torch.float16, **kw) for _ in range(layout.num_layers)
        ]
        self.low_vs = [torch.ones_like(t) for t in self.low_ks]
        self._seqs: dict[str, _Sequence] = {}
        self.peak_bytes = 0

    # ----------------------------------------------------------------- sequences
    def add_sequence(self, seq_id: str) -> None:
        if seq_id in self._seqs:
            raise KVStoreError(f"sequence {seq_id!r} already exists in the store")
        self._seqs[seq_id] = _Sequence(
            high=[SlotMap() for _ in range(3)], low=[SlotMap() for _ in range(3)]
        )

    def remove_sequence(self, seq_id: str) -> None:
        """Free every slot of a sequence at once (finished or cancelled requests)."""
        seq = self._get(seq_id)
        for g in range(3):
            self._high_alloc[g].give(seq.high[g].slots)
            self._low_alloc[g].give(seq.low[g].slots)
        del self._seqs[seq_id]

    def truncate(self, seq_id: str, length: int) -> None:
        """Drop every token at position >= ``length`` (a conversation turn that diverged)."""
        seq = self._get(seq_id)
        if not 0 <= length <= seq.length:
            raise KVStoreError(f"cannot truncate {seq_id!r} of length {seq.length} to {length}")
        for g in range(3):
            for maps, alloc in ((seq.high, self._high_alloc), (seq.low, self._low_alloc)):
                gone = [p for p in range(length, seq.length) if p in maps[g].index]
                alloc[g].give([maps[g].remove(p) for p in gone])
        for p in [p for p in seq.pending if p >= length]:
            del seq.pending[p]
        seq.length = length
        seq.settled = min(seq.settled, length)

    def has_sequence(self, seq_id: str) -> bool:
        return seq_id in self._seqs

    @property
    def num_sequences(self) -> int:
        """Sequences in the store now (requests in flight plus kept conversations)."""
        return len(self._seqs)

    def length(self, seq_id: str) -> int:
        return self._get(seq_id).length

    def _get(self, seq_id: str) -> _Sequence:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise KVStoreError(f"unknown sequence {seq_id!r}; call add_sequence first") from None

    # ----------------------------------------------------------------- scheduling
    def schedule(self, seq_id: str, position: int, actions: Sequence[Action]) -> None:
        """Record the per-group actions a token gets when it leaves the recent window."""
        if len(actions) != 3:
            raise KVStoreError(f"need one action per layer group (3), got {len(actions)}")
        seq = self._get(seq_id)
        if position < seq.settled:
            raise KVStoreError(f"token {position} of {seq_id!r} already left the window")
        seq.pending[position] = tuple(actions)

    def schedule_many(self, seq_id: str, start: int, actions: Sequence[Sequence[Action]]) -> None:
        for i, acts in enumerate(actions):
            self.schedule(seq_id, start + i, acts)

    # ----------------------------------------------------------------- one step
    def begin_step(
        self, chunks: Sequence[tuple[str, int]], *, want_scores: bool = False
    ) -> StepBatch:
        """Allocate high slots for each sequence's new tokens and snapshot what they attend to."""
        if not chunks:
            raise KVStoreError("a step needs at least one (sequence, new token count) pair")
        offsets, positions = [0], []
        for seq_id, n in chunks:
            if n < 1:
                raise KVStoreError(f"sequence {seq_id!r}: a chunk needs at least one token")
            seq = self._get(seq_id)
            positions.extend(range(seq.length, seq.length + n))
            offsets.append(offsets[-1] + n)
        highs, lows, new_slots = [], [], []
        for g in range(3):
            highs.append(self._view(chunks, g, high=True))
            lows.append(self._view(chunks, g, high=False))
            slots, cap = self._high_alloc[g].take(offsets[-1])
            self._ensure_high_capacity(g, cap)
            new_slots.append(torch.tensor(slots, dtype=torch.int64, device=self.device))
            i = 0
            for seq_id, n in chunks:
                seq = self._seqs[seq_id]
                for j in range(n):
                    seq.high[g].add(seq.length + j, slots[i + j])
                i += n
        for seq_id, n in chunks:
            self._seqs[seq_id].length += n
        self._note_peak(chunks)
        batch = StepBatch(
            seq_ids=tuple(s for s, _ in chunks),
            q_offsets=torch.tensor(offsets, dtype=torch.int64),
            positions=torch.tensor(positions, dtype=torch.int64, device=self.device),
            new_slots=tuple(new_slots),
            high=tuple(highs),
            low=tuple(lows),
            want_scores=want_scores,
        )
        if want_scores:
            self._reset_step_scores(batch)
        return batch

    def write(self, layer: int, step: StepBatch, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store this step's K/V rows ``[T, Hkv, D]`` of one layer in its high pool."""
        slots = step.new_slots[self._group_of_layer[layer]]
        self.high_k[layer].index_copy_(0, slots, k.to(self.config.high_dtype))
        self.high_v[layer].index_copy_(0, slots, v.to(self.config.high_dtype))

    def attend(
        self,
        layer: int,
        step: StepBatch,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        scale: float,
    ) -> torch.Tensor:
        """Attention of this step's queries ``[T, Hq, D]`` over stored keys ∪ this chunk."""
        g = self._group_of_layer[layer]
        result = mixed_attention(
            q,
            step.q_offsets,
            step.positions,
            k,
            v,
            self.high_k[layer],
            self.high_v[layer],
            step.high[g],
            self.low_k[layer],
            self.low_v[layer],
            self.low_ks[layer],
            self.low_vs[layer],
            step.low[g],
            scale=scale,
            return_key_scores=step.want_scores,
        )
        if step.want_scores:
            out, scores = result
            self._accumulate(g, step, scores)
            return out
        return result

    def _accumulate(self, g: int, step: StepBatch, scores: KeyScores) -> None:
        """Add one layer's attention mass per key (summed over KV heads) to each sequence."""
        parts = (
            (scores.high.sum(-1), step.high[g].positions, step.high[g].offsets.tolist()),
            (scores.low.sum(-1), step.low[g].positions, step.low[g].offsets.tolist()),
            (scores.cur.sum(-1), step.positions, step.q_offsets.tolist()),
        )
        for b, seq_id in enumerate(step.seq_ids):
            seq = self._seqs[seq_id]
            acc = seq.step_scores[g]
            for mass, positions, offsets in parts:
                lo, hi = offsets[b], offsets[b + 1]
                if hi > lo:
                    acc.index_add_(0, positions[lo:hi], mass[lo:hi].to(acc.device))

    def _reset_step_scores(self, step: StepBatch) -> None:
        for seq_id in step.seq_ids:
            seq = self._seqs[seq_id]
            for g in range(3):
                if len(seq.scores) <= g:
                    seq.scores.append(torch.zeros(0))
                    seq.step_scores.append(torch.zeros(0))
                if seq.scores[g].numel() < seq.length:
                    seq.scores[g] = _grow(
                        seq.scores[g], max(seq.length, 2 * seq.scores[g].numel()), 0.0
                    )
                seq.step_scores[g] = torch.zeros(seq.scores[g].numel())

    def token_scores(self, seq_id: str, group: int, *, latest_step: bool = False) -> torch.Tensor:
        """``[length]`` attention mass each position received (all steps, or the last one)."""
        seq = self._get(seq_id)
        if not seq.scores:
            return torch.zeros(seq.length)
        src = seq.step_scores if latest_step else seq.scores
        return src[group][: seq.length]

    def retained(self, seq_id: str, group: int) -> tuple[list[int], list[int]]:
        """Positions held high and held low in one group (unordered)."""
        seq = self._get(seq_id)
        return list(seq.high[group].positions), list(seq.low[group].positions)

    def settled(self, seq_id: str) -> int:
        """Tokens below this position have left the recent window (sinks excepted)."""
        return self._get(seq_id).settled

    def demote(self, seq_id: str, group: int, positions: Sequence[int], action: Action) -> None:
        """Late demotion of settled tokens: H→L, H→R or L→R (promotion is impossible, B.2).

        Sinks and tokens still inside the recent window are protected and refused.
        """
        seq = self._get(seq_id)
        bad = [p for p in positions if p < self.config.sinks or p >= seq.settled]
        if bad:
            raise KVStoreError(f"positions {bad[:5]} are sinks or inside the recent window")
        if action == Action.L:
            missing = [p for p in positions if p not in seq.high[group].index]
            if missing:
                raise KVStoreError(f"positions {missing[:5]} are not held high; cannot quantize")
            self._apply_group(seq, group, list(positions), [])
        elif action == Action.R:
            in_high = [p for p in positions if p in seq.high[group].index]
            in_low = [p for p in positions if p in seq.low[group].index]
            self._apply_group(seq, group, [], in_high)
            self._low_alloc[group].give([seq.low[group].remove(p) for p in in_low])
        else:
            raise KVStoreError("demote takes L or R; nothing can be promoted back to H")

    def end_step(self, step: StepBatch, *, hold: frozenset[str] = frozenset()) -> None:
        """Execute the scheduled actions of tokens that left the recent window this step.

        Sequences in ``hold`` (prompts still being prefilled in chunks) keep everything high
        for now: the prefill plan is materialized after a high-precision prefill (§3.6).
        """
        if step.want_scores:
            for seq_id in step.seq_ids:
                seq = self._seqs[seq_id]
                for g in range(3):
                    seq.scores[g] += seq.step_scores[g]
        s, w = self.config.sinks, self.config.window
        for seq_id in step.seq_ids:
            if seq_id in hold:
                continue
            seq = self._seqs[seq_id]
            start, stop = max(seq.settled, s), seq.length - w
            if stop <= start:
                continue
            due = [(p, seq.pending.pop(p, (Action.H,) * 3)) for p in range(start, stop)]
            seq.settled = stop
            for g in range(3):
                self._apply_group(
                    seq,
                    g,
                    [p for p, a in due if a[g] == Action.L],
                    [p for p, a in due if a[g] == Action.R],
                )

    def _apply_group(
        self, seq: _Sequence, g: int, to_low: list[int], to_release: list[int]
    ) -> None:
        if to_low:
            high_slots = [seq.high[g].remove(p) for p in to_low]
            low_slots, cap = self._low_alloc[g].take(len(to_low))
            self._ensure_low_capacity(g, cap)
            src = torch.tensor(high_slots, dtype=torch.int64, device=self.device)
            dst = torch.tensor(low_slots, dtype=torch.int64, device=self.device)
            for layer in self.groups.layers_of(g):
                for pool, codes, scales in (
                    (self.high_k, self.low_k, self.low_ks),
                    (self.high_v, self.low_v, self.low_vs),
                ):
                    c, sc = quantize_int4(pool[layer].index_select(0, src))
                    codes[layer].index_copy_(0, dst, c)
                    scales[layer].index_copy_(0, dst, sc)
            self._high_alloc[g].give(high_slots)
            for p, slot in zip(to_low, low_slots, strict=True):
                seq.low[g].add(p, slot)
        if to_release:
            self._high_alloc[g].give([seq.high[g].remove(p) for p in to_release])

    # ----------------------------------------------------------------- storage growth
    def _ensure_high_capacity(self, g: int, cap: int) -> None:
        for layer in self.groups.layers_of(g):
            for pools in (self.high_k, self.high_v):
                pools[layer] = _grow(pools[layer], cap, 0.0)

    def _ensure_low_capacity(self, g: int, cap: int) -> None:
        for layer in self.groups.layers_of(g):
            for pools, fill in (
                (self.low_k, 0),
                (self.low_v, 0),
                (self.low_ks, 1.0),
                (self.low_vs, 1.0),
            ):
                pools[layer] = _grow(pools[layer], cap, fill)

    def _view(self, chunks: Sequence[tuple[str, int]], g: int, *, high: bool) -> PoolView:
        slots: list[int] = []
        positions: list[int] = []
        offsets = [0]
        for seq_id, _ in chunks:
            m = (self._seqs[seq_id].high if high else self._seqs[seq_id].low)[g]
            slots.extend(m.slots)
            positions.extend(m.positions)
            offsets.append(len(slots))
        return PoolView(
            slots=torch.tensor(slots, dtype=torch.int64, device=self.device),
            offsets=torch.tensor(offsets, dtype=torch.int64),
            positions=torch.tensor(positions, dtype=torch.int64, device=self.device),
        )

    # ----------------------------------------------------------------- accounting
    def _seq_bytes(self, seq: _Sequence) -> tuple[int, int, int]:
        lay = self.layout
        high = low = 0
        for g in range(3):
            n_layers = len(self.groups.layers_of(g))
            high += len(seq.high[g].slots) * n_layers
            low += len(seq.low[g].slots) * n_layers
        return high * lay.high_row_bytes, low * lay.low_row_bytes, low * lay.scale_row_bytes

    def _note_peak(self, chunks: Sequence[tuple[str, int]]) -> None:
        for seq_id, _ in chunks:
            seq = self._seqs[seq_id]
            seq.peak_bytes = max(seq.peak_bytes, sum(self._seq_bytes(seq)))
        self.peak_bytes = max(self.peak_bytes, self.live_bytes())

    def live_bytes(self) -> int:
        """Payload bytes held by all sequences now (high + low + scales)."""
        lay, total = self.layout, 0
        for g in range(3):
            n_layers = len(self.groups.layers_of(g))
            total += self._high_alloc[g].used * n_layers * lay.high_row_bytes
            total += self._low_alloc[g].used * n_layers * (lay.low_row_bytes + lay.scale_row_bytes)
        return total

    def audit(self) -> None:
        """Check that every slot of every pool is free exactly once or held by exactly one token.

        Why: after a soak or a fuzz run, ``live_bytes() == 0`` alone would miss a slot that fell
        out of both the free list and every slot map (capacity lost for good), or one handed to
        two tokens at once (silent corruption).

        Raises
        ------
        KVStoreError
            Names the pool, group and slots that are lost, shared or out of range.
        """
        for kind, allocs in (("high", self._high_alloc), ("low", self._low_alloc)):
            for g, alloc in enumerate(allocs):
                held = [
                    s
                    for seq in self._seqs.values()
                    for s in (seq.high if kind == "high" else seq.low)[g].slots
                ]
                seen = sorted(held + alloc.free)
                if seen != list(range(alloc.capacity)) or alloc.used != len(held):
                    counts = Counter(seen)
                    lost = sorted(set(range(alloc.capacity)) - set(counts))
                    shared = sorted(
                        s for s, n in counts.items() if n > 1 or not 0 <= s < alloc.capacity
                    )
                    raise KVStoreError(
                        f"{kind} pool, group {g}: {alloc.used} slots counted used, {len(held)} "
                        f"held; lost {lost[:8]}, shared or out of range {shared[:8]}"
                    )

    def allocated_bytes(self) -> int:
        """Bytes of the pool tensors themselves (capacity, including free slots)."""
        return sum(
            t.numel() * t.element_size()
            for pools in (
                self.high_k,
                self.high_v,
                self.low_k,
                self.low_v,
                self.low_ks,
                self.low_vs,
            )
            for t in pools
        )

    def report(self, seq_id: str) -> KVReport:
        seq = self._get(seq_id)
        high, low, scales = self._seq_bytes(seq)
        full = seq.length * self.layout.num_layers * self.layout.high_row_bytes
        return KVReport(
            seq.length,
            high,
            low,
            scales,
            full,
            seq.peak_bytes,
            self.config.sinks,
            self.config.window,
        )


def _grow(t: torch.Tensor, cap: int, fill: float) -> torch.Tensor:
    if t.shape[0] >= cap:
        return t
    extra = torch.full((cap - t.shape[0], *t.shape[1:]), fill, dtype=t.dtype, device=t.device)
    return torch.cat([t, extra])
