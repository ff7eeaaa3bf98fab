"""LangChain's own ``ChatOpenAI(base_url=...)`` against the server (SmolLM2): plain, bound tools,
streamed tool-call chunks merged by LangChain."""

from __future__ import annotations

import jsonschema
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from server_harness import SMOL, ThreadServer


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
        city: The city name.
    """
    return "sunny"


ARGS = get_weather.tool_call_schema.model_json_schema()


def chat(server: ThreadServer, **kw: object) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=f"{server.base_url}/v1",
        api_key="unused",
        model=SMOL,
        temperature=0,
        max_retries=0,
        **kw,
    )


def test_chat_openai_plain_and_bound_tools(smol: ThreadServer) -> None:
    answer = chat(smol, max_tokens=6).invoke("Say hello.")
    assert isinstance(answer.content, str) and answer.content
    assert answer.usage_metadata["output_tokens"] == 6
    assert answer.usage_metadata["input_tokens"] > 0
    bound = chat(smol, max_tokens=32).bind_tools([get_weather], tool_choice="get_weather")
    call = bound.invoke("What is the weather in Lisbon?")
    (tc,) = call.tool_calls
    assert tc["name"] == "get_weather" and tc["id"].startswith("call_")
    jsonschema.validate(tc["args"], ARGS)
    # streamed: LangChain merges the server's tool-call deltas into the same call
    merged = None
    for piece in bound.stream("What is the weather in Lisbon?"):
        merged = piece if merged is None else merged + piece
    assert merged is not None
    assert [(c["name"], c["args"]) for c in merged.tool_calls] == [(tc["name"], tc["args"])]
