"""Recipe: LangChain's own agent (``create_agent``) on the local default model, over three turns.

    python recipes/langchain_agent.py [--out results/langchain_agent]

``PaskChatModel`` goes into ``langchain.agents.create_agent`` unchanged, with three real Python
tools and an ``InMemorySaver`` checkpointer. The three questions are three turns of one thread
(``thread_id``): the checkpointer replays the thread's history each turn, and the model maps the
thread to one runtime conversation, so every step prefills only what is new (``reused`` below)
and one PASK budget ledger spans the whole thread (``B`` below is measured, not configured).
Deleting the thread from the checkpointer, or leaving it idle for ``idle_timeout_s``, frees its
KV. ``--out`` writes every assistant step (prompt tokens, reused, measured B, calls) as JSON and
Markdown with the command, commit and machine.
"""

from __future__ import annotations

import argparse
import json
from datetime import date
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from pask_agent.integrations.langchain import PaskChatModel

QUESTIONS = (
    "How many days are there from 2024-01-15 to 2024-03-01?",
    "What is 21.5 degrees Celsius in Fahrenheit?",
    "How many words are in the sentence 'the quick brown fox jumps over the lazy dog'?",
)
BUDGET = 0.33  # PASK's KV budget B for the whole thread
SYSTEM = (
    "You are a careful assistant. For every question, call the matching tool first, then "
    "answer from its result."
)


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


TOOLS = [days_between, word_count, celsius_to_fahrenheit]


def build_agent(
    *, policy: str = "pask", budget: float | None = BUDGET, max_tokens: int = 64
) -> tuple[Any, InMemorySaver]:
    """The agent graph and its checkpointer (delete a thread there to free its KV).

    At B = 0.33 every turn calls its tool on the default model. (It did not before the history
    was written back as the model wrote it: with the template's <tool_call> markup in the
    history the model stopped calling tools after the first turn.)
    """
    model = PaskChatModel(policy=policy, budget=budget, max_tokens=max_tokens)
    saver = InMemorySaver()
    return create_agent(model, TOOLS, system_prompt=SYSTEM, checkpointer=saver), saver


def run_turns(
    agent: Any, questions: tuple[str, ...] = QUESTIONS, *, thread_id: str = "recipe"
) -> list[list[BaseMessage]]:
    """Ask each question as one turn of ``thread_id``; returns each turn's new messages."""
    config = {"configurable": {"thread_id": thread_id}, "recursion_limit": 12}
    turns: list[list[BaseMessage]] = []
    seen = 0
    for question in questions:
        state = agent.invoke({"messages": [{"role": "user", "content": question}]}, config)
        new = state["messages"][seen:]
        seen = len(state["messages"])
        turns.append(new)
        for message in new:
            _show(message)
    return turns


def _show(message: BaseMessage) -> None:
    if not isinstance(message, AIMessage):
        print(f"[{message.type}] {message.text}")
        return
    usage = message.usage_metadata or {}
    reused = usage.get("input_token_details", {}).get("cache_read", 0)
    kv = message.response_metadata.get("kv", {})
    said = ", ".join(f"{c['name']}({c['args']})" for c in message.tool_calls) or message.text
    print(
        f"[ai] {said}\n     {usage.get('input_tokens')} prompt tokens, {reused} reused, "
        f"measured B {kv.get('measured_b', float('nan')):.3f}"
    )


def write_steps(out: Path, turns: list[list[BaseMessage]], budget: float | None) -> None:
    """Each assistant step of each turn as a row of ``<out>.json`` and ``<out>.md``."""
    from pask_agent.record.provenance import provenance

    rows = []
    for t, turn in enumerate(turns, 1):
        for message in (m for m in turn if isinstance(m, AIMessage)):
            usage = message.usage_metadata or {}
            rows.append(
                {
                    "turn": t,
                    "prompt_tokens": usage.get("input_tokens"),
                    "reused": usage.get("input_token_details", {}).get("cache_read", 0),
                    "measured_b": message.response_metadata.get("kv", {}).get("measured_b"),
                    "said": [c["name"] for c in message.tool_calls] or message.text,
                }
            )
    run = provenance()
    out.parent.mkdir(parents=True, exist_ok=True)
    body = {"budget": budget, **run, "steps": rows}
    out.with_suffix(".json").write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    lines = [
        f"# LangChain create_agent recipe: one thread, PASK at B = {budget}\n",
        "| turn | prompt tokens | reused | measured B | said |",
        "|---|---|---|---|---|",
        *(
            f"| {r['turn']} | {r['prompt_tokens']} | {r['reused']} | {r['measured_b']:.3f} | "
            f"{r['said']} |"
            for r in rows
        ),
        "",
        f"Command: `{run['command']}` at commit `{run['git_commit']}` on {run['machine']}.",
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="create_agent on the default model, 3 turns")
    parser.add_argument("--out", type=Path, help="write the steps to <out>.json and <out>.md")
    args = parser.parse_args()
    graph, checkpointer = build_agent()
    done = run_turns(graph)
    if args.out:
        write_steps(args.out, done, BUDGET)
    checkpointer.delete_thread("recipe")  # its runtime conversation is freed within a second
