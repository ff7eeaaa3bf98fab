"""The mixed-precision KV store: per layer a BF16 pool, a packed-INT4 pool, slot maps and positions.

Every token of every layer lives in exactly one of three states: high (a BF16 row pair in the
high pool), low (two packed INT4 rows plus their FP16 scales in the low pool) or released
(nothing). Layers of one layer group share actions, so they share one slot allocator and one
slot map per sequence, but each layer keeps its own tensors (paper App. B.2).

Life of a token (App. B.2, B.6): the first ``sinks`` tokens stay high forever; every other token
stays high while it is inside the recent window of ``window`` tokens, then the action scheduled
for it (per layer group) executes: ``H`` keeps it, ``L`` quantizes it into the low pool and
frees its high slot, ``R`` frees it. A token that is already outside the window when its own
chunk ends (most of a long prefill chunk) is written straight into that form: quantized, or
never stored. The chunk's queries still read the chunk's own full-precision K/V, so the step's
outputs are the same, and a request's peak is what it keeps plus its window, not its prompt at
BF16. The step's high-water mark is right after ``begin_step`` allocates: settling frees high
slots before it takes low ones.
Freed slots go back to a free list and are reused by the next tokens, so storage is reclaimed,
never masked. Keys are stored after RoPE, with their absolute positions, so attention over the
gaps left by released tokens stays correct.

The store is batch-first: a step writes chunks for several sequences at once (packed into one
``[T]`` token axis) and attention reads each sequence's own slots.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from pask_agent.errors import KVStoreError
from pask_agent.kernels.attention import PoolView, mixed_attention
from pask_agent.kernels.int4 import quantize_int4
from pask_agent.policy.actions import Action
from pask_agent.runtime.key_scores import KeyScoreBook
from pask_agent.runtime.kv_layout import GroupWrite, KVLayout, KVReport, StepBatch, StoreConfig
from pask_agent.runtime.slots import SlotAllocator, SlotMap, audit_slots

_KEEP = (Action.H, Action.H, Action.H)

__all__ = ["GroupWrite", "KVLayout", "KVReport", "KVStore", "StepBatch", "StoreConfig"]


@dataclass
class _Sequence:
    length: int = 0  # logical length: tokens written so far (absolute position of the next one)
    settled: int = 0  # tokens below this position have had their scheduled action executed
    high: list[SlotMap] = field(default_factory=list)  # per group
    low: list[SlotMap] = field(default_factory=list)
    pending: dict[int, tuple[Action, ...]] = field(default_factory=dict)
    peak_bytes: int = 0


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
        self.key_scores = KeyScoreBook()
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
        self.key_scores.drop(seq_id)

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
        """Allocate each new token's storage in its settled form and snapshot what it attends to.

        Tokens still inside the recent window after this step (and sinks) get high slots;
        the others get what their scheduled action says, per group: a low slot, or nothing.
        """
        if not chunks:
            raise KVStoreError("a step needs at least one (sequence, new token count) pair")
        offsets, positions = [0], []
        for seq_id, n in chunks:
            if n < 1:
                raise KVStoreError(f"sequence {seq_id!r}: a chunk needs at least one token")
            seq = self._get(seq_id)
            positions.extend(range(seq.length, seq.length + n))
            offsets.append(offsets[-1] + n)
        highs = tuple(self._view(chunks, g, high=True) for g in range(3))
        lows = tuple(self._view(chunks, g, high=False) for g in range(3))
        rows: list[tuple[list[int], list[int]]] = [([], []) for _ in range(3)]
        sinks, window = self.config.sinks, self.config.window
        for (seq_id, n), first in zip(chunks, offsets, strict=False):
            seq = self._seqs[seq_id]
            stop = seq.length + n - window  # below this a token has left the window by step's end
            for j in range(n):
                p = seq.length + j
                acts = seq.pending.pop(p, _KEEP) if sinks <= p < stop else _KEEP
                for g in range(3):
                    if acts[g] == Action.H:
                        rows[g][0].append(first + j)
                    elif acts[g] == Action.L:
                        rows[g][1].append(first + j)
        writes = tuple(self._place(g, chunks, positions, *rows[g]) for g in range(3))
        for seq_id, n in chunks:
            self._seqs[seq_id].length += n
        self._note_peak(chunks)
        batch = StepBatch(
            seq_ids=tuple(s for s, _ in chunks),
            q_offsets=torch.tensor(offsets, dtype=torch.int64),
            positions=torch.tensor(positions, dtype=torch.int64, device=self.device),
            writes=writes,
            high=highs,
            low=lows,
            want_scores=want_scores,
        )
        if want_scores:
            self.key_scores.begin_step({s: self._seqs[s].length for s in batch.seq_ids})
        return batch

    def _place(
        self,
        g: int,
        chunks: Sequence[tuple[str, int]],
        positions: list[int],
        high_rows: list[int],
        low_rows: list[int],
    ) -> GroupWrite:
        """Take slots for one group's new rows and enter them in their sequences' slot maps."""
        owner = [self._seqs[seq_id] for seq_id, n in chunks for _ in range(n)]
        out = []
        for rows, alloc, grow, high in (
            (high_rows, self._high_alloc[g], self._ensure_high_capacity, True),
            (low_rows, self._low_alloc[g], self._ensure_low_capacity, False),
        ):
            slots, cap = alloc.take(len(rows))
            grow(g, cap)
            for r, slot in zip(rows, slots, strict=True):
                (owner[r].high if high else owner[r].low)[g].add(positions[r], slot)
            out.append(torch.tensor(slots, dtype=torch.int64, device=self.device))
        every = len(high_rows) == len(positions)
        return GroupWrite(
            None if every else torch.tensor(high_rows, dtype=torch.int64, device=self.device),
            out[0],
            torch.tensor(low_rows, dtype=torch.int64, device=self.device),
            out[1],
        )

    def write(self, layer: int, step: StepBatch, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store this step's K/V rows ``[T, Hkv, D]`` of one layer: high rows at BF16, rows that
        settle in this step straight into INT4 (from their BF16 values, exactly as a later
        demotion would quantize them), released rows nowhere."""
        put = step.writes[self._group_of_layer[layer]]
        k, v = k.to(self.config.high_dtype), v.to(self.config.high_dtype)
        for x, pool in ((k, self.high_k), (v, self.high_v)):
            rows = x if put.high_rows is None else x.index_select(0, put.high_rows)
            pool[layer].index_copy_(0, put.high_slots, rows)
        if put.low_rows.numel():
            for x, codes, scales in ((k, self.low_k, self.low_ks), (v, self.low_v, self.low_vs)):
                c, sc = quantize_int4(x.index_select(0, put.low_rows))
                codes[layer].index_copy_(0, put.low_slots, c)
                scales[layer].index_copy_(0, put.low_slots, sc)

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
            self.key_scores.add(
                g, step.seq_ids, step.high[g], step.low[g], step.q_offsets, step.positions, scores
            )
            return out
        return result

    def token_scores(self, seq_id: str, group: int, *, latest_step: bool = False) -> torch.Tensor:
        """``[length]`` attention mass each position received (all steps, or the last one)."""
        length = self._get(seq_id).length
        return self.key_scores.scores(seq_id, group, length, latest_step=latest_step)

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

    def end_step(self, step: StepBatch) -> None:
        """Execute the scheduled actions of tokens written before this step that left the
        recent window in it (this step's own tokens were placed by ``begin_step``)."""
        if step.want_scores:
            self.key_scores.end_step(step.seq_ids)
        s, w = self.config.sinks, self.config.window
        counts = step.q_offsets.diff().tolist()
        for seq_id, n in zip(step.seq_ids, counts, strict=True):
            seq = self._seqs[seq_id]
            start, stop = max(seq.settled, s), seq.length - w
            if stop <= start:
                continue
            due = [(p, seq.pending.pop(p, _KEEP)) for p in range(start, min(stop, seq.length - n))]
            seq.settled = stop
            for g in range(3):
                low, gone = ([p for p, a in due if a[g] == x] for x in (Action.L, Action.R))
                self._apply_group(seq, g, low, gone)

    def _apply_group(
        self, seq: _Sequence, g: int, to_low: list[int], to_release: list[int]
    ) -> None:
        # Quantize first, free the high slots, then take low ones: the live bytes never rise
        # above what they were before the migration (the codes are scratch in between).
        if to_low:
            high_slots = [seq.high[g].remove(p) for p in to_low]
            src = torch.tensor(high_slots, dtype=torch.int64, device=self.device)
            coded = [
                (layer, quantize_int4(self.high_k[layer].index_select(0, src)),
                 quantize_int4(self.high_v[layer].index_select(0, src)))
                for layer in self.groups.layers_of(g)
            ]  # fmt: skip
            self._high_alloc[g].give(high_slots)
            low_slots, cap = self._low_alloc[g].take(len(to_low))
            self._ensure_low_capacity(g, cap)
            dst = torch.tensor(low_slots, dtype=torch.int64, device=self.device)
            for layer, (kc, ks), (vc, vs) in coded:
                self.low_k[layer].index_copy_(0, dst, kc)
                self.low_ks[layer].index_copy_(0, dst, ks)
                self.low_v[layer].index_copy_(0, dst, vc)
                self.low_vs[layer].index_copy_(0, dst, vs)
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
        fills = ((self.low_k, 0.0), (self.low_v, 0.0), (self.low_ks, 1.0), (self.low_vs, 1.0))
        for layer in self.groups.layers_of(g):
            for pools, fill in fills:
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
                maps = [(seq.high if kind == "high" else seq.low)[g] for seq in self._seqs.values()]
                audit_slots(f"{kind} pool, group {g}", alloc, [s for m in maps for s in m.slots])

    def allocated_bytes(self) -> int:
        """Bytes of the pool tensors themselves (capacity, including free slots)."""
        pools = (self.high_k, self.high_v, self.low_k, self.low_v, self.low_ks, self.low_vs)
        return sum(t.numel() * t.element_size() for layers in pools for t in layers)

    def report(self, seq_id: str) -> KVReport:
        seq = self._get(seq_id)
        high, low, scales = self._seq_bytes(seq)
        full = seq.length * self.layout.num_layers * self.layout.high_row_bytes
        cfg = self.config
        return KVReport(seq.length, high, low, scales, full, seq.peak_bytes, cfg.sinks, cfg.window)


def _grow(t: torch.Tensor, cap: int, fill: float) -> torch.Tensor:
    if t.shape[0] >= cap:
        return t
    extra = torch.full((cap - t.shape[0], *t.shape[1:]), fill, dtype=t.dtype, device=t.device)
    return torch.cat([t, extra])
