"""The async face of the runtime: ``async with Runtime.open(...) as rt: await rt.call(...)``.

One worker task owns the engine; each step runs in a worker thread so the event loop stays
free to accept, stream and cancel requests while the model computes. Requests talk to the
worker through the engine's inbox and a per-request memory stream of events.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Unpack

import anyio
import jsonschema
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pask_agent.calibration.traces import ModelId
from pask_agent.errors import ConfigError, PaskError, PolicyTableError, ValidationFailedError
from pask_agent.grammars.span_labels import CharSpan
from pask_agent.policy import full, pask, streaming  # noqa: F401 - registers the policies
from pask_agent.policy.base import Policy, PolicyEnv
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.registry import get_policy
from pask_agent.policy.table import tokenizer_hash
from pask_agent.runtime.constraint import OutputSpec
from pask_agent.runtime.conversation import Conversation, TurnOptions
from pask_agent.runtime.engine import (
    Engine,
    Failed,
    Finished,
    Request,
    RuntimeConfig,
    SamplingParams,
    SequenceState,
)
from pask_agent.runtime.limits import check_budget
from pask_agent.runtime.models import LoadedModel, load_model, model_id_of
from pask_agent.runtime.outputs import OutputCompiler, schema_prompt
from pask_agent.runtime.prompting import prepare_turn
from pask_agent.runtime.results import ChatResult, Delta
from pask_agent.runtime.turn_output import chat_result, record_turn


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
        self.outputs = OutputCompiler(loaded.tokenizer, self.engine.vocab_size)
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
        loaded = (
            model
            if isinstance(model, LoadedModel)
            else await anyio.to_thread.run_sync(load_model, model)
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
        policy: str | Policy | None,
        budget: float | None,
        spec: OutputSpec | None = None,
        max_new_tokens: int | None = None,
    ) -> Any:
        chosen = self.default_policy if policy is None else _resolve_policy(policy)
        env = PolicyEnv(
            self.costs,
            self.engine.config.sinks,
            self.engine.config.window,
            self.default_budget if budget is None else check_budget(budget),
            *self._served_identity(),
            answer_family=None if spec is None else spec.tag_family,
            max_new_tokens=max_new_tokens,
        )
        return chosen, chosen.start(env)

    def _request(
        self,
        prompt_ids: list[int],
        labels: list[str] | None,
        spec: OutputSpec,
        params: SamplingParams,
        state: SequenceState,
        keep: bool,
        policy: Policy,
    ) -> tuple[Request, MemoryObjectReceiveStream]:
        send, receive = anyio.create_memory_object_stream[Any](max_buffer_size=float("inf"))
        request = Request(prompt_ids, labels, spec, params, state, policy, keep_sequence=keep)
        request.channel = send  # type: ignore[attr-defined]
        self.engine.inbox.append(request)
        self._wake.set()
        return request, receive

    # ------------------------------------------------------------------ public API
    @property
    def model_id(self) -> ModelId:
        """Which weights this runtime serves (name + SHA-256), as traces and tables record."""
        if self._model_id is None:
            self._model_id = ModelId.of(self._loaded)
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
        (``runtime/prompting.py``, which calibration replays traces through as well)."""
        turn = prepare_turn(
            self.tokenizer, self.outputs, messages, tools, tool_choice, parallel_tool_calls,
            labels=labels, label_spans=label_spans,
        )  # fmt: skip
        return turn.prompt_ids, turn.labels, turn.spec

    async def chat(
        self, messages: Sequence[dict[str, Any]], **options: Unpack[TurnOptions]
    ) -> ChatResult:
        """One assistant turn (options as for :meth:`stream`). Tool calls come back in
        ``result.message["tool_calls"]``."""
        result = None
        async for item in self.stream(messages, with_result=True, **options):
            if isinstance(item, ChatResult):
                result = item
        if result is None:
            raise PaskError("the request ended without a result")
        return result

    async def stream(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: Sequence[Any] | None = None,
        tool_choice: str = "auto",
        parallel_tool_calls: bool = True,
        policy: str | Policy | None = None,
        budget: float | None = None,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        conversation: Conversation | None = None,
        spec: OutputSpec | None = None,
        label_spans: Callable[[str], list[CharSpan]] | None = None,
        ignore_eos: bool = False,
        record_traces: str | None = None,
        with_result: bool = False,
    ) -> AsyncIterator[Delta | ChatResult]:
        """Yield ``Delta`` pieces as tokens are accepted (and the ``ChatResult`` if asked).

        ``record_traces`` appends this turn to a trace file (default:
        ``RuntimeConfig.record_traces``)."""
        params = SamplingParams(max_new_tokens, temperature, top_p, seed, ignore_eos)
        chosen = self.default_policy if policy is None else _resolve_policy(policy)
        ids, labels, tool_spec = self.prepare(
            messages, tools, tool_choice, parallel_tool_calls, chosen.needs_labels, label_spans
        )
        spec = spec or tool_spec
        # the policy plans the prompt knowing which kind of answer may follow
        chosen, session = self._session(chosen, budget, spec, max_new_tokens)
        # never queue what cannot run, measured by what this policy would keep
        self.engine.check_request(len(ids), max_new_tokens, session, labels)
        if conversation is not None:
            state = conversation._acquire(self, session)
            keep = True
        else:
            state, keep = self.engine.new_sequence(session), False
        request, receive = self._request(ids, labels, spec, params, state, keep, chosen)
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
                        trace_file = record_traces or self.engine.config.record_traces
                        if trace_file:
                            record_turn(
                                trace_file, self.model_id, messages, tools, tool_choice,
                                parallel_tool_calls, spec, event,
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
        model_cls = schema if _is_pydantic_class(schema) else None
        if model_cls is not None:
            json_schema = model_cls.model_json_schema()
        elif isinstance(schema, dict):
            json_schema = schema
        else:
            raise ConfigError(
                "schema must be a Pydantic model class, a JSON Schema dict, or a "
                f"list of tools; got {type(schema).__name__}"
            )
        spec = self.outputs.json_schema(json_schema)
        # the field list after the request: the small default model follows it best there
        messages = _messages(system, f"{prompt}\n\n{schema_prompt(json_schema)}")
        result = await self.chat(messages, spec=spec, **kw)
        try:
            value = json.loads(result.text)
            if model_cls is not None:
                value = model_cls.model_validate(value)
            else:
                jsonschema.validate(value, json_schema)
        except Exception as exc:  # noqa: BLE001 - re-raised typed, with the answer attached
            raise ValidationFailedError(
                f"answer does not validate ({exc}); raise max_new_tokens if it was cut "
                f"(finish_reason={result.finish_reason}): {result.text[:200]!r}"
            ) from exc
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
        self._session(policy, budget)

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


def _is_pydantic_class(obj: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(obj, type) and issubclass(obj, BaseModel)
