"""Recipe: a LangChain tool-calling agent loop on the local default model.

    python recipes/langchain_agent.py "How many days are there between 2024-01-15 and 2024-03-01?"

Three real Python tools are bound with ``tool_choice="auto"``: the model decides whether to
call one; each call is executed and its result goes back as a ``ToolMessage`` until the model
answers in text. Every step reuses the KV of the conversation so far (``cache_read`` below).
"""

from __future__ import annotations

import sys
from datetime import date

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool

from pask_agent.integrations.langchain import PaskChatModel


@tool
def days_between(start: str, end: str) -> int:
    """Count the days from one date to another.

    Args:
        start: First date, YYYY-MM-DD.
        end: Second date, YYYY-MM-DD.
    """
    return (date.fromisoformat(end) - date.fromisoformat(start)).days


@tool
def word_count(text: str) -> int:
    """Count the words in a piece of text.

    Args:
        text: The text to count.
    """
    return len(text.split())


@tool
def celsius_to_fahrenheit(celsius: float) -> float:
    """Convert a temperature from Celsius to Fahrenheit.

    Args:
        celsius: Temperature in degrees Celsius.
    """
    return round(celsius * 9 / 5 + 32, 2)


TOOLS = {t.name: t for t in (days_between, word_count, celsius_to_fahrenheit)}


def run_agent(question: str, *, max_steps: int = 4, max_tokens: int = 64) -> list[BaseMessage]:
    """Run the loop; returns the whole history (the last message is the model's answer)."""
    llm = PaskChatModel(max_tokens=max_tokens).bind_tools(list(TOOLS.values()))
    messages: list[BaseMessage] = [HumanMessage(question)]
    for _ in range(max_steps):
        reply = llm.invoke(messages)
        messages.append(reply)
        usage = reply.usage_metadata or {}
        reused = usage.get("input_token_details", {}).get("cache_read", 0)
        print(f"[step] {usage.get('input_tokens')} prompt tokens, {reused} reused from cache")
        if not isinstance(reply, AIMessage) or not reply.tool_calls:
            break
        for call in reply.tool_calls:
            result = TOOLS[call["name"]].invoke(call)  # a ToolMessage with the call's id
            print(f"[tool] {call['name']}({call['args']}) -> {result.content}")
            messages.append(result)
    return messages


if __name__ == "__main__":
    q = (
        sys.argv[1]
        if len(sys.argv) > 1
        else "How many days are there from 2024-01-15 to 2024-03-01?"
    )
    print(run_agent(q)[-1].content)
