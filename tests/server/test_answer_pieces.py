"""The server's streaming state machine on mixed turns (issue 13 item 4): text streams as
``delta.content``, then the calls as ``delta.tool_calls``; the streamed content equals the
whole response's. No model: answers are fed as strings in random pieces."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from pask_agent.grammars.tool_spec import tool_specs
from pask_agent.runtime.turns.mixed_output import split_output
from pask_agent.runtime.turns.outputs import parse_tool_calls
from pask_agent.runtime.turns.results import ChatResult, Usage
from pask_agent.server import responses
from pask_agent.server.answer_pieces import AnswerPieces

WEATHER = {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
CALLS = f'[{CALL}, {{"name": "get_weather", "arguments": {{"city": "Rome\\n{{x}}"}}}}]'

MIXED = [
    "Let me check.\n" + CALL,
    "Let me check the two cities.\n\n" + CALLS,
    "Line one.\n\nLine {two} [ok].\n" + CALL,
    CALL,
    CALLS,
    "Sunny.\n\nWindy later.\n",
    "Sunny.",
]


def _stream(answer: AnswerPieces, text: str, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(text):
        step = rng.randint(1, 7)
        out += answer.feed(text[i : i + step])
        i += step
        if answer.stopped:
            return out
    return out + answer.finish()


def _content(pieces: list[dict[str, Any]]) -> str:
    return "".join(p.get("content", "") for p in pieces)


def _calls(pieces: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    for p in pieces:
        for d in p.get("tool_calls", ()):
            if "id" in d:
                names[d["index"]] = d["function"]["name"]
            args[d["index"]] = args.get(d["index"], "") + d["function"]["arguments"]
    return [(names[k], json.loads(args[k])) for k in sorted(names)]


@pytest.mark.parametrize("text", MIXED)
@pytest.mark.parametrize("seed", range(5))
def test_text_then_call_deltas_match_the_whole_answer(text: str, seed: int) -> None:
    answer = AnswerPieces(calls_allowed=True)
    pieces = _stream(answer, text, seed)
    content, calls_text = split_output(text)
    # content first, then only tool-call deltas
    kinds = [next(iter(p)) for p in pieces]
    assert kinds == sorted(kinds, key=lambda k: k == "tool_calls")
    assert all(p.get("content") != "" for p in pieces)  # no empty or stray pieces
    parsed = bool(calls_text)
    assert (_content(pieces) or None) == content == answer.content(parsed_calls=parsed)
    expected = [(c.name, c.arguments) for c in parse_tool_calls(text, tool_specs([WEATHER]))]
    assert _calls(pieces) == expected


def test_newline_before_a_call_is_never_sent() -> None:
    answer = AnswerPieces(calls_allowed=True)
    assert answer.feed("Let me check.") == [{"content": "Let me check."}]
    assert answer.feed("\n") == []  # held: the next character decides
    heads = answer.feed('{"name": "get_weather", "arguments": {"ci')
    assert heads[0]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert answer.content(parsed_calls=True) == "Let me check."
    text = AnswerPieces(calls_allowed=True)
    assert text.feed("One.\n") == [{"content": "One."}]
    assert text.feed("Two.") == [{"content": "\nTwo."}]  # not a call: the newline is text
    assert text.feed("\n") == [] and text.finish() == [{"content": "\n"}]


def test_stop_sequences_cut_the_text_before_the_calls() -> None:
    answer = AnswerPieces(stop=("END",), calls_allowed=True)
    pieces = answer.feed("Checking. EN")
    assert pieces == [{"content": "Checking. "}]  # "EN" may start the stop sequence
    pieces = answer.feed("D\n" + CALL)
    assert answer.stopped and pieces == []
    assert answer.content(parsed_calls=False) == "Checking. "
    # a held stop prefix goes out once the calls begin: the text cannot grow any more
    answer = AnswerPieces(stop=("END",), calls_allowed=True)
    pieces = answer.feed("Checking. EN") + answer.feed("\n" + CALL)
    assert _content(pieces) == "Checking. EN" and _calls(pieces) == [
        ("get_weather", {"city": "Oslo"})
    ]
    # a stop that spans the held newlines is found once they turn out to be text
    answer = AnswerPieces(stop=("\n\n",), calls_allowed=True)
    assert _content(_stream(answer, "One.\n\nTwo.", 1)) == "One." and answer.stopped
    answer = AnswerPieces(stop=("\n\n",), calls_allowed=True)
    assert _content(_stream(answer, "One.\n\n" + CALL, 1)) == "One." and not answer.stopped


def test_without_tools_every_line_is_text() -> None:
    text = "Here is JSON:\n" + CALL
    answer = AnswerPieces(calls_allowed=False)
    pieces = _stream(answer, text, 2)
    assert _content(pieces) == text == answer.content(parsed_calls=False)
    assert not _calls(pieces)


def test_a_call_cut_by_the_token_limit_stays_visible_as_text() -> None:
    text = "Let me check.\n" + CALL[:25]
    answer = AnswerPieces(calls_allowed=True)
    _stream(answer, text, 3)
    assert answer.content(parsed_calls=False) == text


def test_whole_response_has_content_next_to_tool_calls() -> None:
    text = "Let me check.\n" + CALL
    calls = parse_tool_calls(text, tool_specs([WEATHER]))
    usage = Usage(10, 4, 10, 64, 64, 1.0, 64, 0.0, 0.0)
    result = ChatResult(text, calls, usage, "tool_calls")
    answer = AnswerPieces(calls_allowed=True)
    _stream(answer, text, 4)
    body = responses.completion(
        responses.Stamp("chatcmpl-1", 0, "m"),
        content=answer.content(parsed_calls=True),
        result=result,
        finish_reason=result.finish_reason,
        usage={},
    )
    message = body["choices"][0]["message"]
    assert message["content"] == "Let me check." == result.message["content"]
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    assert body["choices"][0]["finish_reason"] == "tool_calls"
