"""PaskChatModel on the real default model: the agent loop, and a CI subset of the standard
integration suite (the whole suite: ``python -m pask_agent.eval.langchain_suite``)."""

from __future__ import annotations

import asyncio
from datetime import date

import langchain_standard as standard
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from pask_agent.errors import ConfigError
from pask_agent.integrations.langchain import PaskChatModel

pytestmark = pytest.mark.slow
SUITE = standard.TestPaskChatModelIntegration()


@tool
def days_between(start: str, end: str) -> int:
    """Count the days from one date to another.

    Args:
        start: First date, YYYY-MM-DD.
        end: Second date, YYYY-MM-DD.
    """
    return (date.fromisoformat(end) - date.fromisoformat(start)).days


@pytest.fixture()
def model() -> PaskChatModel:
    return PaskChatModel(**SUITE.chat_model_params)


def test_agent_loop_calls_tool_then_answers_in_text(model: PaskChatModel) -> None:
    llm = model.bind_tools([days_between], tool_choice="auto")
    question = HumanMessage("How many days are there from 2024-01-15 to 2024-03-01?")
    first = llm.invoke([question])
    assert isinstance(first, AIMessage) and len(first.tool_calls) == 1
    call = first.tool_calls[0]
    assert call["name"] == "days_between" and call["id"]
    assert call["args"] == {"start": "2024-01-15", "end": "2024-03-01"}
    result = days_between.invoke(call)
    assert isinstance(result, ToolMessage) and result.tool_call_id == call["id"]
    answer = llm.invoke([question, first, result])
    assert not answer.tool_calls
    assert "46" in answer.text
    # The second step reuses the KV of the first step's prompt (all of it but, at most, the
    # last token, whose text may merge with the re-rendered call into another token).
    details = answer.usage_metadata["input_token_details"]
    assert details["cache_read"] >= first.usage_metadata["input_tokens"] - 1
    kv = answer.response_metadata["kv"]
    assert kv["prefilled_tokens"] == answer.usage_metadata["input_tokens"] - details["cache_read"]
    assert kv["measured_b"] == pytest.approx(1.0)


def test_multimodal_input_is_refused(model: PaskChatModel) -> None:
    image = {"type": "image", "base64": "AAAA", "mime_type": "image/png"}
    with pytest.raises(ConfigError, match="text only"):
        model.invoke([HumanMessage(content=[{"type": "text", "text": "Describe"}, image])])


# A representative subset of langchain-tests' ChatModelIntegrationTests.
def test_standard_invoke(model: PaskChatModel) -> None:
    SUITE.test_invoke(model)


def test_standard_astream(model: PaskChatModel) -> None:
    asyncio.run(SUITE.test_astream(model))


def test_standard_tool_calling(model: PaskChatModel) -> None:
    SUITE.test_tool_calling(model)


def test_standard_tool_choice(model: PaskChatModel) -> None:
    SUITE.test_tool_choice(model)


def test_standard_structured_output_pydantic(model: PaskChatModel) -> None:
    SUITE.test_structured_output(model, "pydantic")


def test_standard_stop_sequence(model: PaskChatModel) -> None:
    SUITE.test_stop_sequence(model)
