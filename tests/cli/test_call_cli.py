"""``pask-agent call`` on the default model: tools and JSON Schema, printed as JSON."""

from __future__ import annotations

import json

import jsonschema
import pytest

from pask_agent.cli import main

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_stock_price",
            "description": "Latest price of a stock by its ticker symbol.",
            "parameters": {
                "type": "object",
                "properties": {
                    "ticker": {"type": "string", "description": "Ticker, e.g. AAPL"},
                    "currency": {"type": "string", "enum": ["USD", "EUR"]},
                },
                "required": ["ticker"],
            },
        },
    }
]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
}


@pytest.mark.slow
def test_call_with_tools_and_schema(default_model, tmp_path, capsys) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    assert (
        main(
            [
                "call",
                "--tools",
                str(tools),
                "--prompt",
                "What is Apple's stock price in euros?",
                "--tool-choice",
                "required",
                "--max-new-tokens",
                "48",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    call = out["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_stock_price"
    jsonschema.validate(json.loads(call["arguments"]), TOOLS[0]["function"]["parameters"])
    assert out["usage"]["measured_b"] == 1.0 and out["usage"]["prompt_tokens"] > 50
    assert (
        main(
            [
                "call",
                "--schema",
                str(schema),
                "--prompt",
                "Tokyo has about 14 million people.",
                "--max-new-tokens",
                "32",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    jsonschema.validate(out["value"], SCHEMA)
    assert out["value"]["city"] == "Tokyo"


def test_call_reports_bad_schema_file(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["call", "--schema", str(bad), "--prompt", "x", "--model", "smollm2-135m"]) == 2
    assert "cannot read JSON" in capsys.readouterr().err
