"""One assistant turn, as every front end asks for it.

The Python API builds a ``TurnRequest`` from ``rt.chat``/``rt.stream`` keywords, the OpenAI
server from a request body (``server/protocol.py``), LangChain from a model's fields and the
call's kwargs (``integrations/langchain.py``). Each adapter translates its protocol into this
value in one place, and the runtime serves only this value, so an option added here reaches
every front end without being copied into three keyword lists.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pask_agent.errors import ConfigError
from pask_agent.grammars.span_labels import CharSpan
from pask_agent.policy.base import Policy
from pask_agent.runtime.turns.constraint import OutputSpec


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """What one turn generates and under which KV policy.

    ``tools`` are tool specs in any accepted form (Pydantic, functions, JSON Schema, LangChain
    tools, OpenAI dicts); ``spec`` binds the answer to a compiled output grammar instead
    (``rt.outputs.json_schema(...)``); ``label_spans`` overrides how prompt spans are labelled;
    ``record_traces`` appends the finished turn to a trace file.
    """

    messages: tuple[dict[str, Any], ...]
    tools: tuple[Any, ...] | None = None
    tool_choice: str = "auto"
    parallel_tool_calls: bool = True
    policy: str | Policy | None = None
    budget: float | None = None
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    spec: OutputSpec | None = None
    label_spans: Callable[[str], list[CharSpan]] | None = None
    ignore_eos: bool = False
    record_traces: str | None = None

    @classmethod
    def of(cls, messages: Sequence[dict[str, Any]], **options: Any) -> TurnRequest:
        """From ``rt.chat``-style keywords; an unknown keyword is a ``ConfigError``."""
        unknown = set(options) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(
                f"unknown turn options {sorted(unknown)}; valid: "
                f"{sorted(set(cls.__dataclass_fields__) - {'messages'})}"
            )
        tools = options.pop("tools", None)
        return cls(tuple(messages), tools=None if tools is None else tuple(tools), **options)
