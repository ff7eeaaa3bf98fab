"""The async face of the runtime: ``async with Runtime.open(...) as rt: await rt.call(...)``.

One worker task owns the engine; each step runs in a worker thread so the event loop stays
free to accept, stream and cancel requests while the model computes. Requests talk to the
worker through the engine's inbox and a per-request memory stream of events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pask_agent.errors import ConfigError, PaskError, PolicyTableError
from pask_agent.grammars.span_labels import CharSpan
from pask_agent.policy import full, pask, streaming  # noqa: F401 - registers the policies
from pask_agent.policy.base import Policy, PolicyEnv
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.registry import get_policy
from pask_agent.policy.tokenizer_hash import tokenizer_hash
from pask_agent.record.traces import ModelId
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.conversation import Conversation
from pask_agent.runtime.engine import Engine
from pask_agent.runtime.limits import check_budget
from pask_agent.runtime.models.identity import model_id_of, model_identity
from pask_agent.runtime.models.loading import LoadedModel, load_model
from pask_agent.runtime.models.weight_formats import DEFAULT_WEIGHTS
from pask_agent.runtime.requests import Failed, Request, SamplingParams
from pask_agent.runtime.turns.constraint import OutputSpec
from pask_agent.runtime.turns.outputs import OutputCompiler
from pask_agent.runtime.turns.prompting import prepare_turn
from pask_agent.runtime.turns.results import ChatResult, Delta, Finished
from pask_agent.runtime.turns.structured import StructuredSchema
from pask_agent.runtime.turns.turn import TurnRequest
from pask_agent.runtime.turns.turn_output import chat_result, record_turn


class Runtime:
    """Serves one model: batched constrained decoding over the PASK KV store."""

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        policy: str | Policy = "full",
        budget: float | None = None,
        config: RuntimeConfig | None = None,
    ) -> None:
        self.default_budget = check_budget(budget)  # before the seconds of setup below
        self.engine = Engine(loaded, config)
        self.tokenizer = loaded.tokenizer
        vocab = self.engine.vocab_size
        self.outputs = loaded.shared(
            ("outputs", vocab), lambda: OutputCompiler(loaded.tokenizer, vocab)
        )
        self.default_policy = _resolve_policy(policy)
        lay = self.engine.layout
        self.costs = PayloadCosts.from_dims(lay.num_layers, lay.num_kv_heads, lay.head_dim)
        self._wake = anyio.Event()
        self._conversations: dict[str, Conversation] = {}
        self._loaded = loaded
        self._model_id: ModelId | None = None
        self._memo: dict[str, Any] = {}

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        model: str | LoadedModel = "default",
        *,
        policy: str | Policy = "full",
        budget: float | None = None,
        config: RuntimeConfig | None = None,
    ) -> AsyncIterator[Runtime]:
        check_budget(budget)  # before loading a model for a call that must fail
        weights = (config or RuntimeConfig()).weights or DEFAULT_WEIGHTS
        loaded = (
            model
            if isinstance(model, LoadedModel)
            else await anyio.to_thread.run_sync(partial(load_model, model, weights=weights))
        )
        rt = cls(loaded, policy=policy, budget=budget, config=config)
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(rt._worker)
            try:
                yield rt
            except Exception as exc:  # noqa: BLE001 - re-raised as is, below
                failure = exc
            finally:
                tg.cancel_scope.cancel()
        if failure is not None:
            # Outside the task group, so a caller catches SchemaError, not an ExceptionGroup.
            raise failure

    # ------------------------------------------------------------------ worker
    async def _worker(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            while self.engine.has_work():
                events = await anyio.to_thread.run_sync(self.engine.step)
                for request, event in events:
                    send: MemoryObjectSendStream = request.channel  # type: ignore[attr-defined]
                    try:
                        send.send_nowait(event)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        request.cancelled = True

    def _served_identity(self) -> tuple[str | None, str | None]:
        # What a frozen policy table must have been calibrated for: the model's upstream name
        # and its tokenizer's hash (computed once; a tokenizer without a tokenizer.json cannot
        # be identified and is left unchecked).
        if "identity" not in self._memo:
            try:
                tok_hash: str | None = tokenizer_hash(self.tokenizer)
            except PolicyTableError:
                tok_hash = None
            self._memo["identity"] = (model_id_of(self._loaded), tok_hash)
        return self._memo["identity"]

    def _session(
        self,
        chosen: Policy,
        budget: float | None,
        spec: OutputSpec | None = None,
        max_new_tokens: int | None = None,
    ) -> Any:
        """A policy session for one request (the ledger's owner), on this model's costs; the
        stage budgets are solved for the answer length the request allows."""
        env = PolicyEnv(
            self.costs,
            self.engine.config.sinks,
            self.engine.config.window,
            self.default_budget if budget is None else check_budget(budget),
            *self._served_identity(),
            answer_family=None if spec is None else spec.tag_family,
            max_new_tokens=max_new_tokens,
        )
        return chosen.start(env)

    def _submit(self, request: Request) -> MemoryObjectReceiveStream:
        send, receive = anyio.create_memory_object_stream[Any](max_buffer_size=float("inf"))
        request.channel = send  # type: ignore[attr-defined]
        self.engine.inbox.append(request)
        self._wake.set()
        return receive

    # ------------------------------------------------------------------ public API
    @property
    def model_id(self) -> ModelId:
        """Which weights this runtime serves (name + SHA-256), as traces and tables record."""
        if self._model_id is None:
            self._model_id = model_identity(self._loaded.name, self._loaded.path)
        return self._model_id

    def prepare(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[Any] | None,
        tool_choice: str,
        parallel_tool_calls: bool,
        labels: bool,
        label_spans: Callable[[str], list[CharSpan]] | None = None,
    ) -> tuple[list[int], list[str] | None, OutputSpec]:
        """Render the prompt, label its spans, and pick the output grammar
        (``runtime/turns/prompting.py``, which calibration replays traces through as well)."""
        turn = prepare_turn(
            self.tokenizer, self.outputs, messages, tools, tool_choice, parallel_tool_calls,
            labels=labels, label_spans=label_spans,
        )  # fmt: skip
        return turn.prompt_ids, turn.labels, turn.spec

    def prompt_tokens(self, turn: TurnRequest) -> int:
        """The tokens a turn's prompt renders to: what usage reports for a turn cut (by a stop
        sequence or a timeout) before the runtime's own result came."""
        tools = list(turn.tools) if turn.tools is not None else None
        ids, _, _ = self.prepare(
            turn.messages, tools, turn.tool_choice, turn.parallel_tool_calls, labels=False
        )
        return len(ids)

    async def chat(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        conversation: Conversation | None = None,
        **options: Any,
    ) -> ChatResult:
        """One assistant turn; ``options`` are :class:`TurnRequest`'s fields (``tools``,
        ``tool_choice``, ``policy``, ``budget``, ``max_new_tokens``, ...). Tool calls come back
        in ``result.message["tool_calls"]``."""
        return await self.chat_turn(TurnRequest.of(messages, **options), conversation=conversation)

    async def chat_turn(
        self, turn: TurnRequest, *, conversation: Conversation | None = None
    ) -> ChatResult:
        """:meth:`chat` for a ready ``TurnRequest`` (what the server and LangChain build)."""
        result = None
        async for item in self.stream_turn(turn, conversation=conversation, with_result=True):
            if isinstance(item, ChatResult):
                result = item
        if result is None:
            raise PaskError("the request ended without a result")
        return result

    async def stream(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        conversation: Conversation | None = None,
        with_result: bool = False,
        **options: Any,
    ) -> AsyncIterator[Delta | ChatResult]:
        """Yield ``Delta`` pieces as tokens are accepted (and the ``ChatResult`` if asked);
        ``options`` as for :meth:`chat`."""
        turn = TurnRequest.of(messages, **options)
        async for item in self.stream_turn(
            turn, conversation=conversation, with_result=with_result
        ):
            yield item

    async def stream_turn(
        self,
        turn: TurnRequest,
        *,
        conversation: Conversation | None = None,
        with_result: bool = False,
    ) -> AsyncIterator[Delta | ChatResult]:
        """Serve one turn: the policy is resolved and the prompt planned once, here.

        ``turn.record_traces`` appends this turn to a trace file (default:
        ``RuntimeConfig.record_traces``)."""
        params = SamplingParams(
            turn.max_new_tokens, turn.temperature, turn.top_p, turn.seed, turn.ignore_eos
        )
        chosen = self.default_policy if turn.policy is None else _resolve_policy(turn.policy)
        tools = list(turn.tools) if turn.tools is not None else None
        ids, labels, tool_spec = self.prepare(
            turn.messages, tools, turn.tool_choice, turn.parallel_tool_calls,
            chosen.needs_labels, turn.label_spans,
        )  # fmt: skip
        spec = turn.spec or tool_spec
        # the policy plans the prompt knowing which kind of answer may follow
        session = self._session(chosen, turn.budget, spec, turn.max_new_tokens)
        if conversation is not None:
            state, keep = conversation._acquire(self, session), True
        else:
            state, keep = self.engine.new_sequence(session), False
        request = Request(ids, labels, spec, params, state, chosen, keep_sequence=keep)
        try:
            # never queue what cannot run, measured by what this policy would keep; the plan
            # made here is the one admission uses
            self.engine.check_request(request)
        except BaseException:
            state.busy = False
            raise
        receive = self._submit(request)
        finished = False
        try:
            async with receive:
                async for event in receive:
                    if isinstance(event, Delta):
                        yield event
                    elif isinstance(event, Failed):
                        raise event.error
                    elif isinstance(event, Finished):
                        finished = True
                        trace_file = turn.record_traces or self.engine.config.record_traces
                        if trace_file:
                            record_turn(
                                trace_file, self.model_id, turn.messages, tools, turn.tool_choice,
                                turn.parallel_tool_calls, spec, event,
                            )  # fmt: skip
                        if with_result:
                            yield chat_result(event, spec)
                        return
        finally:
            if not finished:
                # The engine drops a cancelled request before it admits anything new, so the
                # conversation is free for its next turn right away.
                request.cancelled = True
                state.busy = False
                self._wake.set()

    async def call(
        self,
        schema: Any,
        prompt: str,
        *,
        policy: str | Policy | None = None,
        budget: float | None = None,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        seed: int | None = None,
        system: str | None = None,
        with_usage: bool = False,
    ) -> Any:
        """Structured output: a Pydantic model class → a validated instance; a JSON Schema dict
        → a validated dict; a list of tools → the list of ``ToolCall`` the model made.

        ``with_usage=True`` returns ``(value, usage)``: tokens, measured KV bytes and B, and
        the generated tokens per structural bucket (``usage.tag_counts``)."""
        kw = dict(
            policy=policy,
            budget=budget,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=seed,
        )
        if isinstance(schema, (list, tuple)):
            messages = _messages(system, prompt)
            result = await self.chat(messages, tools=schema, tool_choice="required", **kw)
            calls = list(result.tool_calls)
            return (calls, result.usage) if with_usage else calls
        structured = StructuredSchema.of(schema)
        spec = self.outputs.json_schema(structured.json_schema)
        messages = _messages(system, structured.prompt(prompt))
        result = await self.chat(messages, spec=spec, **kw)
        value = structured.value(result)
        return (value, result.usage) if with_usage else value

    def end_conversation(self, conversation_id: str) -> None:
        """Forget a conversation and free its KV (at the engine's next step)."""
        conv = self._conversations.pop(conversation_id, None)
        if conv is None or conv._state is None:
            return
        if conv._state.busy:
            raise ConfigError(
                f"conversation {conversation_id!r} has a turn running; await it first"
            )
        self.engine.retire(conv._state)
        self._wake.set()

    @property
    def conversation_ids(self) -> tuple[str, ...]:
        """Ids of the conversations that may hold KV now (until ``end_conversation``)."""
        return tuple(self._conversations)

    def check_policy(self, policy: str | Policy | None = None, budget: float | None = None) -> None:
        """Start a policy session as a request would and drop it, so a policy that cannot serve
        this model (a table calibrated for other weights) fails now, not on every request.

        Raises
        ------
        ConfigError
            Unknown policy name or a budget outside (0, 1].
        PolicyTableError
            The policy's table names another model or tokenizer.
        """
        self._session(self.default_policy if policy is None else _resolve_policy(policy), budget)

    @property
    def queue_depth(self) -> int:
        """Requests made and waiting for admission (a batch slot or KV room); a server reads
        it to refuse work when its queue is full. Safe to read while a step runs."""
        return len(self.engine.inbox)

    @property
    def live_requests(self) -> int:
        """Requests admitted and decoding now (at most ``RuntimeConfig.max_batch``)."""
        return len(self.engine.live)

    def kv_bytes(self) -> tuple[int, int]:
        """``(live, allocated)`` KV bytes of the store now: the payload every sequence holds
        (high + low + scales) and the pools' own size (capacity, free slots included). Read
        without stopping the engine, so a value taken during a step may be one step old."""
        store = self.engine.store
        return store.live_bytes(), store.allocated_bytes()

    def conversation(self, conversation_id: str) -> Conversation:
        """A multi-turn conversation that keeps its KV and budget ledger across turns."""
        if conversation_id not in self._conversations:
            self._conversations[conversation_id] = Conversation(conversation_id, owner=self)
        return self._conversations[conversation_id]


def _resolve_policy(policy: str | Policy) -> Policy:
    if isinstance(policy, Policy):
        return policy
    return get_policy(policy)()


def _messages(system: str | None, prompt: str) -> list[dict[str, Any]]:
    msgs = [{"role": "system", "content": system}] if system else []
    return [*msgs, {"role": "user", "content": prompt}]
