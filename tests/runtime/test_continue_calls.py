"""Continuing parallel calls by threshold, on the default model.

Greedy, the 0.5B model closes the array after one call even when the request lists several
items; with ``continue_calls_at`` it writes the others and still stops after the last one."""

from __future__ import annotations

import anyio
import pytest

from pask_agent.errors import ConfigError
from pask_agent.eval.bfcl import ast_check, load_bfcl
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.runtime import Runtime


def test_threshold_must_be_a_probability() -> None:
    for bad in (0.0, 1.0, -0.1, 2.0):
        with pytest.raises(ConfigError, match="continue_calls_at"):
            RuntimeConfig(continue_calls_at=bad)


@pytest.mark.slow
def test_threshold_writes_every_call_the_request_asks_for(default_model) -> None:
    (case,) = [c for c in load_bfcl("parallel", limit=8) if c.id == "parallel_6"]
    assert len(case.ground_truth) == 3

    async def calls(tau: float | None) -> list[dict]:
        config = RuntimeConfig(continue_calls_at=tau)
        async with Runtime.open(default_model, config=config) as rt:
            result = await rt.chat(**case.request(), max_new_tokens=200)
        assert result.finish_reason == "tool_calls"
        return [{"name": c.name, "arguments": c.arguments} for c in result.tool_calls]

    greedy = anyio.run(calls, None)
    assert len(greedy) == 1  # the failure this rule exists for
    continued = anyio.run(calls, 0.01)
    assert len(continued) == 3 and ast_check(case, continued)
