"""``PaskChatModel``: a LangChain chat model served by the local pask-agent runtime.

Why: local chat models in LangChain mostly ignore bound tools or ``tool_choice``. Here tool
calls, ``tool_choice`` and structured output are enforced by the runtime's grammars (the model
cannot produce a malformed call), and the KV cache underneath is managed by a PASK policy.

    from pask_agent.integrations.langchain import PaskChatModel
    llm = PaskChatModel(max_tokens=64).bind_tools([get_weather])
    llm.invoke("What's the weather in Paris?").tool_calls

One ``Runtime`` per model name is opened lazily and shared by every ``PaskChatModel`` in the
process (``integrations/_portal.py``). Turns whose opening messages (system prompt and first
user message) match share a runtime conversation, so each step of an agent loop reuses the KV
of the previous steps' common token prefix (``usage_metadata["input_token_details"]
["cache_read"]`` counts the reused tokens). Pass ``conversation_id=`` to choose the grouping.

Inside LangGraph (``langchain.agents.create_agent(model, tools, checkpointer=...)``) the run
config's ``thread_id`` picks the conversation instead: every turn of a thread, and every agent
step inside a turn, continues one runtime conversation with one budget ledger. A conversation
is released when its thread is deleted from the checkpointer, after ``idle_timeout_s`` without
a turn, or at once by ``end_thread(thread_id)``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from operator import itemgetter
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.chat_models import generate_from_stream
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import (
    JsonOutputKeyToolsParser,
    PydanticToolsParser,
)
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from pydantic import BaseModel, ConfigDict, PrivateAttr, field_validator

from pask_agent.errors import ConfigError, ToolChoiceError
from pask_agent.integrations._lc_messages import to_openai_messages
from pask_agent.integrations._lc_threads import langgraph_thread, thread_key
from pask_agent.integrations._lc_tools import format_tools, normalize_tool_choice
from pask_agent.integrations._lc_turn import LcTurn, conversation_key, run_turn
from pask_agent.integrations._portal import runtime_registry
from pask_agent.policy.pask import TablePaskPolicy
from pask_agent.runtime.models.quantized_linear import check_weight_format
from pask_agent.runtime.models.weight_formats import DEFAULT_WEIGHTS
from pask_agent.runtime.turns.turn import TurnRequest

_CALL_KWARGS = frozenset(
    {
        "model",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "policy",
        "budget",
        "max_tokens",
        "temperature",
        "top_p",
        "seed",
        "timeout",
        "max_retries",
        "conversation_id",
    }
)
DEFAULT_MAX_TOKENS = 256
# Small models tend to repeat a call after its result arrives; a short system line after the
# tool results turns them to answering (measured on the default model: without it the call
# repeats, with it the model answers in text).
DEFAULT_TOOL_RESULT_HINT = "Answer the user's question in plain text using the tool results above."
DEFAULT_IDLE_TIMEOUT_S = 600.0


class PaskChatModel(BaseChatModel):
    """A LangChain chat model on a local pask-agent ``Runtime`` (tool calling, JSON output).

    Parameters
    ----------
    model
        Bundled model name (``"default"``: Qwen2.5-Coder-0.5B-Instruct; ``"smollm2-135m"``), an
        HF folder or a ``.gguf`` file. A per-call ``model=`` overrides it.
    weights
        How the model's linear layers hold their weights (``RuntimeConfig.weights``:
        ``"fp32"``, ``"int8"``, ``"int4"``).
    tools, tool_choice
        ``PaskChatModel(tools=[...])`` equals ``bind_tools([...])``. ``tool_choice`` is
        ``"auto"``, ``"any"``/``"required"``, ``"none"`` or a tool name.
    policy, budget
        KV policy name (``"full"``, ``"pask"``, ``"streaming"``) and KV budget ``B`` (measured
        KV bytes / Full-KV bytes); ``None`` keeps the policy's default.
    policy_table
        A PASK table file to serve instead of the shipped one (``pask-agent calibrate``'s
        output for your own traces); it must have been calibrated for ``model``.
    conversation_id, reuse_prefix
        Runtime conversation of this call (default: the LangGraph thread's, else derived from
        the opening messages when ``reuse_prefix``), so agent-loop steps reuse the KV of their
        common prefix. An id is tied to the model of its first turn: reusing it with another
        model raises ``ConfigError``.
    idle_timeout_s
        Seconds a conversation this model opened may go without a turn before its KV is
        released (checked about once a second).
    tool_result_hint
        System line appended after trailing tool results in ``"auto"`` mode (``None``: off).
    record_traces
        A JSONL file that every finished turn is appended to as a calibration trace (see
        ``pask_agent.record.traces``), so an agent's real runs can calibrate its table.
    temperature, max_tokens, stop, timeout, max_retries
        Sampling temperature (0 = greedy); new-token cap (256 when ``None``); stop strings
        (cut client-side and the request cancelled); seconds per turn; retries of a turn that
        failed inside the engine before it produced output.

    Notes
    -----
    ``response_metadata["kv"]`` holds the request's measured KV statistics (``kv_bytes``,
    ``full_kv_bytes``, ``measured_b``, ``peak_kv_bytes``, ``prefilled_tokens``, ``ttft_s``,
    ``tpot_s``). Inputs are text only: image, audio and file blocks raise ``ConfigError``.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model: str = "default"
    weights: str = DEFAULT_WEIGHTS
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | None = None
    parallel_tool_calls: bool = True
    policy: str = "full"
    budget: float | None = None
    policy_table: str | None = None
    _table_policy: Any = PrivateAttr(default=None)
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int | None = None
    timeout: float | None = None
    stop: list[str] | None = None
    max_retries: int = 2
    conversation_id: str | None = None
    record_traces: str | None = None
    reuse_prefix: bool = True
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    tool_result_hint: str | None = DEFAULT_TOOL_RESULT_HINT

    @field_validator("weights")
    @classmethod
    def _check_weights(cls, weights: str) -> str:
        check_weight_format(weights)
        return weights

    @field_validator("tools", mode="before")
    @classmethod
    def _format_tools(cls, tools: Any) -> list[dict[str, Any]] | None:
        return None if tools is None else format_tools(tools)

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _check_tool_choice(cls, choice: Any) -> str | None:
        return None if choice is None else normalize_tool_choice(choice)

    @property
    def _llm_type(self) -> str:
        return "pask-chat"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "policy": self.policy,
            "budget": self.budget,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "pask"
        if not stop and self.stop:
            params["ls_stop"] = self.stop
        return params

    def end_thread(self, thread_id: str) -> list[str]:
        """Release the KV of a LangGraph thread's conversations now; returns their ids.

        Deleting the thread from its checkpointer does the same within about a second, and an
        unused thread goes after ``idle_timeout_s``; this is for callers that cannot wait. A
        turn of the thread still running keeps its conversation until the turn ends.
        """
        return runtime_registry().host(self.model, self.weights).end_thread(str(thread_id))

    # ------------------------------------------------------------------ tools, structure
    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        parallel_tool_calls: bool | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools (Pydantic models, functions, dicts, LangChain tools) and a choice.

        Calls are always grammar-bound, so ``strict`` changes nothing and is accepted for
        compatibility.

        Raises
        ------
        SchemaError
            A tool cannot be turned into a JSON Schema the grammar can enforce.
        ToolChoiceError
            ``tool_choice`` is not auto/any/required/none or a bound tool's name.
        """
        formatted = format_tools(tools)
        if tool_choice is not None:
            choice = normalize_tool_choice(tool_choice)
            names = {t["function"]["name"] for t in formatted}
            if choice not in ("auto", "required", "none") and choice not in names:
                raise ToolChoiceError(
                    f"tool_choice {choice!r} names no bound tool; bound: {sorted(names)}"
                )
            kwargs["tool_choice"] = choice
        if parallel_tool_calls is not None:
            kwargs["parallel_tool_calls"] = parallel_tool_calls
        return self.bind(tools=formatted, **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type,
        *,
        method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | BaseModel]:
        """Answers parsed into ``schema`` (a Pydantic class, TypedDict or JSON Schema dict).

        ``json_schema`` (and ``json_mode``, which here behaves the same) decodes against the
        schema's grammar and shows the schema in the system prompt; ``function_calling``
        forces a call of a tool made from the schema. A bare ``bind(response_format={"type":
        "json_object"})`` only guarantees some JSON object. With ``include_raw`` the result
        is ``{"raw", "parsed", "parsing_error"}``.
        """
        if kwargs:
            raise ConfigError(f"unexpected arguments {sorted(kwargs)} for with_structured_output")
        pydantic_class = _is_pydantic_class(schema)
        fmt = {"kwargs": {"method": method, "strict": strict}, "schema": schema}
        if method == "function_calling":
            tool = convert_to_openai_tool(schema)
            name = tool["function"]["name"]
            llm = self.bind_tools([schema], tool_choice=name, ls_structured_output_format=fmt)
            parser: Runnable = (
                PydanticToolsParser(tools=[schema], first_tool_only=True)  # type: ignore[list-item]
                if pydantic_class
                else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
            )
        elif method in ("json_schema", "json_mode"):
            kind = "json_object" if method == "json_mode" else "json_schema"
            response_format = {"type": kind, "schema": convert_to_json_schema(schema)}
            llm = self.bind(response_format=response_format, ls_structured_output_format=fmt)
            parser = (
                PydanticOutputParser(pydantic_object=schema)  # type: ignore[arg-type]
                if pydantic_class
                else JsonOutputParser()
            )
        else:
            raise ConfigError(
                f"unknown method {method!r}; use 'json_schema', 'function_calling' or 'json_mode'"
            )
        if not include_raw:
            return llm | parser
        parsed = RunnablePassthrough.assign(
            parsed=itemgetter("raw") | parser, parsing_error=lambda _: None
        )
        none = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=llm) | parsed.with_fallbacks([none], exception_key="parsing_error")

    # ------------------------------------------------------------------ generation
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return generate_from_stream(self._stream(messages, stop, None, **kwargs))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        chunks = [c async for c in self._astream(messages, stop, None, **kwargs)]
        return generate_from_stream(iter(chunks))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        req = self._turn_request(messages, stop, kwargs)
        for chunk in req.host.iterate(lambda rt: run_turn(rt, req)):
            if run_manager is not None:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        req = self._turn_request(messages, stop, kwargs)
        async for chunk in req.host.aiterate(lambda rt: run_turn(rt, req)):
            if run_manager is not None:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    def _turn_request(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> LcTurn:
        unknown = set(kwargs) - _CALL_KWARGS
        if unknown:
            raise ConfigError(
                f"unknown call arguments {sorted(unknown)}; PaskChatModel takes "
                f"{sorted(_CALL_KWARGS)}"
            )
        model = kwargs.get("model", self.model)
        tools = kwargs.get("tools", self.tools)
        tools = format_tools(tools) if tools else None
        choice = kwargs.get("tool_choice", self.tool_choice)
        choice = normalize_tool_choice(choice) if choice is not None else "auto"
        openai_messages = to_openai_messages(messages)
        if tools and choice == "auto" and self.tool_result_hint and openai_messages:
            if openai_messages[-1]["role"] == "tool":
                openai_messages.append({"role": "system", "content": self.tool_result_hint})
        conversation = kwargs.get("conversation_id", self.conversation_id)
        if conversation is not None:  # a caller's id; derived ids below include the model
            runtime_registry().bind_conversation(conversation, model)
        policy, budget = kwargs.get("policy", self.policy), kwargs.get("budget", self.budget)
        table = kwargs.get("policy_table", self.policy_table)
        if table is not None:
            if policy != "pask":
                raise ConfigError(f"policy_table needs policy='pask', got policy={policy!r}")
            if self._table_policy is None or self._table_policy.path != str(table):
                self._table_policy = TablePaskPolicy.read(str(table))
            policy = self._table_policy
        thread_id, saver = langgraph_thread()
        if conversation is None and thread_id is not None:
            conversation = thread_key(model, policy, budget, thread_id)
        if conversation is None and self.reuse_prefix:
            conversation = conversation_key(model, policy, budget, openai_messages)
        max_tokens = kwargs.get("max_tokens", self.max_tokens)
        turn = TurnRequest(
            messages=tuple(openai_messages),
            tools=tuple(tools) if tools else None,
            tool_choice=choice,
            parallel_tool_calls=bool(kwargs.get("parallel_tool_calls", self.parallel_tool_calls)),
            policy=policy,
            budget=budget,
            max_new_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else int(max_tokens),
            temperature=float(kwargs.get("temperature", self.temperature)),
            top_p=float(kwargs.get("top_p", self.top_p)),
            seed=kwargs.get("seed", self.seed),
            record_traces=kwargs.get("record_traces", self.record_traces),
        )
        return LcTurn(
            host=runtime_registry().host(model, self.weights),
            model_name=model,
            turn=turn,
            response_format=kwargs.get("response_format"),
            stop=tuple(stop if stop is not None else self.stop or ()),
            timeout_s=kwargs.get("timeout", self.timeout),
            max_retries=int(kwargs.get("max_retries", self.max_retries)),
            conversation_id=conversation,
            idle_s=float(self.idle_timeout_s),
            thread_id=thread_id,
            saver=saver,
        )


def _is_pydantic_class(schema: Any) -> bool:
    from pydantic.v1 import BaseModel as BaseModelV1

    return isinstance(schema, type) and issubclass(schema, BaseModel | BaseModelV1)
