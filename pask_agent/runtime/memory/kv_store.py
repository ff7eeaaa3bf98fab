"""The mixed-precision KV store: per layer a BF16 pool, a packed-INT4 pool, slot maps and positions.

Every token of every layer lives in exactly one of three states: high (a BF16 row pair in the
high pool), low (two packed INT4 rows plus their FP16 scales in the low pool) or released
(nothing). Layers of one layer group share actions, so they share one slot allocator and one
slot map per sequence, but each layer keeps its own tensors (paper App. B.2).

Life of a token (App. B.2, B.6): the first ``sinks`` tokens stay high forever; every other token
stays high while inside the recent ``window``, then the action scheduled for it (per layer
group) executes: ``H`` keeps it, ``L`` quantizes it into the low pool, ``R`` frees it. A token
already outside the window when its chunk ends is written straight into that form; the chunk's
queries still read its own full-precision K/V, so outputs are unchanged and a request's peak is
what it keeps plus its window, not its prompt at BF16. Freed slots are reused by the next
tokens (storage reclaimed, never masked); keys are stored after RoPE with their absolute
positions, so attention over released gaps stays correct.

The store is batch-first: a step writes chunks for several sequences at once (packed into one
``[T]`` token axis) and attention reads each sequence's own slots.

This class owns the token's life; pools, slot maps, deferred actions, byte accounting and
attention mass are their own files (``kv_pools``, ``kv_sequence``/``slots``/``kv_schedule``,
``kv_accounting``, ``key_scores``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pask_agent.errors import KVStoreError
from pask_agent.policy.actions import Action
from pask_agent.runtime.memory.key_geometry import KeyGeometryBook
from pask_agent.runtime.memory.key_scores import KeyScoreBook
from pask_agent.runtime.memory.kv_accounting import KVBytes
from pask_agent.runtime.memory.kv_layout import (
    KVLayout,
    KVReport,
    StepBatch,
    StoreConfig,
)
from pask_agent.runtime.memory.kv_pools import KVPools, PoolRows, split_rows
from pask_agent.runtime.memory.kv_sequence import StoredSequence
from pask_agent.runtime.memory.slots import audit_store, place_group, pool_view


class KVStore:
    """Per-layer BF16 + INT4 pools for many sequences, with exact byte accounting.

    Parameters
    ----------
    layout:
        The model's KV shape (``KVLayout.from_config(model.config)``).
    config:
        Sink and window protection and the high pool's storage dtype.
    device:
        Where the pools live.
    capacity_bytes:
        Bytes preallocated once for every pool (``kv_pools.py``), split evenly until the
        engine re-splits an empty store; None: ``config.rows_per_pool`` rows in each pool.
    key_offsets:
        ``[layers, kv_heads, head_dim]``: what the keys of a sequence added with
        ``centered=True`` are stored relative to (``key_offsets.py``); None: no centering.
    """

    def __init__(
        self,
        layout: KVLayout,
        config: StoreConfig | None = None,
        device: torch.device | str = "cpu",
        capacity_bytes: int | None = None,
        key_offsets: torch.Tensor | None = None,
    ) -> None:
        self.layout = layout
        self.config = config or StoreConfig()
        self.device = torch.device(device)
        self.groups = layout.groups
        self._group_of_layer = [self.groups.group_of(i) for i in range(layout.num_layers)]
        rows = split_rows(capacity_bytes, layout, (1,) * 3, (1,) * 3) if capacity_bytes else None
        rows = rows or PoolRows.even(self.config.rows_per_pool)
        self.pools = KVPools(
            layout, self.config.high_dtype, capacity_bytes, rows, self.device,
            backend=self.config.attention_backend,
        )  # fmt: skip
        self._high_alloc, self._low_alloc = self.pools.high_alloc, self.pools.low_alloc
        self.bytes = KVBytes(layout)
        self._seqs: dict[str, StoredSequence] = {}
        self.key_scores = KeyScoreBook()
        self.key_geometry = KeyGeometryBook(self.groups, layout.num_layers)
        self.peak_bytes = 0
        want, got = (layout.num_layers, layout.num_kv_heads, layout.head_dim), key_offsets
        if got is not None and tuple(got.shape) != want:
            raise KVStoreError(f"key_offsets must have shape {want}, got {tuple(got.shape)}")
        self.key_offsets = None if key_offsets is None else key_offsets.to(self.device)

    def add_sequence(
        self, seq_id: str, *, centered: bool = False, track_keys: bool = False
    ) -> None:
        """A new, empty sequence. ``centered``: store its keys minus ``key_offsets`` (for
        policies that may quantize them; attention is unchanged, ``key_offsets.py``).
        ``track_keys``: keep its unit keys for a key-geometry policy (``key_geometry.py``)."""
        if seq_id in self._seqs:
            raise KVStoreError(f"sequence {seq_id!r} already exists in the store")
        if centered and self.key_offsets is None:
            raise KVStoreError("centered=True needs a store built with key_offsets")
        self._seqs[seq_id] = StoredSequence(centered=centered)
        if track_keys:
            self.key_geometry.track(seq_id)

    def centered_keys(self, layer: int, step: StepBatch, k: torch.Tensor) -> torch.Tensor:
        """This step's keys ``[T, Hkv, D]`` as the store holds them: minus the layer's offset
        on the rows of centered sequences. Every key a query of such a sequence reads, stored
        or current, is shifted alike, so its softmax is unchanged."""
        if step.centered_rows is None or self.key_offsets is None:
            return k
        return k - step.centered_rows * self.key_offsets[layer].to(k.dtype)

    def remove_sequence(self, seq_id: str) -> None:
        """Free every slot of a sequence at once (finished or cancelled requests)."""
        self._get(seq_id).free(self._high_alloc, self._low_alloc)
        del self._seqs[seq_id]
        self.key_scores.drop(seq_id)
        self.key_geometry.drop(seq_id)

    def truncate(self, seq_id: str, length: int) -> None:
        """Drop every token at position >= ``length`` (a conversation turn that diverged)."""
        seq = self._get(seq_id)
        if not 0 <= length <= seq.length:
            raise KVStoreError(f"cannot truncate {seq_id!r} of length {seq.length} to {length}")
        seq.truncate(length, self._high_alloc, self._low_alloc)
        self.key_geometry.truncate(seq_id, length)

    def copy_sequence(self, src_id: str, dst_id: str) -> None:
        """Make the empty ``dst_id`` a copy of ``src_id``: every row, the settled mark and the
        scheduled actions. A request whose prompt another one has just prefilled under the
        same plan starts from its KV instead of computing it again (``engine.py``).

        Raises
        ------
        KVStoreError
            ``dst_id`` holds tokens, the two center keys differently, or the pools lack the
            rows (checked before any row is taken).
        """
        src, dst = self._get(src_id), self._get(dst_id)
        if dst.length or src.centered != dst.centered:
            raise KVStoreError(f"{dst_id!r} must be empty and centered like {src_id!r}")
        if (src.held_rows() > self.pools.free_rows()).any():
            raise KVStoreError(f"KV pool full: no room to copy {src_id!r}")
        high_slots = [self._high_alloc[g].take(src.high[g].size) for g in range(3)]
        low_slots = [self._low_alloc[g].take(src.low[g].size) for g in range(3)]
        for g in range(3):
            self.pools.copy_rows(g, src.high[g].slots, high_slots[g], high=True)
            self.pools.copy_rows(g, src.low[g].slots, low_slots[g], high=False)
        dst.copy_of(src, high_slots, low_slots)
        self.key_geometry.copy(src_id, dst_id)
        self._note_peak([dst])

    def has_sequence(self, seq_id: str) -> bool:
        return seq_id in self._seqs

    @property
    def num_sequences(self) -> int:
        """Sequences in the store now (requests in flight plus kept conversations)."""
        return len(self._seqs)

    def sequence_ids(self) -> list[str]:
        return list(self._seqs)  # oldest first

    def length(self, seq_id: str) -> int:
        return self._get(seq_id).length

    def resplit(self, rows: PoolRows) -> None:
        """Divide the pools into ``rows``; only an empty store (no held row moves)."""
        if self._seqs:
            raise KVStoreError(f"re-split needs an empty store; {len(self._seqs)} sequences held")
        self.pools.split(rows)

    def held_rows(self, seq_id: str) -> np.ndarray:
        """``[2, 3]`` rows one sequence holds, laid out as ``KVPools.free_rows``."""
        return self._get(seq_id).held_rows()

    def rows_after_step(self, seq_id: str, n: int) -> np.ndarray:
        """``[2, 3]`` rows it may hold after a decode step of ``n`` tokens (``kv_sequence``)."""
        return self._get(seq_id).rows_after_step(n, self.config.sinks, self.config.window)

    def _get(self, seq_id: str) -> StoredSequence:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise KVStoreError(f"unknown sequence {seq_id!r}; call add_sequence first") from None

    def schedule(self, seq_id: str, position: int, actions: Sequence[Action]) -> None:
        """Record the per-group actions a token gets when it leaves the recent window."""
        if len(actions) != 3:
            raise KVStoreError(f"need one action per layer group (3), got {len(actions)}")
        seq = self._get(seq_id)
        if position < seq.settled:
            raise KVStoreError(f"token {position} of {seq_id!r} already left the window")
        seq.pending.put(position, actions)

    def schedule_many(self, seq_id: str, start: int, actions: Sequence[Sequence[Action]]) -> None:
        for i, acts in enumerate(actions):
            self.schedule(seq_id, start + i, acts)

    def begin_step(
        self, chunks: Sequence[tuple[str, int]], *, want_scores: bool = False
    ) -> StepBatch:
        """Allocate each new token's storage in its settled form and snapshot what it attends to.

        Tokens still inside the recent window after this step (and sinks) get high slots;
        the others get what their scheduled action says, per group: a low slot, or nothing.
        Only those tokens' scheduled actions are read, so a decode step (one token per
        sequence, inside the window) does no per-token work beyond entering its slot.
        """
        if not chunks:
            raise KVStoreError("a step needs at least one (sequence, new token count) pair")
        seqs, offsets, positions = [], [0], []
        for seq_id, n in chunks:
            if n < 1:
                raise KVStoreError(f"sequence {seq_id!r}: a chunk needs at least one token")
            seqs.append(seq := self._get(seq_id))
            positions.extend(range(seq.length, seq.length + n))
            offsets.append(offsets[-1] + n)
        highs = tuple(pool_view([q.high[g] for q in seqs], self.device) for g in range(3))
        lows = tuple(pool_view([q.low[g] for q in seqs], self.device) for g in range(3))
        # per group: rows of the packed axis that go low, and rows released at once
        low_rows: list[list[int]] = [[], [], []]
        gone_rows: list[list[int]] = [[], [], []]
        sinks, window = self.config.sinks, self.config.window
        for seq, (_, n), first in zip(seqs, chunks, offsets, strict=False):
            for j, acts in seq.pending.settle_on_write(seq.length, n, sinks, window):
                for g in range(3):
                    if acts[g] != Action.H:
                        (low_rows if acts[g] == Action.L else gone_rows)[g].append(first + j)
        writes = tuple(
            place_group(
                (self._high_alloc[g], self._low_alloc[g]),
                ([q.high[g] for q in seqs], [q.low[g] for q in seqs]),
                offsets,
                positions,
                low_rows[g],
                gone_rows[g],
                self.device,
            )  # fmt: skip
            for g in range(3)
        )
        for seq, (_, n) in zip(seqs, chunks, strict=True):
            seq.length += n
        self._note_peak(seqs)
        centered_rows = None
        if any(seq.centered for seq in seqs):
            per_seq = torch.tensor([float(seq.centered) for seq in seqs])
            counts = torch.tensor([n for _, n in chunks])
            rows = torch.repeat_interleave(per_seq, counts).view(-1, 1, 1)
            centered_rows = rows.to(self.device)
        batch = StepBatch(
            seq_ids=tuple(s for s, _ in chunks),
            q_offsets=torch.tensor(offsets, dtype=torch.int64),
            positions=torch.tensor(positions, dtype=torch.int64, device=self.device),
            writes=writes,
            high=highs,
            low=lows,
            want_scores=want_scores,
            centered_rows=centered_rows,
        )
        if want_scores:
            self.key_scores.begin_step({s: self._seqs[s].length for s in batch.seq_ids})
        return batch

    def write(self, layer: int, step: StepBatch, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store this step's K/V rows ``[T, Hkv, D]`` of one layer where ``begin_step`` placed
        them (``KVPools.write``); the unit keys of tracked sequences, uncentered, to
        ``key_geometry``."""
        self.pools.write(layer, step.writes[self._group_of_layer[layer]], k, v)
        if self.key_geometry.tracks_any(step.seq_ids):
            raw = k
            if step.centered_rows is not None and self.key_offsets is not None:
                raw = k + step.centered_rows * self.key_offsets[layer].to(k.dtype)
            offsets = step.q_offsets.tolist()
            self.key_geometry.add(layer, step.seq_ids, offsets, step.positions, raw)

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
        result = self.pools.attend(layer, step.chunk(q, k, v), step.high[g], step.low[g],
                                   scale=scale, return_key_scores=step.want_scores)  # fmt: skip
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

    def retained_arrays(self, seq_id: str, group: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions held high and held low in one group (unordered int64 copies)."""
        seq = self._get(seq_id)
        return seq.high[group].positions.copy(), seq.low[group].positions.copy()

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
            self._migrate(group, [(seq, list(positions))], [])
        elif action == Action.R:
            in_high = [p for p in positions if p in seq.high[group].index]
            in_low = [p for p in positions if p in seq.low[group].index]
            self._migrate(group, [], [(seq, in_high)])
            self._low_alloc[group].give([seq.low[group].remove(p) for p in in_low])
        else:
            raise KVStoreError("demote takes L or R; nothing can be promoted back to H")

    def end_step(self, step: StepBatch) -> None:
        """Execute the scheduled actions of tokens written before this step that left the
        recent window in it (this step's own tokens were placed by ``begin_step``), for the
        whole batch at once: one quantization per layer, not one per sequence."""
        if step.want_scores:
            self.key_scores.end_step(step.seq_ids)
        s, w = self.config.sinks, self.config.window
        to_low: list[list[tuple[StoredSequence, list[int]]]] = [[], [], []]
        to_release: list[list[tuple[StoredSequence, list[int]]]] = [[], [], []]
        counts = step.q_offsets.diff().tolist()
        for seq_id, n in zip(step.seq_ids, counts, strict=True):
            seq = self._seqs[seq_id]
            due, seq.settled = seq.pending.due_after_step(seq.settled, seq.length, n, s, w)
            for g in range(3):
                low, gone = ([p for p, a in due if a[g] == x] for x in (Action.L, Action.R))
                if low:
                    to_low[g].append((seq, low))
                if gone:
                    to_release[g].append((seq, gone))
        for g in range(3):
            self._migrate(g, to_low[g], to_release[g])

    def _migrate(
        self,
        g: int,
        to_low: list[tuple[StoredSequence, list[int]]],
        to_release: list[tuple[StoredSequence, list[int]]],
    ) -> None:
        """Move held-high tokens of several sequences to the low pool (H→L) or free them (H→R).

        The low rows are taken first, so a full low pool raises before anything moves (the
        two pools are separate memory: the order costs nothing).
        """
        if to_low:
            low_slots = self._low_alloc[g].take(sum(len(ps) for _, ps in to_low))
            high_slots = [seq.high[g].remove(p) for seq, ps in to_low for p in ps]
            src = torch.tensor(high_slots, dtype=torch.int64, device=self.device)
            coded = self.pools.quantize_rows(g, src)
            self._high_alloc[g].give(high_slots)
            dst = torch.tensor(low_slots, dtype=torch.int64, device=self.device)
            self.pools.put_low(coded, dst)
            i = 0
            for seq, ps in to_low:
                seq.low[g].add_many(ps, low_slots[i : i + len(ps)])
                i += len(ps)
        for seq, ps in to_release:
            self._high_alloc[g].give([seq.high[g].remove(p) for p in ps])

    def _note_peak(self, seqs: Sequence[StoredSequence]) -> None:
        for seq in seqs:
            seq.peak_bytes = max(seq.peak_bytes, sum(self.bytes.held(seq.high, seq.low)))
        self.peak_bytes = max(self.peak_bytes, self.live_bytes())

    def live_bytes(self) -> int:
        """Payload bytes held by all sequences now (high + low + scales)."""
        return self.bytes.live(self._high_alloc, self._low_alloc)

    def allocated_bytes(self) -> int:
        """Bytes preallocated for the pools (the capacity, free rows included)."""
        return self.pools.allocated_bytes()

    def audit(self) -> None:
        """Every slot of every pool is free exactly once or held by exactly one token
        (``slots.audit_store``: why, and what it raises)."""
        audit_store(self._high_alloc, self._low_alloc, list(self._seqs.values()))

    def report(self, seq_id: str, prompt_tokens: int = 0) -> KVReport:
        """What ``seq_id`` holds; with ``prompt_tokens``, also how much of it is the prompt's."""
        seq, cfg = self._get(seq_id), self.config
        return self.bytes.report(
            seq.high, seq.low, seq.length, seq.peak_bytes, cfg.sinks, cfg.window, prompt_tokens
        )
