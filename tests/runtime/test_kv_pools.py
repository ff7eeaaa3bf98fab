"""Preallocated KV pools (issue 11, item 2) on a tiny random Qwen2.

The pools are one buffer of ``kv_capacity_bytes``, carved once per split: no pool tensor is
reallocated while requests decode, live bytes are exact against the rows held, the allocated
bytes are reported next to them, an empty store is re-split to what the admitted plans need,
a full pool is a typed error rather than growth, and idle kept conversations give their rows
back when a request needs them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pask_agent.errors import KVStoreError
from pask_agent.policy.actions import Action
from pask_agent.policy.base import PolicyEnv
from pask_agent.policy.full import FullPolicy
from pask_agent.policy.pask import PaskPolicy
from pask_agent.policy.uniform import UniformPolicy
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.engine import Engine
from pask_agent.runtime.memory.admission import kept_rows, rows_bytes
from pask_agent.runtime.memory.kv_layout import KVLayout, StoreConfig
from pask_agent.runtime.memory.kv_pools import PoolRows, split_rows
from pask_agent.runtime.memory.kv_store import KVStore
from pask_agent.runtime.models.loading import LoadedModel, load_tokenizer
from pask_agent.runtime.requests import Request, SamplingParams
from pask_agent.runtime.turns.outputs import TEXT
from pask_agent.runtime.turns.results import Finished

NEW = 12


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    from tiny_models import tiny_qwen2

    return LoadedModel("tiny-qwen2", Path("."), tiny_qwen2(151936), load_tokenizer("default"))


def _request(engine: Engine, policy, n: int, *, seed: int = 0, keep: bool = False) -> Request:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(200, 5000, (n,), generator=g).tolist()
    labels = ["schema_description"] * (n - 8) + ["protected_content"] * 8
    cfg = engine.config
    session = policy.start(PolicyEnv(engine.costs, cfg.sinks, cfg.window, 0.33))
    params = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    r = Request(ids, labels, TEXT, params, engine.new_sequence(session), policy)
    r.keep_sequence = keep
    return r


def _pointers(engine: Engine) -> list[int]:
    pools = engine.store.pools
    views = (pools.high_k, pools.high_v, pools.low_k, pools.low_v, pools.low_ks, pools.low_vs)
    return [pools.buffer.data_ptr()] + [t.data_ptr() for layers in views for t in layers]


def _held_bytes(engine: Engine) -> int:
    """Live bytes from first principles: rows in use times the bytes of a row."""
    lay, store = engine.layout, engine.store
    low_row = lay.low_row_bytes + lay.scale_row_bytes
    return sum(
        len(lay.groups.layers_of(g))
        * (store._high_alloc[g].used * lay.high_row_bytes + store._low_alloc[g].used * low_row)
        for g in range(3)
    )


@pytest.mark.parametrize("policy", [FullPolicy(), PaskPolicy(allow_transfer=True)])
def test_no_pool_tensor_moves_while_requests_decode(tiny, policy) -> None:
    capacity = 3 << 20
    engine = Engine(tiny, RuntimeConfig(kv_capacity_bytes=capacity, prefill_chunk_tokens=64))
    requests = [_request(engine, policy, n, seed=n) for n in (150, 97, 211)]
    engine.inbox.extend(requests)
    engine.step()  # admission re-split the empty store for these plans
    before, ends = _pointers(engine), []
    while engine.has_work():
        ends += [e for _, e in engine.step() if isinstance(e, Finished)]
        assert _pointers(engine) == before  # nothing reallocated, nothing grew
        assert engine.store.live_bytes() == _held_bytes(engine)
        seqs = [r.state.seq_id for r in engine.live]
        assert engine.store.live_bytes() == sum(engine.store.report(s).live_bytes for s in seqs)
        assert engine.store.pools.rows.nbytes(engine.layout) <= capacity
    assert len(ends) == 3 and all(len(f.token_ids) == NEW for f in ends)
    assert all(f.allocated_kv_bytes == capacity for f in ends)  # reported next to live bytes
    assert engine.store.allocated_bytes() == capacity and engine.store.live_bytes() == 0
    assert engine.store.peak_bytes <= capacity


def test_split_follows_the_admitted_plans(tiny) -> None:
    engine = Engine(tiny, RuntimeConfig(kv_capacity_bytes=2 << 20))
    full = _request(engine, FullPolicy(), 120)
    engine.inbox.append(full)
    engine.step()
    assert engine.store.pools.rows.low == (0, 0, 0)  # Full KV keeps nothing at INT4
    while engine.has_work():
        engine.step()
    pask = _request(engine, PaskPolicy(allow_transfer=True), 120)
    engine.inbox.append(pask)
    engine.step()  # the store was empty: re-split for PASK's plan
    rows = engine.store.pools.rows
    assert min(rows.low) > 0 and rows.high[0] < (2 << 20) // engine.costs.full_bytes_per_token
    # the split is the request's demand scaled to the capacity, pool by pool
    want = split_rows(
        2 << 20, engine.layout, tuple(pask.demand_rows[0]), tuple(pask.demand_rows[1])
    )
    assert rows == want


def test_a_capacity_of_k_demands_holds_exactly_k(tiny) -> None:
    layout = KVLayout.from_config(tiny.model.config)
    probe = Engine(tiny)
    r = _request(probe, PaskPolicy(allow_transfer=True), 150)
    probe._reserve_for(r)
    demand = rows_bytes(r.demand_rows, probe.costs)
    assert demand == r.demand_bytes
    rows = split_rows(5 * demand, layout, tuple(r.demand_rows[0]), tuple(r.demand_rows[1]))
    assert rows == PoolRows(tuple(5 * r.demand_rows[0]), tuple(5 * r.demand_rows[1]))
    assert rows.nbytes(layout) == 5 * demand


def test_resplit_needs_an_empty_store_and_a_full_pool_is_a_typed_error(tiny) -> None:
    store = KVStore(KVLayout.from_config(tiny.model.config), StoreConfig(sinks=1, window=2))
    store.add_sequence("a")
    with pytest.raises(KVStoreError, match="empty store"):
        store.resplit(PoolRows.even(4))
    store.remove_sequence("a")
    store.resplit(PoolRows((4, 4, 4), (0, 0, 0)))
    assert store.pools.high_k[0].shape[0] == 4 and store.pools.low_k[0].shape[0] == 0
    with pytest.raises(KVStoreError, match="preallocated"):
        store.resplit(PoolRows.even(10**6))
    store.add_sequence("b")
    with pytest.raises(KVStoreError, match="KV pool full"):
        store.begin_step([("b", 5)])


def test_idle_kept_conversation_is_evicted_for_a_request_that_needs_its_rows(tiny) -> None:
    per_token = Engine(tiny).costs.full_bytes_per_token
    capacity = 200 * per_token  # one 150 + 12 token request at Full KV, not two
    engine = Engine(tiny, RuntimeConfig(kv_capacity_bytes=capacity))
    kept = _request(engine, UniformPolicy(Action.H), 150, keep=True)
    (end,) = engine.run([kept])
    assert isinstance(end, Finished) and engine.store.has_sequence(kept.state.seq_id)
    other = _request(engine, FullPolicy(), 150, seed=1)
    (end,) = engine.run([other])  # would wait forever if the idle rows stayed held
    assert isinstance(end, Finished) and not engine.store.has_sequence(kept.state.seq_id)
    kept.state.busy = False
    again = Request(kept.prompt_ids, kept.labels, TEXT, kept.params, kept.state, kept.policy)
    (end,) = engine.run([again])  # its next turn prefills again
    assert isinstance(end, Finished) and end.prefilled_tokens == 150


def test_next_turn_reserves_low_rows_for_the_history_it_may_requantize(tiny) -> None:
    engine = Engine(tiny, RuntimeConfig(kv_capacity_bytes=3 << 20))
    pask = PaskPolicy(allow_transfer=True)
    first = _request(engine, pask, 120, keep=True)
    (end,) = engine.run([first])
    assert isinstance(end, Finished)
    seq = first.state.seq_id
    held = engine.store.held_rows(seq)
    rows = kept_rows(engine.store, seq, 100, replans=True)
    assert (rows[0] == held[0]).all() and (rows[1] == held[1] + held[0]).all()
    assert (kept_rows(engine.store, seq, 100, replans=False) == held).all()
    first.state.busy = False
    ids = first.prompt_ids + list(end.token_ids) + first.prompt_ids[:20]
    labels = ["schema_description"] * (len(ids) - 8) + ["protected_content"] * 8
    params = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
    second = Request(ids, labels, TEXT, params, first.state, pask, keep_sequence=True)
    (end,) = engine.run([second])  # the history re-plan finds its INT4 rows reserved
    assert isinstance(end, Finished) and end.prefilled_tokens < len(ids)
    assert engine.shed_events == 0
