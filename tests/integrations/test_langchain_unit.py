"""langchain-tests' standard ``ChatModelUnitTests`` for ``PaskChatModel`` (no model is loaded).

Capability flags are the suite's own: tool calling, tool choice, structured output and JSON
mode are supported; images, audio, video and PDFs are not (the bundled models read text).
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.language_models.chat_models import generate_from_stream
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGenerationChunk
from langchain_tests.unit_tests import ChatModelUnitTests

from pask_agent.errors import ConfigError, SchemaError, ToolChoiceError
from pask_agent.grammars.tool_spec import tool_specs
from pask_agent.integrations._lc_messages import to_openai_messages
from pask_agent.integrations._lc_tools import normalize_tool_choice
from pask_agent.integrations._lc_turn import LcTurn, _ChunkBuilder, salvage_wrapped_call
from pask_agent.integrations._portal import runtime_registry
from pask_agent.integrations.langchain import PaskChatModel
from pask_agent.runtime.turns.outputs import parse_tool_calls
from pask_agent.runtime.turns.results import ChatResult, Delta, Usage
from pask_agent.runtime.turns.turn import TurnRequest


class TestPaskChatModelUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[PaskChatModel]:
        return PaskChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": "default"}

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def model_override_value(self) -> str:
        return "smollm2-135m"


def test_constructor_tools_equal_bind_tools() -> None:
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: First.
            b: Second.
        """
        return a + b

    built = PaskChatModel(tools=[add], tool_choice="any")
    bound = PaskChatModel().bind_tools([add], tool_choice="any")
    assert built.tools == bound.kwargs["tools"]  # type: ignore[attr-defined]
    assert built.tool_choice == bound.kwargs["tool_choice"] == "required"  # type: ignore[attr-defined]
    assert built.tools[0]["function"]["parameters"]["required"] == ["a", "b"]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", "auto"),
        ("any", "required"),
        ("required", "required"),
        (True, "required"),
        ("none", "none"),
        ("add", "add"),
        ({"type": "function", "function": {"name": "add"}}, "add"),
        ({"type": "tool", "name": "add"}, "add"),
    ],
)
def test_tool_choice_forms(choice: Any, expected: str) -> None:
    assert normalize_tool_choice(choice) == expected


def test_bad_inputs_raise_typed_errors() -> None:
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    with pytest.raises(ToolChoiceError, match="names no bound tool"):
        PaskChatModel().bind_tools([add], tool_choice="multiply")
    with pytest.raises(ToolChoiceError):
        normalize_tool_choice(3)
    with pytest.raises(SchemaError):
        PaskChatModel().bind_tools("add")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown method"):
        PaskChatModel().with_structured_output({"title": "x", "type": "object"}, method="xml")  # type: ignore[arg-type]


def _result(text: str) -> ChatResult:
    usage = Usage(10, 5, 10, 0, 0, 1.0, 0, 0.0, 0.0)
    return ChatResult(text, (), usage, "stop")


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather at a place.",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string"}},
            "required": ["location"],
        },
    },
}


def test_history_converts_to_template_messages() -> None:
    history = [
        SystemMessage("be brief"),
        HumanMessage("weather in Oslo?"),
        AIMessage(
            [{"type": "text", "text": "checking"}, {"type": "tool_use", "id": "t1"}],
            tool_calls=[{"name": "get_weather", "args": {"location": "Oslo"}, "id": "t1"}],
        ),
        ToolMessage("rain", tool_call_id="t1"),
    ]
    assert to_openai_messages(history) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather in Oslo?"},
        {
            "role": "assistant",
            "content": "checking",
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"location": "Oslo"}},
                }
            ],
        },
        {"role": "tool", "content": "rain", "tool_call_id": "t1"},
    ]
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}
    with pytest.raises(ConfigError, match="text only"):
        to_openai_messages([HumanMessage(content=[image])])


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ('```json\n{"name": "get_weather", "arguments": {"location": "Oslo"}}\n```', 1),
        (
            '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Oslo"}}\n</tool_call>',
            1,
        ),
        ('```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```', 0),
        ('```json\n{"name": "send_mail", "arguments": {}}\n```', 0),
        ("```python\nprint('hi')\n```", 0),
    ],
)
def test_wrapped_calls_are_read_only_when_valid(text: str, calls: int) -> None:
    result = salvage_wrapped_call(_result(text), [WEATHER])
    assert len(result.tool_calls) == calls
    if calls:
        assert result.tool_calls[0].arguments == {"location": "Oslo"}
        assert result.finish_reason == "tool_calls"


def test_stop_sequence_cuts_text_across_deltas() -> None:
    builder = _ChunkBuilder(_request(stop=("you",)), tool_mode=False)
    sent = []
    for piece in ["Hel", "lo yo", "u there"]:
        sent += [c.text for c in builder.feed(Delta(piece, (1,)))]
        if builder.stopped:
            break
    assert "".join(sent) == "Hello " and builder.stopped
    final = builder.final()
    assert final.message.chunk_position == "last"
    assert final.message.usage_metadata["output_tokens"] == 3  # the stop was in the 3rd


def _request(stop: tuple[str, ...], tools: tuple[dict[str, Any], ...] | None = None) -> LcTurn:
    return LcTurn(
        host=runtime_registry().host("default"),  # not started: hosts start on first call
        model_name="default",
        turn=TurnRequest(
            ({"role": "user", "content": "hi"},), tools=tools, policy="full", max_new_tokens=8
        ),
        response_format=None,
        stop=stop,
        timeout_s=None,
        max_retries=0,
        conversation_id=None,
    )


CALL = '{"name": "get_weather", "arguments": {"location": "Oslo"}}'


def _turn(
    text: str, *, stop: tuple[str, ...] = (), step: int = 3
) -> tuple[list[ChatGenerationChunk], _ChunkBuilder]:
    """Feed ``text`` in pieces as the runtime would, then the result the runtime would give."""
    builder = _ChunkBuilder(_request(stop, tools=(WEATHER,)), tool_mode=True)
    chunks: list[ChatGenerationChunk] = []
    for i in range(0, len(text), step):
        chunks += builder.feed(Delta(text[i : i + step], (1,)))
        if builder.stopped:
            break
    if not builder.stopped:
        calls = parse_tool_calls(text, tool_specs([WEATHER]))
        usage = Usage(10, len(text), 10, 0, 0, 1.0, 0, 0.0, 0.0)
        builder.result = ChatResult(text, calls, usage, "tool_calls" if calls else "stop")
    return [*chunks, builder.final()], builder


@pytest.mark.parametrize("step", [1, 2, 5, 100])
def test_mixed_turn_streams_text_then_tool_calls(step: int) -> None:
    chunks, _ = _turn("Let me check the weather.\n\n" + CALL, step=step)
    *text_chunks, last = chunks
    assert "".join(c.message.content for c in text_chunks) == "Let me check the weather."
    assert all(not c.message.tool_call_chunks for c in text_chunks)
    assert last.message.content == "" and last.message.tool_call_chunks
    message = generate_from_stream(iter(chunks)).generations[0].message
    assert message.content == "Let me check the weather."
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [
        ("get_weather", {"location": "Oslo"})
    ]
    assert message.response_metadata["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(
    ("text", "content", "n_calls"),
    [
        (CALL, "", 1),
        (f"[{CALL}, {CALL}]", "", 2),
        ("Sunny.\n\nWindy later.\n", "Sunny.\n\nWindy later.\n", 0),
        ("Let me check.\n" + CALL[:20], "Let me check.\n" + CALL[:20], 0),  # cut: stays text
        ("Two:\n" + f"[{CALL}, {CALL}]", "Two:", 2),
    ],
)
def test_turn_assembles_like_the_runtime_message(text: str, content: str, n_calls: int) -> None:
    chunks, _ = _turn(text)
    message = generate_from_stream(iter(chunks)).generations[0].message
    assert message.content == content
    assert len(message.tool_calls) == n_calls


def test_stop_sequence_in_the_text_drops_the_calls() -> None:
    chunks, builder = _turn("Let me check. END\n" + CALL, stop=("END",))
    message = generate_from_stream(iter(chunks)).generations[0].message
    assert builder.stopped and message.content == "Let me check. " and not message.tool_calls


def test_wrapped_call_is_still_held_and_salvaged() -> None:
    text = "```json\n" + CALL + "\n```"
    chunks, builder = _turn(text)
    assert builder.wrapped and len(chunks) == 1  # nothing streamed before the last chunk
    message = generate_from_stream(iter(chunks)).generations[0].message
    assert message.content == "" and message.tool_calls[0]["args"] == {"location": "Oslo"}
