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


def test_create_agent_makes_the_same_calls_over_http_and_in_process(smol: ThreadServer) -> None:
    """The same agent, once over ``ChatOpenAI`` against the server and once over
    ``PaskChatModel`` in this process, makes the same calls with the same arguments at every
    step, each step reading the earlier calls' tool results. SmolLM2 calls tools only when
    made to, so a middleware requires one call at every step (LangChain's ``tool_choice`` and
    ``parallel_tool_calls``, which each model sends as its own API says) and the graph's
    recursion limit ends the run; the steps until then are compared."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import wrap_model_call
    from langchain_core.messages import AIMessage
    from langgraph.errors import GraphRecursionError

    from pask_agent import PaskChatModel

    def run(agent: object, question: str) -> list[list[tuple[str, dict]]]:
        steps: list[list[tuple[str, dict]]] = []
        try:
            for state in agent.stream(  # type: ignore[attr-defined]
                {"messages": [("user", question)]}, {"recursion_limit": 6}, stream_mode="values"
            ):
                last = state["messages"][-1]
                if isinstance(last, AIMessage):
                    steps.append([(c["name"], c["args"]) for c in last.tool_calls])
        except GraphRecursionError:
            pass
        return steps

    @wrap_model_call
    def require_a_call(request, handler):  # type: ignore[no-untyped-def]
        one_call = {"parallel_tool_calls": False}  # a 135M model repeats a call in an array
        return handler(request.override(tool_choice="required", model_settings=one_call))

    tools, middleware = [get_weather], [require_a_call]
    over_http = create_agent(chat(smol, max_tokens=48), tools, middleware=middleware)
    in_process = create_agent(
        PaskChatModel(model="smollm2-135m", max_tokens=48), tools, middleware=middleware
    )
    question = "What is the weather in Lisbon?"
    http_steps = run(over_http, question)
    assert len(http_steps) >= 2 and all(http_steps), http_steps  # a call at every step
    assert http_steps == run(in_process, question)
