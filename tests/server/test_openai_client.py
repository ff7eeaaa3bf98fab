"""The real ``openai`` client against the server (SmolLM2, greedy): shapes, grammar-bound
answers, streaming that agrees with the whole answer, stop sequences, errors, conversations."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from server_harness import SMOL, TIME, function_tool

WEATHER = function_tool(
    "get_weather",
    "Get the current weather in a city.",
    {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    ["city"],
)
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
STORY = [{"role": "user", "content": "Tell me a short story about a cat."}]


def pask(usage: Any) -> dict[str, Any]:
    return usage.model_extra["pask"]


def test_models_and_unknown_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [SMOL]
    assert client.models.retrieve(SMOL).id == SMOL
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=ASK, max_tokens=4)
    assert info.value.code == "model_not_found"


def test_plain_completion_reports_measured_kv(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=SMOL, messages=STORY, max_tokens=12)
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length" and r.usage.completion_tokens == 12
    kv = pask(r.usage)
    assert kv["policy"] == "full" and kv["measured_b"] == 1.0
    assert kv["kv_bytes"] == kv["full_kv_bytes"] > 0
    assert kv["tag_counts"] == {"untagged": 12} and kv["tagger_fallbacks"] == 0
    # a compressed policy per request keeps fewer bytes, and says so
    small = client.chat.completions.create(
        model=SMOL,
        messages=STORY,
        max_tokens=12,
        extra_body={"pask_policy": "streaming", "pask_budget": 0.5},
    )
    kv_small = pask(small.usage)
    assert kv_small["policy"] == "streaming" and kv_small["budget"] == 0.5
    assert kv_small["measured_b"] < 1.0
    assert kv_small["kv_bytes"] / kv_small["full_kv_bytes"] == pytest.approx(kv_small["measured_b"])


def test_stream_equals_the_whole_answer(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=SMOL, messages=STORY, max_tokens=16)
    stream = client.chat.completions.create(
        model=SMOL,
        messages=STORY,
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 3
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert len({c.id for c in chunks}) == 1


def test_stop_sequence_cuts_whole_and_streamed(client: openai.OpenAI) -> None:
    free = client.chat.completions.create(model=SMOL, messages=STORY, max_tokens=16)
    text = free.choices[0].message.content
    stop = text.split()[3]  # a word from the middle of the greedy answer
    want = text[: text.index(stop)]
    cut = client.chat.completions.create(model=SMOL, messages=STORY, max_tokens=16, stop=[stop])
    assert cut.choices[0].message.content == want
    assert cut.choices[0].finish_reason == "stop"
    assert cut.usage.prompt_tokens == free.usage.prompt_tokens
    assert 0 < cut.usage.completion_tokens < 16
    streamed = client.chat.completions.create(
        model=SMOL, messages=STORY, max_tokens=16, stop=stop, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == want


def test_seeded_sampling_repeats(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        r = client.chat.completions.create(
            model=SMOL, messages=STORY, max_tokens=6, temperature=1.0, top_p=0.9, seed=seed
        )
        return r.choices[0].message.content

    assert sample(7) == sample(7)


def test_required_tool_call_whole_and_streamed(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = dict(
        model=SMOL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=48
    )
    r = client.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    whole = choice.message.tool_calls
    for call in whole:
        assert call.id.startswith("call_") and call.type == "function"
        tool = WEATHER if call.function.name == "get_weather" else TIME
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    kv = pask(r.usage)
    assert kv["tagger_fallbacks"] == 0 and "untagged" not in kv["tag_counts"]
    # the same call streamed: a head (id, name) per call, then its arguments piece by piece
    chunks = list(client.chat.completions.create(**kw, stream=True))
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    heads = [d for d in deltas if d.id]
    assert [h.function.name for h in heads] == [c.function.name for c in whole]
    assert len({h.id for h in heads}) == len(heads)
    pieces = [d.function.arguments for d in deltas if not d.id]
    assert len(pieces) > 3  # the arguments arrive as the model writes them
    by_index: dict[int, str] = {}
    for d in deltas:
        by_index[d.index] = by_index.get(d.index, "") + (d.function.arguments or "")
    assert [json.loads(a) for a in by_index.values()] == [
        json.loads(c.function.arguments) for c in whole
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_named_and_none_tool_choice(client: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    r = client.chat.completions.create(
        model=SMOL, messages=ASK, tools=[WEATHER, TIME], tool_choice=named, max_tokens=48
    )
    assert {c.function.name for c in r.choices[0].message.tool_calls} == {"get_time"}
    r = client.chat.completions.create(
        model=SMOL, messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=3
    )
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content


def test_json_schema_and_json_object(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "pet": {"enum": ["cat", "dog"]},
        },
        "required": ["name", "age", "pet"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema, "strict": True}}
    r = client.chat.completions.create(
        model=SMOL,
        messages=[{"role": "user", "content": "Ann is 31 and has a cat."}],
        response_format=fmt,
        max_tokens=48,
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    assert r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(
        model=SMOL, messages=ASK, response_format={"type": "json_object"}, max_tokens=48
    )
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_errors_have_openai_shape_and_status(client: openai.OpenAI, smol: Any) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=SMOL, messages=ASK, n=2)
    assert info.value.param == "n"
    bad_tool = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"x": {"type": "string", "not": {}}}},
        },
    }
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=SMOL, messages=ASK, tools=[bad_tool])
    assert info.value.code == "invalid_schema"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=SMOL,
            messages=ASK,
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "nope"}},  # fmt: skip
        )
    assert info.value.code == "invalid_tool_choice"
    with pytest.raises(openai.BadRequestError, match="unknown policy"):
        client.chat.completions.create(
            model=SMOL, messages=ASK, extra_body={"pask_policy": "magic"}, max_tokens=4
        )
    with pytest.raises(openai.BadRequestError) as info:  # the shipped table is the Qwen model's
        client.chat.completions.create(
            model=SMOL, messages=ASK, extra_body={"pask_policy": "pask"}, max_tokens=4
        )
    assert info.value.code == "policy_unavailable"
    with pytest.raises(openai.APIStatusError) as info:  # SmolLM2's context is 8192 tokens
        client.chat.completions.create(model=SMOL, messages=ASK, max_tokens=9000)
    assert info.value.status_code == 413 and info.value.code == "context_length_exceeded"
    raw = httpx.post(f"{smol.base_url}/v1/chat/completions", content=b"[1, 2")
    assert raw.status_code == 400 and raw.json()["error"]["code"] == "invalid_json"


def test_conversation_reuses_its_kv_and_ends(client: openai.OpenAI, smol: Any) -> None:
    turn1 = [{"role": "user", "content": "My name is Ada. Say hi."}]
    body = {"conversation_id": "conv-1"}
    a = client.chat.completions.create(model=SMOL, messages=turn1, max_tokens=8, extra_body=body)
    turn2 = [
        *turn1,
        {"role": "assistant", "content": a.choices[0].message.content},
        {"role": "user", "content": "What is my name?"},
    ]
    b = client.chat.completions.create(model=SMOL, messages=turn2, max_tokens=8, extra_body=body)
    assert a.usage.prompt_tokens_details.cached_tokens == 0
    assert b.usage.prompt_tokens_details.cached_tokens >= a.usage.prompt_tokens - 1
    assert smol.metric("pask_kv_live_bytes") > 0  # the conversation keeps its KV
    gone = httpx.delete(f"{smol.base_url}/v1/conversations/conv-1")
    assert gone.status_code == 200 and gone.json()["deleted"] is True
    assert httpx.delete(f"{smol.base_url}/v1/conversations/conv-1").status_code == 404
    assert smol.wait_for_metric("pask_kv_live_bytes", 0.0) == 0.0


def test_health_and_metrics(smol: Any, client: openai.OpenAI) -> None:
    health = httpx.get(f"{smol.base_url}/health").json()
    assert health["status"] == "ok" and health["model"] == SMOL
    client.chat.completions.create(model=SMOL, messages=STORY, max_tokens=3)
    text = httpx.get(f"{smol.base_url}/metrics").text
    for name in (
        "pask_kv_live_bytes",
        "pask_kv_allocated_bytes",
        "pask_queue_depth",
        "pask_tokens_per_second",
        "pask_measured_b_bucket",
        "pask_tagger_fallbacks_total",
        "pask_ceiling_fallback_tokens_total",
        "pask_shed_fallback_rows_total",
        'pask_requests_total{status="200"}',
    ):
        assert name in text, name
    assert smol.metric("pask_kv_allocated_bytes") > 0
    assert smol.metric("pask_tokens_per_second") > 0
    assert smol.metric("pask_measured_b_count") >= 1
