"""What a request reserves of the KV capacity: what its policy will keep (paper App. B.4).

A request's demand, in payload bytes, is

    kept + plan + ⌈b · max_new_tokens⌉ + (window + 1) · (C_full − c_min) + ⌈Γ_max⌉

* ``kept``: what its conversation's sequence already holds (0 for a fresh request);
* ``plan``: the prefill plan of the new prompt tokens, ``Σ_t M(a_t)``, sinks at ``H`` (the store
  keeps them high whatever was planned);
* ``b = B_D · C_full``: the decode allowance per generated token (App. B.6);
* the recent window, plus the token being written, sits high whatever its tokens will settle
  to: ``c_min`` is the least a token of this request can cost (``C_full`` for Full KV, so a
  Full-KV request reserves exactly ``(prompt + max_new_tokens) · C_full`` as before);
* ``Γ_max``: the largest decode reserve, how far floors may run ahead of the allowance.

A session states its decode side with ``decode_demand(costs)``; a session that states nothing
is reserved at Full KV. A request that still outgrows its reservation (floor debt beyond the
reserve) first takes unreserved capacity; without any, the engine sheds its own settled
tokens (:func:`shed`), so live bytes never pass the capacity and nothing crashes.

Not counted: a conversation kept between turns holds its bytes outside any reservation until
its next turn is admitted (its demand then includes them) or it ends.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pask_agent.policy.actions import Action
from pask_agent.policy.base import Actions, DecodeDemand, Demotion
from pask_agent.policy.costs import PayloadCosts
from pask_agent.runtime.kv_store import KVStore


def decode_demand(session: Any, costs: PayloadCosts) -> DecodeDemand:
    """The session's own statement, or Full KV for a session that makes none."""
    declared = getattr(session, "decode_demand", None)
    return declared(costs) if callable(declared) else DecodeDemand.full(costs)


def request_demand(
    plan: Sequence[Actions],
    decode: DecodeDemand,
    costs: PayloadCosts,
    *,
    start: int,
    sinks: int,
    window: int,
    max_new_tokens: int,
    kept_bytes: int = 0,
) -> int:
    """Bytes to reserve for a request whose new prompt tokens start at position ``start``."""
    full = costs.full_bytes_per_token
    cost = np.asarray(costs.bytes_by_group, dtype=np.int64)  # [g, 3]
    acts = np.asarray([[int(a) for a in row] for row in plan], dtype=np.int64).reshape(-1, 3)
    per_token = cost[np.arange(3), acts].sum(axis=1)  # [n]
    per_token[: max(0, sinks - start)] = full
    c_min = min(decode.min_token_bytes, int(per_token.min()) if len(per_token) else full)
    prompt = int(per_token.sum())
    generated = math.ceil(decode.bytes_per_token * max_new_tokens)
    return (
        kept_bytes
        + prompt
        + generated
        + (window + 1) * (full - c_min)
        + math.ceil(decode.reserve_bytes)
    )


def shed(store: KVStore, seq_id: str, need_bytes: int, costs: PayloadCosts) -> list[Demotion]:
    """Demotions of a sequence's settled tokens that free at least ``need_bytes`` (or all).

    The last resort of a request past its reservation with no capacity left: oldest tokens
    first, every group quantized (H→L) before anything is released (L→R), floors ignored.
    Sinks and the recent window stay (the store protects them).
    """
    settled, sinks = store.settled(seq_id), store.config.sinks
    out: list[Demotion] = []
    low: list[list[int]] = []
    for g in range(3):
        held_high, held_low = store.retained(seq_id, g)
        high = sorted(p for p in held_high if sinks <= p < settled)
        save = costs.cost(Action.H, g) - costs.cost(Action.L, g)
        take = high[: max(0, math.ceil(need_bytes / save))] if save > 0 else []
        if take:
            out.append(Demotion(g, tuple(take), Action.L))
            need_bytes -= save * len(take)
        low.append(sorted([*(p for p in held_low if p < settled), *take]))
    for g in range(3):
        save = costs.cost(Action.L, g)
        if need_bytes <= 0 or save <= 0:
            break
        take = low[g][: math.ceil(need_bytes / save)]
        if take:
            out.append(Demotion(g, tuple(take), Action.R))
            need_bytes -= save * len(take)
    return out


class Reservations:
    """The KV bytes promised to admitted requests, against ``capacity`` (App. B.4).

    A request reserves its demand at admission and gives it back when it ends. A decoding
    request that outgrows its reservation takes unreserved capacity first and, with none left,
    sheds its own oldest settled tokens (:func:`shed`): never past the capacity, never a crash.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.reserved = 0
        self.shed_events = 0  # times a request outgrew its reservation with no capacity left

    def admits(self, demand: int, *, running: bool) -> bool:
        """A request fits next to the running ones (one alone always runs: it was checked
        against the whole capacity before it queued)."""
        return not running or self.reserved + demand <= self.capacity

    def make_room(
        self, store: KVStore, seq_id: str, reservation: int, new_bytes: int, costs: PayloadCosts
    ) -> int:
        """The request's reservation once ``new_bytes`` more fit in it (grown, or kept after
        shedding its own settled tokens)."""
        over = store.report(seq_id).live_bytes + new_bytes - reservation
        if over <= 0:
            return reservation
        grow = min(over, max(0, self.capacity - self.reserved))
        self.reserved += grow
        if over > grow:
            self.shed_events += 1
            for d in shed(store, seq_id, over - grow, costs):
                store.demote(seq_id, d.group, d.positions, d.action)
        return reservation + grow
