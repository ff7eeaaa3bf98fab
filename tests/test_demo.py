"""``make demo`` on the bundled default model: what it prints is what happened."""

from __future__ import annotations

import re

import anyio
import pytest


@pytest.mark.slow
def test_demo_prints_both_calls_their_measured_budgets_and_whether_they_agree(
    default_model, capsys
) -> None:
    from pask_agent import demo

    anyio.run(demo.main)
    out = capsys.readouterr().out
    assert "tool call: get_weather({'city': 'Lisbon', 'unit': 'fahrenheit'})" in out  # Full KV
    budgets = [float(b) for b in re.findall(r"measured B=([0-9.]+)", out)]
    assert budgets[0] == 1.0 and budgets[1] <= 0.35  # PASK keeps its budget on this prompt
    calls = re.findall(r"tool call: (.*)", out)
    verdict = "matches" if calls[0] == calls[1] else "differs from"
    assert f"PASK's call {verdict} Full KV's" in out
    assert "Flight(origin='Boston', destination='Denver', passengers=2" in out
