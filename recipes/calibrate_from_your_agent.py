"""Recipe: calibrate PASK for *your* agent — record its turns, calibrate a table, serve with it.

    python recipes/calibrate_from_your_agent.py --out /tmp/my_agent            # default model
    python recipes/calibrate_from_your_agent.py --model smollm2-135m --questions 6 --out /tmp/x

1. A LangChain agent (``create_agent``) runs your tools over a set of questions with
   ``PaskChatModel(record_traces=...)``: every finished model turn becomes one trace line.
2. The traces are split alternately into calibration and development files, and
   ``pask_agent.calibration.calibrate`` measures Runtime-V/D on them and writes a table for
   this model (the same as ``pask-agent calibrate --traces ... --dev ...``).
3. The model is used again with that table (``policy_table=``), under the budget you chose.

A trace records the outcome the runtime knows (the turn ended by itself); if your agent knows
better (the tool ran, the answer checked), rewrite ``ok`` in the file before calibrating.
"""

from __future__ import annotations

import argparse
import json
from datetime import date
from pathlib import Path

from langchain.agents import create_agent
from langchain_core.tools import tool

from pask_agent.calibration.calibrate import CalibrationConfig, calibrate
from pask_agent.integrations.langchain import PaskChatModel

QUESTIONS = (
    "How many days are there from 2024-01-15 to 2024-03-01?",
    "What is 21.5 degrees Celsius in Fahrenheit?",
    "How many days from 2023-12-24 to 2024-01-01?",
    "Convert 100 Celsius to Fahrenheit.",
    "How many days are between 2025-02-01 and 2025-03-01?",
    "What is -40 degrees Celsius in Fahrenheit?",
    "Count the days from 2022-06-01 to 2022-09-15.",
    "Convert 37 degrees Celsius to Fahrenheit.",
)


@tool
def days_between(start: str, end: str) -> int:
    """Count the days from one date to another.

    Args:
        start: First date, YYYY-MM-DD.
        end: Second date, YYYY-MM-DD.
    """
    try:
        return (date.fromisoformat(end) - date.fromisoformat(start)).days
    except ValueError:
        return -1


@tool
def celsius_to_fahrenheit(celsius: float) -> float:
    """Convert a temperature from Celsius to Fahrenheit.

    Args:
        celsius: Degrees Celsius.
    """
    return round(float(celsius) * 9 / 5 + 32, 2)


TOOLS = [days_between, celsius_to_fahrenheit]


def record(model: str, questions: list[str], traces: Path) -> None:
    """Run the agent once per question; every model turn appends a trace."""
    chat = PaskChatModel(model=model, record_traces=str(traces), max_tokens=96)
    agent = create_agent(chat, TOOLS, system_prompt="Call the matching tool, then answer.")
    for q in questions:
        try:
            agent.invoke({"messages": [("user", q)]}, config={"recursion_limit": 6})
        except Exception as exc:  # noqa: BLE001 - a run that loops still left its traces
            print(f"agent stopped on {q!r}: {type(exc).__name__}")


def split(traces: Path, cal: Path, dev: Path) -> tuple[int, int]:
    """Alternate lines into calibration and development files (turns with tools only)."""
    lines = [ln for ln in traces.read_text().splitlines() if json.loads(ln).get("tools")]
    cal.write_text("".join(ln + "\n" for ln in lines[0::2]))
    dev.write_text("".join(ln + "\n" for ln in lines[1::2]))
    return len(lines[0::2]), len(lines[1::2])


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--questions", type=int, default=len(QUESTIONS))
    ap.add_argument("--budget", type=float, default=0.33)
    ap.add_argument("--out", type=Path, required=True, help="folder for traces and the table")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    traces = args.out / "agent_traces.jsonl"
    traces.unlink(missing_ok=True)
    record(args.model, list(QUESTIONS[: args.questions]), traces)
    cal, dev = args.out / "cal.jsonl", args.out / "dev.jsonl"
    n_cal, n_dev = split(traces, cal, dev)
    print(f"recorded {n_cal + n_dev} turns with tools: {n_cal} calibration, {n_dev} development")
    table = args.out / "table.json"
    result = calibrate(
        CalibrationConfig(
            traces=(cal,),
            dev=(dev,),
            out=table,
            model=args.model,
            budget=args.budget,
            command=f"recipes/calibrate_from_your_agent.py --model {args.model}",
        )  # fmt: skip
    )
    print(f"calibrated in {result.wall_seconds:.0f} s: B_D={result.budget_decode}, {table}")
    served = PaskChatModel(
        model=args.model, policy="pask", policy_table=str(table), budget=args.budget
    ).bind_tools(TOOLS, tool_choice="any")
    reply = served.invoke(QUESTIONS[0])
    kv = reply.response_metadata["kv"]
    print(f"with the calibrated table: {reply.tool_calls[:1]}  measured B {kv['measured_b']:.3f}")
    return {
        "table": table,
        "tool_calls": reply.tool_calls,
        "text": reply.content,
        "finish": reply.response_metadata.get("finish_reason"),
        "measured_b": kv["measured_b"],
    }


if __name__ == "__main__":
    main()
