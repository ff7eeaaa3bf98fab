"""The synchronous engine core: admission, one batched step, sampling, policy hooks.

``Engine.step()`` is the whole decode loop body and reads in one sitting:

1. admit queued requests while what their policies will keep fits the preallocated pools
   (``runtime/memory/admission.py``: rows per pool; an empty store is re-split to fit them);
2. pack one chunk per live request on one token axis — the next slice of a prompt that is
   still prefilling (chunked, so long prompts never stall the others for long), or the token(s)
   sampled last step (held back while prompts prefill under ``schedule="prefill_first"``);
3. make room for decode rows past their reservation, then ``store.begin_step`` → one model
   forward → ``store.end_step`` (each chunk settles into its planned form as it is written);
4. for every request whose logits are ready: grammar mask → sample → matcher accept → tag →
   policy ``on_token`` → schedule the token's per-group actions in the store; jump-forward text
   forced by the grammar is appended without sampling.

A request admitted while another one prefills the same prompt under the same plan does not
compute it: it copies that one's KV and logits when its prefill ends (``_join``).

The async ``Runtime`` runs ``step`` in a worker thread and routes the returned events.
"""

from __future__ import annotations

import itertools
import time
from collections import deque

import torch

from pask_agent.errors import PaskError
from pask_agent.grammars.token_text import TokenTextStream
from pask_agent.policy.base import PolicySession, session_revises
from pask_agent.policy.costs import PayloadCosts
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.limits import check_context, check_kv_capacity
from pask_agent.runtime.logit_masks import LogitMasks
from pask_agent.runtime.memory.admission import (
    Reservations,
    default_capacity_bytes,
    kept_rows,
    plan_rows,
    rows_bytes,
)
from pask_agent.runtime.memory.history_plan import history_demotions
from pask_agent.runtime.memory.host_memory import retain_freed_host_memory
from pask_agent.runtime.memory.kv_layout import KVLayout, StoreConfig
from pask_agent.runtime.memory.kv_store import KVStore
from pask_agent.runtime.memory.retention import revise
from pask_agent.runtime.models.cpu_linear import prepack_linear_layers
from pask_agent.runtime.models.decoder import engine_forward
from pask_agent.runtime.models.loading import LoadedModel
from pask_agent.runtime.models.placement import place_model
from pask_agent.runtime.models.quantized_linear import require_weights
from pask_agent.runtime.requests import Event, Failed, Request, SequenceState
from pask_agent.runtime.turns.constraint import tag_key
from pask_agent.runtime.turns.results import Delta, Finished
from pask_agent.runtime.turns.sampling import sample

__all__ = ["Engine"]


class Engine:
    """Owns the model, the KV store and the live requests. Not thread-safe: one caller."""

    def __init__(self, loaded: LoadedModel, config: RuntimeConfig | None = None) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.config = config or RuntimeConfig()
        self.layout = lay = KVLayout.from_config(self.model.config)
        self.costs = PayloadCosts.from_dims(lay.num_layers, lay.num_kv_heads, lay.head_dim)
        # positions past the trained context give garbage: requests must fit (runtime/limits.py)
        self.context_tokens = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        cfg = self.config
        require_weights(loaded.weights, cfg.weights or loaded.weights)
        self.device = place_model(self.model, cfg.device)
        if cfg.retain_host_memory:
            retain_freed_host_memory()
        if cfg.onednn_linear:
            prepack_linear_layers(self.model)  # CPU fp32 layers only; a GPU model is left as is
        self.capacity_bytes = cfg.kv_capacity_bytes or default_capacity_bytes(
            self.costs, cfg.max_batch, self.context_tokens
        )
        store_config = StoreConfig(cfg.sinks, cfg.window, attention_backend=cfg.attention_backend)
        offsets = loaded.key_offsets if cfg.center_keys else None
        self.store = KVStore(lay, store_config, self.device, self.capacity_bytes, offsets)
        self.forward = engine_forward(loaded, self.store)  # decoder.py: written out, or the seam
        self.vocab_size = int(self.model.config.vocab_size)
        self.masks = loaded.shared(
            ("masks", self.vocab_size, cfg.continue_calls_at),
            lambda: LogitMasks(self.tokenizer, self.vocab_size, cfg.continue_calls_at),
        )
        self.stop_ids = self.masks.stop_ids
        self.inbox: deque[Request] = deque()
        self._retired: deque[SequenceState] = deque()
        self.live: list[Request] = []
        self.reservations = Reservations(self.store, self.costs)
        self._ids = itertools.count()

    @property
    def shed_events(self) -> int:
        """Times a request outgrew its reservation with no capacity left (it shed tokens)."""
        return self.reservations.shed_events

    def new_sequence(self, session: PolicySession) -> SequenceState:
        return SequenceState(f"seq-{next(self._ids)}", session)

    def check_request(self, r: Request) -> None:
        """Refuse, before it queues, a request that could never run (``runtime/limits.py``).

        Plans its prompt as a fresh one, which is its demand alone; admission keeps this plan
        unless the request turns out to reuse a conversation's prefix (then it plans again,
        for the tokens it reuses). Called on the caller's thread: it reads no store state.

        Raises
        ------
        RequestTooLargeError
            It exceeds the model's context or, alone, ``kv_capacity_bytes``.
        """
        check_context(len(r.prompt_ids), r.params.max_new_tokens, self.context_tokens)
        self._plan(r, keep=0)
        check_kv_capacity(r.demand_bytes, self.capacity_bytes)

    def run(self, requests: list[Request]) -> list[Finished | Failed]:
        """Queue ``requests`` and step until every one has ended; their ends, in order.

        The synchronous face of the same loop the async ``Runtime`` drives (``pask-agent
        generate``, parity checks): there is one decode loop, ``step``.
        """
        ends: dict[int, Finished | Failed] = {}
        self.inbox.extend(requests)
        while any(id(r) not in ends for r in requests) and self.has_work():
            for r, event in self.step():
                if isinstance(event, (Finished, Failed)):
                    ends[id(r)] = event
        if len(ends) < len(requests):
            raise PaskError("a request was cancelled before it ran; it has no result")
        return [ends[id(r)] for r in requests]

    def has_work(self) -> bool:
        return bool(self.inbox or self.live or self._retired)

    def retire(self, state: SequenceState) -> None:
        """Free a kept sequence (an ended conversation) at the next step; thread-safe."""
        self._retired.append(state)

    def _admit(self, events: list[Event]) -> None:
        while self.inbox and len(self.live) < self.config.max_batch:
            r = self.inbox[0]
            if r.cancelled:
                self.inbox.popleft()
                continue
            try:
                check_kv_capacity(self._reserve_for(r), self.capacity_bytes)
                if not self.store.num_sequences:
                    self._resplit()
            except PaskError as exc:  # the Runtime refuses these before they queue
                self.inbox.popleft()
                events.append((r, Failed(exc)))
                continue
            if not self.reservations.admits(r, self.live):
                idle = [s for s in self.store.sequence_ids() if s != r.state.seq_id]
                if self.live or not (idle or self.store.num_sequences):
                    return  # wait until running requests free their rows
                self.store.remove_sequence((idle or [r.state.seq_id])[0])  # evict idle KV
                continue
            self.inbox.popleft()
            try:
                self._start(r)
            except PaskError as exc:
                events.append((r, Failed(exc)))
                continue
            self.live.append(r)

    def _resplit(self) -> None:
        """Split an empty store's pools for the requests at the head of the queue."""
        waiting: list[Request] = []
        for q in [q for q in self.inbox if not q.cancelled][: self.config.max_batch]:
            try:
                self._reserve_for(q)
            except PaskError:  # it fails on its own turn at the head of the queue
                break
            waiting.append(q)
        self.reservations.split_for(waiting, self.capacity_bytes)

    def _reuse(self, r: Request) -> int:
        """Prompt tokens the request's sequence already holds (a conversation's last turn)."""
        if not self.store.has_sequence(r.state.seq_id):
            return 0
        keep = _common_prefix(r.state.ids_in_store, r.prompt_ids)
        return min(keep, len(r.prompt_ids) - 1)  # at least one token must run to get logits

    def _reserve_for(self, r: Request) -> int:
        """The request's demand: its plan, made again only if its reuse changed."""
        keep = self._reuse(r)
        if r.plan is None or r.plan_keep != keep:
            self._plan(r, keep)
        return r.demand_bytes

    def _plan(self, r: Request, keep: int) -> None:
        """Plan the whole prompt (the ``keep`` reused tokens included) and reserve its rows."""
        st, cfg = r.state, self.config
        labels = r.labels or ["protected_content"] * len(r.prompt_ids)
        rows, r.plan = plan_rows(
            st.session, labels, r.params.max_new_tokens, self.costs, cfg.sinks, cfg.window, keep
        )
        replans = r.labels is not None and r.policy.needs_labels  # history_plan.py
        r.demand_rows = rows + kept_rows(self.store, st.seq_id, keep, replans=replans)
        r.demand_bytes = rows_bytes(r.demand_rows, self.costs)
        r.plan_keep = keep

    def _start(self, r: Request) -> None:
        st = r.state
        keep = self._reuse(r)
        if not self.store.has_sequence(st.seq_id):
            centered = self.config.center_keys and r.policy.stores_int4
            self.store.add_sequence(st.seq_id, centered=centered, track_keys=r.policy.needs_keys)
            st.ids_in_store = []
        self.store.truncate(st.seq_id, keep)
        st.ids_in_store = st.ids_in_store[:keep]
        r.prefill_pos = r.reused = keep
        if r.plan is None or r.plan_keep != keep:
            self._plan(r, keep)
        plan = r.plan or []
        if keep and r.labels is not None and r.policy.needs_labels:  # history_plan.py
            for d in history_demotions(self.store, st.seq_id, plan, keep):
                self.store.demote(st.seq_id, d.group, d.positions, d.action)
        self.store.schedule_many(st.seq_id, keep, plan[keep:])
        # the same prompt under the same plan, still prefilling: copy it then (_join)
        r.leader = None if keep else next((q for q in self.live if r.may_copy(q)), None)
        r.constraint = r.spec.start()
        r.stream = TokenTextStream(self.tokenizer)
        if r.params.seed is not None:
            r.generator = torch.Generator().manual_seed(r.params.seed)

    def _join(self, batch: list[tuple[Request, bool]], logits: torch.Tensor) -> torch.Tensor:
        """Followers whose leader's prompt was completed this step take a copy of its KV and
        of its logits row, and join the batch as ready; the logits, with their rows added."""
        if not any(r.leader is not None for r in self.live):
            return logits  # the usual step: nobody waits on a prompt
        done = {id(r): row for row, (r, ready) in enumerate(batch) if ready and not r.generated}
        rows = []
        for f in self.live:
            if (leader := f.leader) is None or id(leader) not in done:
                continue
            self.store.copy_sequence(leader.state.seq_id, f.state.seq_id)
            f.state.ids_in_store = list(f.prompt_ids)
            f.prefill_pos = f.reused = len(f.prompt_ids)  # usage: none of it was computed
            f.leader = None
            batch.append((f, True))
            rows.append(done[id(leader)])
        return torch.cat([logits, logits[rows]]) if rows else logits

    @torch.inference_mode()
    def step(self) -> list[Event]:
        events: list[Event] = []
        for r in [r for r in self.live if r.cancelled]:
            self._release(r, drop_sequence=True)
        while self._retired:
            st = self._retired.popleft()
            if self.store.has_sequence(st.seq_id):
                self.store.remove_sequence(st.seq_id)
            st.ids_in_store = []
        self._admit(events)
        if not self.live:
            return events
        try:
            return events + self._step_live()
        except Exception as exc:  # noqa: BLE001 - fail the step's requests, keep serving
            # A step that raises (a store invariant, a policy hook, the forward) leaves its
            # requests half-stepped: they fail with the error itself, their sequences (every
            # row they took) are dropped, and queued requests and idle conversations, which
            # the step never touched, are served on. Raising instead ended the Runtime's
            # worker, and every caller saw a cancellation instead of this error (issue 34).
            for r in list(self.live):
                self._release(r, drop_sequence=True)
                events.append((r, Failed(exc)))
            return events

    def _step_live(self) -> list[Event]:
        """One batched step of the live requests (steps 2-4 of the module docstring)."""
        events: list[Event] = []
        budget = self.config.prefill_chunk_tokens
        chunks: list[tuple[str, int]] = []
        tokens: list[int] = []
        batch: list[tuple[Request, bool]] = []
        prefill_first = self.config.schedule == "prefill_first"
        hold_decoding = prefill_first and any(r.prefill_pos < len(r.prompt_ids) for r in self.live)
        for r in self.live:
            if r.leader is not None and r.leader in self.live:
                continue  # its leader's prompt KV is copied when that prefill ends (_join)
            r.leader = None  # the leader ended before its prompt did: prefill alone
            if r.prefill_pos < len(r.prompt_ids):
                if budget <= 0:
                    continue
                end = min(len(r.prompt_ids), r.prefill_pos + budget)
                obs = len(r.prompt_ids) - r.policy.observation_tokens
                if r.prefill_pos < obs < end:  # the observation window runs as its own chunk
                    end = obs
                ids = r.prompt_ids[r.prefill_pos : end]
                budget -= len(ids)
                r.prefill_pos += len(ids)
                ready = r.prefill_pos == len(r.prompt_ids)
            elif hold_decoding:
                continue
            else:
                ids, r.feed, ready = r.feed, [], True
                self.reservations.make_room(r, len(ids), self.live)
            chunks.append((r.state.seq_id, len(ids)))
            tokens.extend(ids)
            r.state.ids_in_store.extend(ids)
            batch.append((r, ready))
        want_scores = any(r.policy.needs_scores for r, _ in batch)
        step = self.store.begin_step(chunks, want_scores=want_scores)
        ids = torch.tensor(tokens, device=self.device)
        # [B, V] on the host, beside the masks, bitmasks and generators (no-op on a CPU)
        logits = self.forward(step, ids).cpu()
        self.store.end_step(step)
        logits = self._join(batch, logits)
        for r, ready in batch:
            if ready and session_revises(r.state.session):
                done, scores = r.prefill_pos >= len(r.prompt_ids), r.policy.needs_scores
                revise(
                    self.store,
                    r.state.seq_id,
                    r.state.session,
                    with_scores=scores,
                    prefill_done=done,
                )
        ready_rows = [(row, r) for row, (r, ready) in enumerate(batch) if ready]
        for row, r in ready_rows:
            if r.keep_logits:
                r.step_logits.append(logits[row].clone())
        if ready_rows:
            self.masks.apply(logits, ready_rows)
        for row, r in ready_rows:
            try:
                events.extend(self._advance(r, logits[row]))
            except Exception as exc:  # noqa: BLE001 - fail this request, keep serving the rest
                self._release(r, drop_sequence=True)
                events.append((r, Failed(exc)))
        return events

    def _advance(self, r: Request, logits: torch.Tensor) -> list[Event]:
        p = r.params
        token = sample(logits, temperature=p.temperature, top_p=p.top_p, generator=r.generator)
        if r.first_token_at is None:
            r.first_token_at = time.perf_counter()
        if token in self.stop_ids:
            r.state.session.on_token(None, is_stop=True)
            return [self._finish(r, "stop")]
        if not r.constraint.accept(token):
            raise PaskError(f"grammar rejected token {token} that its own mask allowed")
        new = [token]
        if self.config.jump_forward and len(r.generated) + 1 < p.max_new_tokens:
            new += r.constraint.accept_forced(
                self.tokenizer, p.max_new_tokens - len(r.generated) - 1
            )
        delta = []
        seq, pos = r.state.seq_id, self.store.length(r.state.seq_id)
        for i, t in enumerate(new):
            piece = r.stream.push(t)
            delta.append(piece)
            tag = r.constraint.tag(piece)
            key = tag_key(tag, r.constraint)
            r.tag_counts[key] = r.tag_counts.get(key, 0) + 1
            actions = r.state.session.on_token(tag)
            self.store.schedule(seq, pos + i, actions)
        r.generated.extend(new)
        r.feed = new
        text = "".join(delta)
        r.text += text
        events: list[Event] = [(r, Delta(text, tuple(new)))]
        if r.constraint.is_terminated():
            events.append(self._finish(r, "stop"))
        elif len(r.generated) >= p.max_new_tokens:
            events.append(self._finish(r, "length"))
        return events

    # ------------------------------------------------------------------ endings
    def _finish(self, r: Request, reason: str) -> Event:
        kv = self.store.report(r.state.seq_id, prompt_tokens=len(r.prompt_ids))
        result = r.finished(reason, kv, self.store.allocated_bytes())
        self._release(r, drop_sequence=not r.keep_sequence)
        return (r, result)

    def _release(self, r: Request, *, drop_sequence: bool) -> None:
        if r in self.live:
            self.live.remove(r)
        st = r.state
        st.busy = False
        if drop_sequence and self.store.has_sequence(st.seq_id):
            self.store.remove_sequence(st.seq_id)
            st.ids_in_store = []


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
