"""Request translation, tool-call deltas, error mapping and bind checks: no model needed."""

from __future__ import annotations

import json
import random

import pytest

from pask_agent.errors import (
    ConfigError,
    PolicyTableError,
    RequestTooLargeError,
    SchemaError,
    ToolCallError,
    ToolChoiceError,
)
from pask_agent.server import check_bind
from pask_agent.server.errors import APIError, api_error
from pask_agent.server.metrics import TokenRate
from pask_agent.server.protocol import JSON_OBJECT_INSTRUCTION, parse_body
from pask_agent.server.tool_deltas import ToolCallDeltas, scan_calls

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def parse(**body: object):
    body.setdefault("model", "m")
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return parse_body(json.dumps(body).encode(), default_max_tokens=99, default_temperature=0.0)


def status_of(**body: object) -> tuple[int, str | None]:
    with pytest.raises(APIError) as info:
        parse(**body)
    return info.value.status, info.value.param


def test_defaults_and_aliases() -> None:
    spec = parse(max_tokens=7)
    assert (
        spec.turn.max_new_tokens,
        spec.turn.temperature,
        spec.turn.top_p,
        spec.turn.tool_choice,
    ) == (
        7,
        0,
        1,
        "auto",
    )
    assert parse(max_tokens=7, max_completion_tokens=5).turn.max_new_tokens == 5
    assert parse().turn.max_new_tokens == 99
    assert parse(stop="END").stop == ("END",)
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert parse(tools=[WEATHER], tool_choice=named).turn.tool_choice == "get_weather"
    assert parse(tools=[WEATHER]).turn.parallel_tool_calls is True
    assert parse(tools=[WEATHER], parallel_tool_calls=False).turn.parallel_tool_calls is False
    assert parse(stream=True, stream_options={"include_usage": True}).include_usage is True
    assert parse(stream_options={"include_usage": True}).include_usage is False
    dev = parse(messages=[{"role": "developer", "content": [{"type": "text", "text": "be"}]}])
    assert dev.turn.messages[0] == {"role": "system", "content": "be"}


def test_history_tool_call_arguments_become_objects() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    spec = parse(
        messages=[
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "2", "tool_call_id": "c1"},
        ]
    )
    assert spec.turn.messages[1]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert spec.turn.messages[1]["content"] == ""
    assert spec.turn.messages[2]["tool_call_id"] == "c1"


def test_response_formats_add_their_instruction() -> None:
    spec = parse(response_format={"type": "json_object"})
    assert spec.output_schema == {"type": "object"}
    assert spec.turn.messages[0] == {"role": "system", "content": JSON_OBJECT_INSTRUCTION}
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    spec = parse(
        messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "u"}],
        response_format=fmt,
    )
    assert spec.output_schema == schema and spec.turn.tools is None
    assert (
        spec.turn.messages[0]["content"].startswith("S\n\n")
        and "- n: integer" in spec.turn.messages[0]["content"]
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logit_bias": {"1": 2}}, "logit_bias"),
        ({"messages": []}, "messages"),
        ({"temperature": 3}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
        ),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, None),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_bad_requests_are_400_naming_the_field(body: dict, param: str | None) -> None:
    status, where = status_of(**body)
    assert status == 400
    if param is not None:
        assert where == param


def test_body_that_is_not_json() -> None:
    with pytest.raises(APIError) as info:
        parse_body(b"{nope", default_max_tokens=1, default_temperature=0)
    assert info.value.status == 400 and info.value.code == "invalid_json"


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (RequestTooLargeError("too long"), 413, "context_length_exceeded"),
        (SchemaError("bad", path="$.x"), 400, "invalid_schema"),
        (ToolChoiceError("no such tool"), 400, "invalid_tool_choice"),
        (ConfigError("bad budget"), 400, "invalid_value"),
        (PolicyTableError("table made for other weights"), 400, "policy_unavailable"),
        (ToolCallError("out of range", tool="f"), 500, "invalid_model_output"),
        (KeyError("bug"), 500, None),
    ],
)
def test_errors_map_to_openai_status(exc: Exception, status: int, code: str | None) -> None:
    error = api_error(exc)
    assert error.status == status and error.code == code
    body = error.body()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["message"]
    if isinstance(exc, SchemaError):
        assert body["param"] == "$.x"


CALLS = (
    '[{"name": "get_weather", "arguments": {"city": "Pa\\"ris}", "days": [1, {"a": "]"}]}}, '
    '{"name": "f", "arguments": {}}]'
)


@pytest.mark.parametrize("seed", range(5))
def test_tool_call_deltas_rebuild_every_call_from_random_pieces(seed: int) -> None:
    rng = random.Random(seed)
    deltas, out, i = ToolCallDeltas(), [], 0
    while i < len(CALLS):
        step = rng.randint(1, 6)
        out += deltas.feed(CALLS[i : i + step])
        i += step
    heads = [d for d in out if "id" in d]
    assert [h["function"]["name"] for h in heads] == ["get_weather", "f"]
    assert len({h["id"] for h in heads}) == 2
    args: dict[int, str] = {}
    for d in out:
        args[d["index"]] = args.get(d["index"], "") + d["function"]["arguments"]
    assert [json.loads(a) for a in args.values()] == [
        {"city": 'Pa"ris}', "days": [1, {"a": "]"}]},
        {},
    ]


def test_scan_calls_on_unfinished_text() -> None:
    assert [c.name for c in scan_calls('{"name": "g')] == [None]
    (call,) = scan_calls('{"name": "g", "arguments": {"q": "x')
    assert call.name == "g" and call.args_start is not None and call.args_end is None


def test_token_rate_window() -> None:
    rate = TokenRate(window_s=10)
    rate.add(30, now=0.0)
    rate.add(20, now=5.0)
    assert rate.per_second(now=6.0) == 5.0
    assert rate.per_second(now=12.0) == 2.0  # the first 30 left the window


def test_bind_needs_a_key_off_loopback() -> None:
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        check_bind(host, None)
    for host in ("0.0.0.0", "192.168.1.4", "example.org", "::"):
        with pytest.raises(ConfigError, match="--api-key"):
            check_bind(host, None)
        check_bind(host, "secret")
