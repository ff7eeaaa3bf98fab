"""Random action programs on the KV store (issue 14, item 4): bytes exact, floors held.

Hypothesis drives the store through random programs of the operations the engine and the
policies use (add a sequence, a batched step with per-token per-group actions, late
demotions, truncation, removal) and checks the store against a plain model of
where each token of each group must be after every operation:

* every position is high, low or released exactly as the scheduled actions, demotions and
  truncations say; sinks and every token not yet settled are high (the floors);
* the byte report of each sequence equals the count the model implies, and the store's live
  bytes (counted from the allocators) equal the sum of the reports (counted from slot maps);
* every pool slot is free exactly once or held by exactly one token (``KVStore.audit``);
* the rows a token reads are the ones written for it: BF16 rows equal, INT4 rows within half
  a quantization step, so a slot reused after a release never leaks another token's data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from pask_agent.errors import KVStoreError
from pask_agent.kernels.int4 import dequantize_int4_ref
from pask_agent.policy.actions import Action
from pask_agent.runtime.memory.kv_layout import KVLayout, StoreConfig
from pask_agent.runtime.memory.kv_store import KVStore

LAYOUT = KVLayout(num_layers=6, num_kv_heads=2, head_dim=8)
SEQS = ("a", "b", "c")
ACTIONS = st.tuples(*[st.sampled_from([Action.H, Action.L, Action.R])] * 3)


@dataclass
class Expected:
    """Where each token of one sequence must be: per group, position → "high" | "low"."""

    length: int = 0
    where: list[dict[int, str]] = field(default_factory=lambda: [{}, {}, {}])
    pending: dict[int, tuple[Action, ...]] = field(default_factory=dict)
    rows: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)  # (layer, pos) → K


class StoreProgram:
    """Applies operations to a real store and to the expected model side by side."""

    def __init__(self, sinks: int, window: int, rows: int) -> None:
        self.store = KVStore(LAYOUT, StoreConfig(sinks, window, rows_per_pool=rows))
        self.expected: dict[str, Expected] = {}
        self.gen = torch.Generator().manual_seed(0)

    def add(self, seq: str) -> None:
        if seq in self.expected:
            with pytest.raises(KVStoreError, match="already exists"):
                self.store.add_sequence(seq)
            return
        self.store.add_sequence(seq)
        self.expected[seq] = Expected()

    def step(self, chunks: list[tuple[str, list[tuple[Action, ...]]]]) -> None:
        chunks = [(s, acts) for s, acts in chunks if s in self.expected]
        seen: set[str] = set()
        chunks = [(s, a) for s, a in chunks if not (s in seen or seen.add(s))]
        if not chunks:
            return
        for seq, acts in chunks:
            exp = self.expected[seq]
            for i, a in enumerate(acts):
                self.store.schedule(seq, exp.length + i, a)
                exp.pending[exp.length + i] = a
        step = self.store.begin_step([(s, len(a)) for s, a in chunks])
        for layer in range(LAYOUT.num_layers):
            k = torch.randn(step.num_tokens, 2, 8, generator=self.gen)
            self.store.write(layer, step, k, -k)
            row = 0
            for seq, acts in chunks:
                exp = self.expected[seq]
                for i in range(len(acts)):
                    exp.rows[(layer, exp.length + i)] = k[row].to(torch.bfloat16)
                    row += 1
        for seq, acts in chunks:
            exp = self.expected[seq]
            for i in range(len(acts)):
                for g in range(3):
                    exp.where[g][exp.length + i] = "high"
            exp.length += len(acts)
        settled_before = {s: self.store.settled(s) for s, _ in chunks}
        self.store.end_step(step)
        cfg = self.store.config
        for seq, _ in chunks:
            exp = self.expected[seq]
            start = max(settled_before[seq], cfg.sinks)
            stop = exp.length - cfg.window
            for p in range(start, stop):
                acts = exp.pending.pop(p, (Action.H,) * 3)
                for g in range(3):
                    self._act(exp, g, p, acts[g])
            # the tail of ``window`` tokens stays unsettled; sinks never settle
            want = stop if stop > start else settled_before[seq]
            assert self.store.settled(seq) == want

    @staticmethod
    def _act(exp: Expected, g: int, p: int, action: Action) -> None:
        if action == Action.L:
            exp.where[g][p] = "low"
        elif action == Action.R:
            del exp.where[g][p]

    def demote(self, seq: str, g: int, positions: list[int], action: Action) -> None:
        if seq not in self.expected:
            return
        exp, settled = self.expected[seq], self.store.settled(seq)
        positions = sorted({p for p in positions if p < exp.length})
        protected = [p for p in positions if p < self.store.config.sinks or p >= settled]
        not_high = [p for p in positions if exp.where[g].get(p) != "high"]
        if action == Action.H or protected or (action == Action.L and not_high):
            with pytest.raises(KVStoreError):
                self.store.demote(seq, g, positions, action)
            return
        self.store.demote(seq, g, positions, action)
        for p in positions:
            if p in exp.where[g]:
                self._act(exp, g, p, action)

    def truncate(self, seq: str, length: int) -> None:
        if seq not in self.expected:
            return
        exp = self.expected[seq]
        if length > exp.length:
            with pytest.raises(KVStoreError, match="cannot truncate"):
                self.store.truncate(seq, length)
            return
        self.store.truncate(seq, length)
        for g in range(3):
            exp.where[g] = {p: w for p, w in exp.where[g].items() if p < length}
        exp.pending = {p: a for p, a in exp.pending.items() if p < length}
        exp.length = length

    def remove(self, seq: str) -> None:
        if seq not in self.expected:
            with pytest.raises(KVStoreError, match="unknown sequence"):
                self.store.remove_sequence(seq)
            return
        self.store.remove_sequence(seq)
        del self.expected[seq]

    # ------------------------------------------------------------------ the checks
    def check(self) -> None:
        store, lay, groups = self.store, LAYOUT, self.store.groups
        store.audit()
        total = 0
        for seq, exp in self.expected.items():
            assert store.length(seq) == exp.length
            settled = store.settled(seq)
            high_rows = low_rows = 0
            for g in range(3):
                high, low = tuple(a.tolist() for a in store.retained_arrays(seq, g))
                want_high = sorted(p for p, w in exp.where[g].items() if w == "high")
                want_low = sorted(p for p, w in exp.where[g].items() if w == "low")
                assert sorted(high) == want_high, (seq, g)
                assert sorted(low) == want_low, (seq, g)
                # floors: sinks and every unsettled token are high in every group
                floor = set(range(min(store.config.sinks, exp.length)))
                floor |= set(range(settled, exp.length))
                assert floor <= set(high), (seq, g, sorted(floor - set(high)))
                n = len(groups.layers_of(g))
                high_rows, low_rows = high_rows + len(high) * n, low_rows + len(low) * n
                self._check_rows(seq, g)
            kv = store.report(seq)
            assert kv.high_bytes == high_rows * lay.high_row_bytes
            assert kv.low_bytes == low_rows * lay.low_row_bytes
            assert kv.scale_bytes == low_rows * lay.scale_row_bytes
            assert kv.full_bytes == exp.length * lay.num_layers * lay.high_row_bytes
            assert kv.peak_bytes >= kv.live_bytes
            total += kv.live_bytes
        assert store.live_bytes() == total
        assert store.num_sequences == len(self.expected)
        assert store.peak_bytes >= total

    def _check_rows(self, seq: str, g: int) -> None:
        """The first layer of the group: stored rows are the rows written for the token."""
        layer = self.store.groups.layers_of(g)[0]
        s = self.store._seqs[seq]
        exp = self.expected[seq]
        for pos, slot in zip(s.high[g].positions, s.high[g].slots, strict=True):
            want = exp.rows[(layer, pos)]
            assert torch.equal(self.store.pools.high_k[layer][slot], want), (seq, g, pos)
            assert torch.equal(self.store.pools.high_v[layer][slot], -want), (seq, g, pos)
        for pos, slot in zip(s.low[g].positions, s.low[g].slots, strict=True):
            want = exp.rows[(layer, pos)].float()
            scales = self.store.pools.low_ks[layer][slot]
            got = dequantize_int4_ref(self.store.pools.low_k[layer][slot], scales, LAYOUT.head_dim)
            assert (got - want).abs().max() <= scales.float().max() / 2 + 1e-3, (seq, g, pos)


ROWS = 30 * 3 * 12  # fixed pools (they never grow): every token the longest program writes
OPS = ["step"] * 5 + ["demote"] * 2 + ["truncate", "remove", "add"]


def _run_op(program: StoreProgram, data: st.DataObject) -> None:
    """Draw one operation that mostly targets live sequences, then apply it."""
    live = sorted(program.expected) or list(SEQS)
    op = data.draw(st.sampled_from(OPS), label="op")
    seq = data.draw(st.sampled_from(live if op != "add" else list(SEQS)), label="seq")
    length = program.expected[seq].length if seq in program.expected else 0
    if op == "step":
        chunk = st.tuples(st.sampled_from(live), st.lists(ACTIONS, min_size=1, max_size=12))
        chunks = data.draw(st.lists(chunk, min_size=1, max_size=3), label="chunks")
        program.step(chunks)
    elif op == "demote":
        group = data.draw(st.integers(0, 2), label="group")
        positions = data.draw(st.lists(st.integers(0, length + 1), max_size=4), label="positions")
        action = data.draw(st.sampled_from([Action.L, Action.R, Action.R, Action.H]))
        program.demote(seq, group, positions, action)
    elif op == "truncate":
        program.truncate(seq, data.draw(st.integers(0, length + 1), label="length"))
    else:
        getattr(program, op)(seq)


@fuzz_settings(40)
@given(
    sinks=st.integers(0, 3),
    window=st.integers(1, 6),
    n_ops=st.integers(4, 30),
    data=st.data(),
)
def test_random_programs_keep_the_store_exact(
    sinks: int, window: int, n_ops: int, data: st.DataObject
) -> None:
    program = StoreProgram(sinks, window, ROWS)
    for seq in SEQS:
        program.add(seq)
    for _ in range(n_ops):
        _run_op(program, data)
        program.check()
    for seq in list(program.expected):
        program.remove(seq)
    program.check()
    assert program.store.live_bytes() == 0
    for allocs in (program.store._high_alloc, program.store._low_alloc):
        for alloc in allocs:
            assert alloc.used == 0 and sorted(alloc.free) == list(range(alloc.capacity))
