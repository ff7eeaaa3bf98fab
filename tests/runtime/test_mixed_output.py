"""Mixed turns (issue 13 item 4): text, then calls on a new line, read by the runtime.

No model: outputs are fed as strings to the split, its streamed form, ``parse_tool_calls`` and
``chat_result`` (a real ``Finished`` event and tools spec).
"""

from __future__ import annotations

import json
import random

import pytest

from pask_agent.errors import ToolCallError
from pask_agent.grammars.tool_spec import tool_specs
from pask_agent.runtime.memory.kv_layout import KVReport
from pask_agent.runtime.turns.constraint import OutputSpec
from pask_agent.runtime.turns.mixed_output import OutputSplitter, call_start, split_output
from pask_agent.runtime.turns.outputs import parse_tool_calls
from pask_agent.runtime.turns.results import Finished
from pask_agent.runtime.turns.turn_output import chat_result

WEATHER = {
    "name": "get_weather",
    "description": "Weather at a place.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
        "required": ["city"],
    },
}
SPECS = tool_specs([WEATHER])
CALL = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
CALLS = '[{"name": "get_weather", "arguments": {"city": "Oslo"}}, ' + CALL[:-2] + ', "days": 2}}]'

# (output, content, calls text)
CASES = [
    (CALL, None, CALL),
    (CALLS, None, CALLS),
    ("Sunny all week.", "Sunny all week.", None),
    ("Sunny.\n\nWindy later.\n", "Sunny.\n\nWindy later.\n", None),  # no calls: kept as is
    ("Let me check.\n" + CALL, "Let me check.", CALL),
    ("Let me check.\n\n" + CALLS, "Let me check.", CALLS),
    ("Two cities:\n- Oslo\n\n- Rome\n" + CALLS, "Two cities:\n- Oslo\n\n- Rome", CALLS),
    ("Braces {inside} a line [ok].\n" + CALL, "Braces {inside} a line [ok].", CALL),
    ("Checking.\n" + CALL[:20], "Checking.", CALL[:20]),  # cut before the call closed
    ("\n" + CALL, None, CALL),
    ("", None, None),
]


@pytest.mark.parametrize(("output", "content", "calls"), CASES)
def test_split_output(output: str, content: str | None, calls: str | None) -> None:
    assert split_output(output) == (content, calls)


def test_call_start_finds_only_a_line_start() -> None:
    assert call_start("a {b}\nc [d]") is None
    assert call_start("a\n[" + CALL) == 2
    assert call_start("a\n{x\n[y") == 2  # the first line start that opens a call
    assert call_start("x{", since=1) is None  # an old ``{`` mid-line is no call start
    assert call_start("a\n", since=2) is None
    assert call_start("a\n{", since=2) == 2  # the newline before it was seen already


@pytest.mark.parametrize(("output", "content", "calls"), CASES)
@pytest.mark.parametrize("seed", range(4))
def test_streamed_split_equals_the_whole_one(
    output: str, content: str | None, calls: str | None, seed: int
) -> None:
    rng = random.Random(seed)
    splitter, got_content, got_calls, i = OutputSplitter(), "", "", 0
    while i < len(output):
        step = rng.randint(1, 5)
        new_content, new_calls = splitter.feed(output[i : i + step])
        if got_calls:
            assert not new_content  # no text after the calls begin
        got_content, got_calls, i = got_content + new_content, got_calls + new_calls, i + step
    got_content += splitter.finish()
    assert (got_content or None, got_calls or None) == (content, calls)


def test_streamed_split_holds_back_only_trailing_newlines() -> None:
    splitter = OutputSplitter()
    assert splitter.feed("Let me check.") == ("Let me check.", "")
    assert splitter.feed("\n") == ("", "")  # a call may follow
    assert splitter.feed("\n") == ("", "")
    assert splitter.feed("Then") == ("\n\nThen", "")  # it did not: the newlines are text
    assert splitter.feed(".\n") == (".", "")
    assert splitter.feed('{"na') == ("", '{"na')
    assert splitter.in_calls and splitter.finish() == ""
    text_only = OutputSplitter(calls_allowed=False)
    assert text_only.feed("a\n") == ("a\n", "")
    assert text_only.feed("{b}") == ("{b}", "")
    assert not text_only.in_calls


def test_parse_tool_calls_reads_calls_after_text() -> None:
    (call,) = parse_tool_calls("Let me check.\n" + CALL, SPECS)
    assert (call.name, call.arguments) == ("get_weather", {"city": "Oslo"})
    calls = parse_tool_calls("Both:\n\n" + CALLS, SPECS)
    assert [c.arguments for c in calls] == [{"city": "Oslo"}, {"city": "Oslo", "days": 2}]
    assert parse_tool_calls(CALL, SPECS)[0].arguments == {"city": "Oslo"}
    assert parse_tool_calls("Checking.\n" + CALL[:20], SPECS) == ()  # cut: no call
    assert parse_tool_calls("Sunny, {warm} and [dry].", SPECS) == ()


def _finished(text: str, reason: str = "stop") -> Finished:
    kv = KVReport(
        tokens=14, high_bytes=64, low_bytes=0, scale_bytes=0, full_bytes=64, peak_bytes=64,
        sinks=4, window=16,
    )  # fmt: skip
    return Finished(
        token_ids=(1, 2, 3, 4), text=text, reason=reason, prompt_tokens=10, prefilled_tokens=10,
        kv=kv, ttft_s=0.0, tpot_s=0.0,
    )  # fmt: skip


TOOLS_SPEC = OutputSpec("tools", None, None, SPECS)


@pytest.mark.parametrize(
    ("output", "content", "n_calls", "reason"),
    [
        ("Let me check.\n" + CALL, "Let me check.", 1, "tool_calls"),
        ("Both:\n" + CALLS, "Both:", 2, "tool_calls"),
        (CALL, None, 1, "tool_calls"),
        ("Sunny.", "Sunny.", 0, "stop"),
    ],
)
def test_chat_result_carries_text_next_to_calls(
    output: str, content: str | None, n_calls: int, reason: str
) -> None:
    result = chat_result(_finished(output), TOOLS_SPEC)
    assert result.text == output  # the whole output stays available
    assert (result.content, len(result.tool_calls), result.finish_reason) == (
        content,
        n_calls,
        reason,
    )
    message = result.message
    assert message["content"] == content
    if n_calls:
        calls = message["tool_calls"]
        assert [json.loads(c["function"]["arguments"])["city"] for c in calls] == ["Oslo"] * n_calls
    else:
        assert "tool_calls" not in message


def test_a_mixed_call_cut_by_the_token_limit_stays_text() -> None:
    output = "Let me check.\n" + CALL[:30]
    result = chat_result(_finished(output, "length"), TOOLS_SPEC)
    assert (result.tool_calls, result.finish_reason) == ((), "length")
    assert result.message == {"role": "assistant", "content": output}


def test_a_mixed_call_is_validated_like_a_bare_one() -> None:
    bad = '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 0}}'
    with pytest.raises(ToolCallError, match=r"\$\.days"):
        chat_result(_finished("Checking.\n" + bad), TOOLS_SPEC)


def test_text_spec_never_reads_calls() -> None:
    output = "Here is JSON:\n" + CALL  # tool_choice="none": any line may start with `{`
    result = chat_result(_finished(output), OutputSpec("text", None))
    assert result.tool_calls == () and result.message["content"] == output
