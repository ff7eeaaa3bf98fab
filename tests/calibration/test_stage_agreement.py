"""Calibration selects a table at the prompt budgets the runtime serves it with (issue 30,
item 1): for the same prompt and budget, the ``B_P`` calibration's prompt candidates are
replayed at (``calibrate.selection_prompt_budgets``) is the ``B_P`` the runtime's PASK session
plans (``usage.planned_b_prompt``), and decoding is planned at ``max(B_D, min(INT4's cost, B))``.
Below INT4's cost no plan serves (PASK releases by span label, ``usage.plan_mode``).

SmolLM2-135M, two traces recorded by the runtime itself, the shipped table (transferred: its
budgets and expected answer length are what is being checked, not its buckets).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from sample_tools import convert_currency, get_weather

from pask_agent.calibration.calibrate import CalibrationConfig
from pask_agent.calibration.replay import TraceReplayer
from pask_agent.calibration.selection import selection_prompt_budgets
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.pask import PaskPolicy
from pask_agent.record.traces import read_traces
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.runtime import Runtime

WINDOW = 8


@pytest.fixture(scope="module")
def traces(smollm2, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("stage") / "dev.jsonl"

    async def main() -> None:
        async with Runtime.open(smollm2, config=RuntimeConfig(window=WINDOW)) as rt:
            for q in ("What is the weather in Oslo?", "Convert 250 euros to US dollars."):
                await rt.chat(
                    [{"role": "user", "content": q}],
                    tools=[get_weather, convert_currency],
                    tool_choice="required",
                    max_new_tokens=24,
                    record_traces=str(path),
                )

    anyio.run(main)
    return path


def test_calibration_selects_at_the_b_p_the_runtime_plans(smollm2, traces) -> None:
    table = PaskPolicy().resolved_table()
    expected = table.expected_output_tokens
    assert expected is not None
    dev = read_traces(traces)
    replayer = TraceReplayer(smollm2.tokenizer, int(smollm2.model.config.vocab_size))
    replayed = [replayer.replay(t, where=str(i)) for i, t in enumerate(dev)]
    config = CalibrationConfig(
        traces=(traces,), dev=(traces,), out=traces.with_suffix(".json"), sinks=4, window=WINDOW
    )
    budgets = (0.27, 0.33)  # both at or above INT4's cost (0.266): the plan serves
    cfg = smollm2.model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    costs = PayloadCosts.from_dims(cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim)
    floor = costs.int4_share
    selected = {
        b: selection_prompt_budgets(replayed, b, table.budget_decode, expected, config, floor)
        for b in budgets
    }

    async def serve() -> dict[float, list[Any]]:
        policy = PaskPolicy(table, allow_transfer=True)
        out: dict[float, list[Any]] = {b: [] for b in budgets}
        async with Runtime.open(smollm2, config=RuntimeConfig(sinks=4, window=WINDOW)) as rt:
            below = await rt.chat(
                list(dev[0].messages), tools=list(dev[0].tools), policy=policy, budget=0.2,
                tool_choice=dev[0].tool_choice, max_new_tokens=24,
            )  # fmt: skip
            assert below.usage.plan_mode == "release" and below.usage.measured_b <= 0.2 + 1e-9
            for b in budgets:
                for t in dev:
                    result = await rt.chat(
                        list(t.messages), tools=list(t.tools), tool_choice=t.tool_choice,
                        parallel_tool_calls=t.parallel_tool_calls, policy=policy, budget=b,
                        max_new_tokens=60,  # ≥ the expected answer: it does not cap the solve
                    )  # fmt: skip
                    out[b].append(result.usage)
        return out

    served = anyio.run(serve)
    for b in budgets:
        assert table.budget_decode < min(float(floor), b)  # the floor is what binds here
        # decoding is planned at max(B_D, min(INT4's cost, B)), not max(B_D, B)
        decode = max(table.budget_decode, min(float(floor), b))
        for usage, r, b_p in zip(served[b], replayed, selected[b], strict=True):
            assert usage.prompt_tokens == r.prompt_len
            assert usage.planned_b_prompt == b_p  # the same function on the same numbers
            assert usage.planned_b_decode == pytest.approx(decode, abs=1e-4)
            n = r.prompt_len
            old_rule = (b * (n + expected) - min(expected, WINDOW)
                        - b * max(expected - WINDOW, 0)) / n  # fmt: skip
            # where decoding spends less than B, the prompt got what it freed
            assert (b_p > old_rule + 1e-9) == (decode < b)
            assert usage.measured_b_prompt <= b_p + 1e-9
