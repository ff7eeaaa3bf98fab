"""One turn's prompt: rendered ids, span labels and output grammar, outside any engine.

Serving (``Runtime.prepare``) and calibration (replaying recorded traces) must see the very
same prompt tokens, labels and grammar, or a table calibrated on traces would describe
prompts the server never builds; so both call this one function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pask_agent.grammars.chat_spans import template_spans
from pask_agent.grammars.json.history_spans import history_call_spans
from pask_agent.grammars.json.result_spans import tool_result_spans
from pask_agent.grammars.prompt import render_tool_prompt
from pask_agent.grammars.span_labels import CharSpan, label_prompt_spans, labels_for_tokens
from pask_agent.grammars.tool_spec import ToolSpec
from pask_agent.runtime.turns.constraint import OutputSpec
from pask_agent.runtime.turns.outputs import TEXT, OutputCompiler


@dataclass(frozen=True, slots=True)
class PreparedTurn:
    """The prompt token ids, their span labels (None when not asked for) and the output spec."""

    prompt_ids: list[int]
    labels: list[str] | None
    spec: OutputSpec


def prepare_turn(
    tokenizer: Any,
    outputs: OutputCompiler,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[Any] | None,
    tool_choice: str,
    parallel_tool_calls: bool,
    *,
    labels: bool,
    label_spans: Callable[[str], list[CharSpan]] | None = None,
) -> PreparedTurn:
    """Render the prompt, label its spans, and pick the output grammar.

    ``label_spans(text)`` overrides how prompt spans are labelled (the SQL helper labels its
    DDL); by default the tool schemas rendered into the prompt are labelled, the chat
    template's own text (``chat_spans``), the calls earlier assistant turns made
    (``history_spans``) and the JSON results tools returned (``result_spans``): by structure,
    not as plain content.
    """
    spec = TEXT
    specs: tuple[ToolSpec, ...] = ()
    if tools is not None:  # an empty list is refused, not taken for "no tools"
        spec = outputs.tools(tools, tool_choice=tool_choice, parallel=parallel_tool_calls)
        specs = spec.payload or tuple(ToolSpec.from_any(t) for t in tools)
    text = render_tool_prompt(tokenizer, messages, specs or None)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    span_labels = None
    if labels:
        if label_spans is not None:
            spans = label_spans(text)
        else:
            results = [
                m["content"]
                for m in messages
                if m.get("role") == "tool" and isinstance(m.get("content"), str)
            ]
            schema = label_prompt_spans(text, specs)
            spans = [
                *schema,
                *template_spans(text, messages, schema),
                *history_call_spans(text, specs),
                *tool_result_spans(text, results),
            ]
        span_labels = labels_for_tokens(text, spans, tokenizer)
    return PreparedTurn(ids, span_labels, spec)
