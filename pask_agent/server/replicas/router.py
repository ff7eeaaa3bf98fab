"""Ray Serve's request router for the replicas: a conversation stays where its KV lives.

Ray Serve calls ``choose_replicas`` for each request with the replicas that can take it and
tries the returned ranks in order, skipping a replica whose queue is full. Here the first rank
is the replica that owns the request's key (see ``routing_keys``): the one that served the
key first, or its rendezvous choice for a new key. The other replicas follow, least loaded
first, so a request is never stranded. An opening-prefix key yields to load: when its replica
has ``spill_queue`` more requests queued than the least-loaded one, the least-loaded one goes
first. A conversation key never yields to load: moving it would recompute its history and
leave its KV behind.

When a replica dies, the keys it owned are forgotten; their next requests go to a survivor,
which prefills the history the client sends (the client sees a slower turn, not an error).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from pask_agent.server.replicas.forwarding import ForwardedRequest
from pask_agent.server.replicas.routing_keys import rendezvous


class ConversationRouter(RequestRouter):
    """Sticky routing by conversation, then by opening prefix, then least-loaded."""

    def initialize_state(self, max_keys: int = 200_000, spill_queue: int = 4, **_: Any) -> None:
        self._owners: OrderedDict[str, ReplicaID] = OrderedDict()
        self._max_keys = max_keys
        self._spill_queue = spill_queue

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_load = sorted(candidate_replicas, key=self._queue_len)
        key = _key_of(pending_request)
        if key is None or not by_load:
            return [by_load]
        by_id = {r.replica_id.unique_id: r for r in by_load}
        owner = self._owners.get(key)
        first = by_id.get(owner.unique_id) if owner is not None else None
        if first is None:
            first = by_id[rendezvous(key, by_id)]  # type: ignore[index]
            if key.startswith("prefix:") and (
                self._queue_len(first) - self._queue_len(by_load[0]) >= self._spill_queue
            ):
                first = by_load[0]
        return [[first], [r for r in by_load if r is not first]]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        request = _request_of(pending_request)
        if request is None or request.route_key is None:
            return
        key = request.route_key
        if request.ends_conversation:
            self._owners.pop(key, None)
            return
        if key not in self._owners:
            self._owners[key] = replica_id
            while len(self._owners) > self._max_keys:
                self._owners.popitem(last=False)  # the oldest key: it recomputes if it returns
        self._owners.move_to_end(key)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._forget(replica_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id for r in replicas}
        for gone in {o for o in self._owners.values() if o not in live}:
            self._forget(gone)

    def _forget(self, replica_id: ReplicaID) -> None:
        for key in [k for k, o in self._owners.items() if o == replica_id]:
            del self._owners[key]

    def _queue_len(self, replica: RunningReplica) -> int:
        queued = self.replica_queue_len_cache.get(replica.replica_id)
        return 0 if queued is None else queued


def _request_of(pending: PendingRequest | None) -> ForwardedRequest | None:
    if pending is None or not pending.args:
        return None
    first = pending.args[0]
    return first if isinstance(first, ForwardedRequest) else None


def _key_of(pending: PendingRequest | None) -> str | None:
    request = _request_of(pending)
    return request.route_key if request is not None else None
