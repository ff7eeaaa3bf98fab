"""What a request reserves of the preallocated KV pools: what its policy will keep (App. B.4).

The pools are fixed (``kv_pools.py``): per layer group a high (BF16) pool and a low (INT4)
pool, each a number of rows. So a request's demand is counted in rows, ``[2, 3]`` (high/low ×
group), and its bytes follow from the rows (``demand_bytes``). Per group ``g``:

    high_g = prompt tokens planned H (sinks always) + ⌈β · N⌉ + min(2·window + 1, not-H tokens)
             + ⌈Γ_max / C_full⌉
    low_g  = prompt tokens planned L + N

* ``N = max_new_tokens`` and ``β = B_D`` (``b / C_full``, the session's ``decode_demand``): a
  generated token's group actions are decided as it is tagged, so the ledger bounds the
  tokens held high by ``β · N``, but not those stored INT4 (a row of those costs about a
  quarter as much): any generated token may end in the low pool, even at ``B_D = 1`` (the
  reserve ``Γ`` holds back part of each token's allowance, so the controller demotes some).
  So every generated token reserves a low row as well, unless the session states its shares
  (``DecodeDemand.row_shares``: uniform and score-ranked policies). Reserving the average
  ``(1 − β) · N`` instead gave a request at ``B_D = 1`` no low row at all, and the split then
  gave the low pools none, so the first demotion found a pool of 0 rows (issue 34). A Full-KV
  request holds every row high, so it reserves exactly ``(prompt + N) · C_full`` bytes;
* ``Γ_max``: the largest decode reserve, how far floors may run ahead of the allowance;
* tokens wait high in the recent window whatever they settle to: the window before a step and
  a prefill chunk's own last window tokens, so at most ``2 · window + 1`` extra high rows;
* a policy that quantizes after the fact (``DecodeDemand.quantizes_late``: MiKV) may move any
  token to INT4 after holding it high, so it reserves a low row for every token as well;
* a conversation's next turn adds the rows its sequence already holds (and, when it re-plans
  its history, a low row per held high row: :func:`kept_rows`).

**How the pools are split** (``split_for``): when the engine admits into an empty store, it
re-splits the preallocated bytes in proportion to the demands of the requests it is about to
admit, so a capacity of exactly ``k`` such demands holds exactly ``k`` of them. Only an empty
store is re-split because nothing then has to move: a split that moved held rows would copy
every row and stall the step. A request whose demand does not fit the current split waits
(first come, first served) until the store drains; when nothing is running, idle kept
conversations are evicted (their next turn prefills again) so it always drains.

A request that outgrows its reservation mid-decode (floors or tags ran ahead of ``β``) first
takes rows nobody reserved and, with none left, sheds its own oldest settled tokens
(:func:`shed`): allocation never fails, nothing crashes, and ``shed_events`` counts it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pask_agent.policy.actions import Action
from pask_agent.policy.base import Actions, DecodeDemand, Demotion
from pask_agent.policy.costs import PayloadCosts
from pask_agent.runtime.memory.kv_pools import split_rows
from pask_agent.runtime.memory.kv_store import KVStore

DEFAULT_CAPACITY_CAP = 4 << 30


def default_capacity_bytes(costs: PayloadCosts, max_batch: int, context_tokens: int) -> int:
    """``kv_capacity_bytes`` left unset: ``max_batch`` Full-KV requests of the model's whole
    context (4,096 tokens if it states none), at most 4 GiB: more could never be used."""
    tokens = context_tokens if context_tokens > 0 else 4096
    return min(DEFAULT_CAPACITY_CAP, max_batch * tokens * costs.full_bytes_per_token)


def decode_demand(session: Any, costs: PayloadCosts) -> DecodeDemand:
    """The session's own statement, or Full KV for a session that makes none."""
    declared = getattr(session, "decode_demand", None)
    return declared(costs) if callable(declared) else DecodeDemand.full(costs)


def request_rows(
    plan: Sequence[Actions],
    decode: DecodeDemand,
    costs: PayloadCosts,
    *,
    start: int,
    sinks: int,
    window: int,
    max_new_tokens: int,
) -> np.ndarray:
    """``[2, 3]`` rows to reserve for new prompt tokens starting at position ``start``."""
    acts = np.asarray([[int(a) for a in row] for row in plan], dtype=np.int64).reshape(-1, 3)
    acts[: max(0, sinks - start)] = int(Action.H)
    n, new = len(acts), max_new_tokens
    beta = min(1.0, float(decode.bytes_per_token) / costs.full_bytes_per_token)
    if decode.row_shares is None:  # decided token by token: β of them high, any of them low
        new_high, new_low = np.full(3, math.ceil(beta * new)), np.full(3, new)
    else:
        new_high, new_low = (np.array([math.ceil(x * new) for x in s]) for s in decode.row_shares)
        new_low = np.minimum(new - new_high, new_low)
    high = (acts == int(Action.H)).sum(axis=0) + new_high
    low = (acts == int(Action.L)).sum(axis=0) + new_low
    high = high + np.minimum(2 * window + 1, n + new - high)
    high = high + math.ceil(decode.reserve_bytes / costs.full_bytes_per_token)
    if decode.quantizes_late:
        low = np.full(3, n + new)
    return np.stack([high, low]).astype(np.int64)


def plan_rows(
    session: Any,
    labels: Sequence[str],
    max_new_tokens: int,
    costs: PayloadCosts,
    sinks: int,
    window: int,
    keep: int = 0,
) -> tuple[np.ndarray, list[Actions]]:
    """The session's plan of the whole prompt ``labels`` and the ``[2, 3]`` rows its new
    tokens (all but the first ``keep``, which are reused) reserve. The whole prompt is planned
    even when most of it is reused: planned alone, a conversation's new suffix would be a
    prompt of its own, its first tokens kept as sinks and its budget solved for its length,
    not the turn's (``history_plan.py`` brings the reused part down to the same plan)."""
    plan = list(session.plan_prefill(labels))
    decode = decode_demand(session, costs)
    rows = request_rows(
        plan[keep:], decode, costs, start=keep, sinks=sinks, window=window,
        max_new_tokens=max_new_tokens,
    )  # fmt: skip
    return rows, plan


def requests_that_fit(capacity_bytes: int, layout: Any, demand_rows: np.ndarray) -> int:
    """How many requests of this demand an empty store of ``capacity_bytes`` admits at once
    (its pools split for them, as ``Reservations.split_for`` does)."""
    rows = split_rows(capacity_bytes, layout, tuple(demand_rows[0]), tuple(demand_rows[1]))
    have = np.array([rows.high, rows.low])
    return int(min(have[demand_rows > 0] // demand_rows[demand_rows > 0]))


def kept_rows(store: KVStore, seq_id: str, keep: int, *, replans: bool) -> np.ndarray:
    """``[2, 3]`` rows a conversation's next turn reserves for the ``keep`` tokens it reuses:
    what its sequence holds, and when the turn re-plans its history (``history_plan.py``) a
    low row for each held high row, since the re-plan may move any of them to INT4."""
    if not keep:
        return np.zeros((2, 3), np.int64)
    rows = store.held_rows(seq_id)
    if replans:
        rows[1] += rows[0]
    return rows


def rows_bytes(rows: np.ndarray, costs: PayloadCosts) -> int:
    """Payload bytes of ``[2, 3]`` rows (a high row of group g costs ``m(H, g)``)."""
    cost = np.asarray(costs.bytes_by_group, dtype=np.int64)  # [g, action]
    return int((rows[0] * cost[:, int(Action.H)] + rows[1] * cost[:, int(Action.L)]).sum())


def shed(store: KVStore, seq_id: str, short: np.ndarray, low_room: np.ndarray) -> list[Demotion]:
    """Demotions of a sequence's oldest settled tokens that free ``short`` rows (``[2, 3]``).

    The last resort of a request past its reservation with no rows left: floors ignored,
    sinks and the recent window kept (the store protects them). High rows go to INT4 while
    ``low_room`` (per group) lasts, newest first, and are released otherwise; low rows are
    released, oldest first.
    """
    settled, sinks = store.settled(seq_id), store.config.sinks
    out: list[Demotion] = []
    for g in range(3):
        high, low = (np.sort(a) for a in store.retained_arrays(seq_id, g))
        take = high[(high >= sinks) & (high < settled)][: int(short[0, g])]
        n_low = min(len(take), int(low_room[g]))
        if len(take) > n_low:
            out.append(Demotion(g, tuple(int(p) for p in take[: len(take) - n_low]), Action.R))
        if n_low:
            out.append(Demotion(g, tuple(int(p) for p in take[len(take) - n_low :]), Action.L))
        drop = low[low < settled][: int(short[1, g])]
        if len(drop):
            out.append(Demotion(g, tuple(int(p) for p in drop), Action.R))
    return out


class Reservations:
    """The pool rows promised to admitted requests (``Request.demand_rows``), against the rows
    the store has free (App. B.4 in rows). See the module docstring for the rules."""

    def __init__(self, store: KVStore, costs: PayloadCosts) -> None:
        self.store = store
        self.costs = costs
        self.shed_events = 0  # times a request outgrew its reservation with no rows left

    def _held(self, seq_id: str) -> np.ndarray:
        store = self.store
        return store.held_rows(seq_id) if store.has_sequence(seq_id) else np.zeros((2, 3), int)

    def spare(self, live: Sequence[Any]) -> np.ndarray:
        """``[2, 3]`` free rows that no running request still has coming to it."""
        owed = sum(
            (np.maximum(r.demand_rows - self._held(r.state.seq_id), 0) for r in live),
            np.zeros((2, 3), np.int64),
        )
        return self.store.pools.free_rows() - owed

    def admits(self, r: Any, live: Sequence[Any]) -> bool:
        """The request's rows not yet held (a kept conversation holds some) fit the spare."""
        need = r.demand_rows - self._held(r.state.seq_id)
        return bool((need <= self.spare(live)).all())

    def split_for(self, queue: Sequence[Any], capacity_bytes: int) -> None:
        """Re-split an empty store in proportion to the queued requests that fit together."""
        total, used = np.zeros((2, 3), np.int64), 0
        for r in queue:
            if r.demand_rows is None or used + r.demand_bytes > capacity_bytes:
                break
            total, used = total + r.demand_rows, used + r.demand_bytes
        if used:
            rows = split_rows(capacity_bytes, self.store.layout, tuple(total[0]), tuple(total[1]))
            if rows != self.store.pools.rows:
                self.store.resplit(rows)

    def make_room(self, r: Any, new_tokens: int, live: Sequence[Any]) -> None:
        """Before a decode step of ``new_tokens``, make request ``r``'s reservation cover
        what it may hold after it: grown from spare rows, or by shedding its own tokens."""
        seq = r.state.seq_id
        need = np.maximum(self.store.rows_after_step(seq, new_tokens) - r.demand_rows, 0)
        if not need.any():
            return
        spare = np.maximum(self.spare(live), 0)
        grow = np.minimum(need, spare)
        r.demand_rows = r.demand_rows + grow
        short = need - grow
        if short.any():
            self.shed_events += 1
            for d in shed(self.store, seq, short, spare[1] - grow[1]):
                self.store.demote(seq, d.group, d.positions, d.action)
                r.shed_rows += len(d.positions)
                if d.action == Action.L:  # quantized rows came out of the spare low rows
                    r.demand_rows[1, d.group] += len(d.positions)
        r.demand_bytes = rows_bytes(r.demand_rows, self.costs)
