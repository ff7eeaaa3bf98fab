"""What a finished turn becomes: the caller's ``ChatResult`` (tool calls parsed and checked,
usage with measured KV bytes) and, when asked, one calibration trace line.

Kept apart from ``runtime.py``, which routes requests; these are pure functions of a turn's
``Finished`` event.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pask_agent.grammars.tool_spec import ToolSpec
from pask_agent.record.traces import ModelId, Trace, append_trace, messages_json
from pask_agent.runtime.turns.constraint import OutputSpec
from pask_agent.runtime.turns.outputs import parse_tool_calls
from pask_agent.runtime.turns.results import ChatResult, Finished, ToolCall, Usage
from pask_agent.runtime.turns.tool_validation import checked_tool_calls


def record_turn(
    trace_file: str,
    model: ModelId,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[Any] | None,
    tool_choice: str,
    parallel: bool,
    spec: OutputSpec,
    f: Finished,
) -> None:
    """Append the turn to ``trace_file`` (``record/traces.py``)."""
    # ok records only what the runtime knows: the turn ended by itself (not at the token
    # limit). A caller that knows the outcome (the tool ran, the answer checked) can rewrite
    # the line; calibration reads either ``ok`` or a ``reference``.
    specs = [ToolSpec.from_any(t).to_openai() for t in tools or ()]
    schema = spec.payload if spec.kind == "sql" else None
    ddl = schema.ddl() if schema is not None else None
    trace = Trace(
        messages=tuple(messages_json(messages)),
        output=f.text,
        output_token_ids=f.token_ids,
        model=model,
        tools=tuple(specs),
        sql_schema=ddl,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        ok=f.reason != "length",
    )
    append_trace(trace_file, trace)


def chat_result(f: Finished, spec: OutputSpec) -> ChatResult:
    """The turn's answer, its tool calls (validated against their schemas) and usage."""
    calls: tuple[ToolCall, ...] = ()
    if spec.kind == "tools":
        calls = checked_tool_calls(parse_tool_calls(f.text, spec.payload), spec.payload)
    usage = Usage(
        prompt_tokens=f.prompt_tokens,
        completion_tokens=len(f.token_ids),
        prefilled_tokens=f.prefilled_tokens,
        kv_bytes=f.kv.live_bytes,
        full_kv_bytes=f.kv.full_bytes,
        measured_b=f.kv.measured_b,
        peak_kv_bytes=f.kv.peak_bytes,
        ttft_s=f.ttft_s,
        tpot_s=f.tpot_s,
        tag_counts=dict(f.tag_counts),
        allocated_kv_bytes=f.allocated_kv_bytes,
        prompt_kv_bytes=f.kv.prompt_bytes,
        prompt_full_kv_bytes=f.kv.prompt_full_bytes,
        planned_b_prompt=None if f.stages is None else f.stages.budget_prompt,
        planned_b_decode=None if f.stages is None else f.stages.budget_decode,
        floor_breach_bytes=0 if f.stages is None else f.stages.floor_breach_bytes,
        plan_budget=None if f.stages is None else f.stages.plan_budget,
        plan_mode=None if f.stages is None else f.stages.mode,
        ceiling_fallback_tokens=f.ceiling_fallback_tokens,
        shed_fallback_rows=f.shed_fallback_rows,
    )
    reason = "tool_calls" if calls else f.reason
    return ChatResult(f.text, calls, usage, reason, f.token_ids)
