"""The baselines that do not use the parser: ``int4`` and ``position_both``.

``int4`` on the store (a tiny random Qwen2 through the Runtime): at ``B = 1`` every token
outside sinks and window is INT4 and nothing is released, so its bytes follow from the token
count alone; at ``B = 0.15`` it holds the budget by releasing the oldest settled tokens.
``position_both`` at the policy level: its prompt plan ignores span labels (PASK's does not)
and upgrades newer bins first. Then both end to end on SmolLM2, with measured ``B``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from pask_agent.policy import Int4Policy, PaskPolicy, PolicyEnv, PositionBothPolicy
from pask_agent.policy.actions import Action
from pask_agent.policy.costs import PayloadCosts
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.models.loading import LoadedModel, load_tokenizer
from pask_agent.runtime.runtime import Runtime

SINKS, WINDOW, NEW = 4, 8, 16
# tiny_qwen2: 6 layers, 2 KV heads, head dim 16 → per token H 6·2·2·16·2 = 768 bytes,
# INT4 6·2·2·(16/2 + 2) = 240 bytes
C_FULL, C_INT4 = 768, 240
PROMPT = "Write a long list of harbors, ships and things found at sea. " * 12


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    from tiny_models import tiny_qwen2

    return LoadedModel("tiny-qwen2", Path("."), tiny_qwen2(151936), load_tokenizer("default"))


def _int4_run(tiny: LoadedModel, budget: float) -> tuple[Any, list[tuple[list[int], ...]]]:
    async def main() -> tuple[Any, list[tuple[list[int], ...]]]:
        config = RuntimeConfig(sinks=SINKS, window=WINDOW, prefill_chunk_tokens=64)
        async with Runtime.open(tiny, config=config) as rt:
            conv = rt.conversation("int4")
            result = await rt.chat(
                [{"role": "user", "content": PROMPT}], policy=Int4Policy(), budget=budget,
                max_new_tokens=NEW, ignore_eos=True, conversation=conv,
            )  # fmt: skip
            seq = conv._state.seq_id
            return result, [
                tuple(a.tolist() for a in rt.engine.store.retained_arrays(seq, g)) for g in range(3)
            ]

    return anyio.run(main)


def test_int4_keeps_every_token_int4_at_b_one_and_releases_the_oldest_below(tiny) -> None:
    result, held = _int4_run(tiny, 1.0)
    u = result.usage
    n = u.full_kv_bytes // C_FULL  # tokens with KV: the prompt and all but the last new one
    assert n > 150
    protected = SINKS + WINDOW
    assert u.kv_bytes == protected * C_FULL + (n - protected) * C_INT4  # nothing released
    assert u.measured_b == pytest.approx((12 + (n - 12) * 240 / 768) / n)  # ≈ 0.34 here
    outside = list(range(SINKS, n - WINDOW))
    for high, low in held:
        assert sorted(low) == outside
        assert sorted(high) == [*range(SINKS), *range(n - WINDOW, n)]

    result, held = _int4_run(tiny, 0.15)
    u = result.usage
    assert u.full_kv_bytes // C_FULL == n  # the same tokens (greedy on the same prompt)
    assert u.measured_b <= 0.15 < (protected * C_FULL + (n - protected) * C_INT4) / (n * C_FULL)
    assert u.measured_b > 0.15 - 2 * C_INT4 / (n * C_FULL)  # within a token per group of it
    for high, low in held:
        # the newest settled tokens stay INT4, every older one is gone; sinks and window stay
        first = min(low)
        assert first > SINKS and sorted(low) == list(range(first, n - WINDOW))
        assert sorted(high) == [*range(SINKS), *range(n - WINDOW, n)]


# ------------------------------------------------------------------ position_both
COSTS = PayloadCosts.from_dims(24, 2, 64)
LABELS = ("function_name", "parameter_key", "schema_description", "protected_content")


def _plan(policy: Any, labels: list[str], budget: float) -> np.ndarray:
    session = policy.start(PolicyEnv(COSTS, 4, 16, budget))
    return np.array([[int(a) for a in row] for row in session.plan_prefill(labels)])


def test_position_both_ignores_span_labels_and_prefers_newer_bins() -> None:
    rng = np.random.default_rng(0)
    mixed = [LABELS[i] for i in rng.integers(0, 4, 600)]
    flat = ["protected_content"] * 600
    both = PositionBothPolicy()
    assert np.array_equal(_plan(both, mixed, 0.33), _plan(both, flat, 0.33))
    pask = PaskPolicy(allow_transfer=True)
    assert not np.array_equal(_plan(pask, mixed, 0.33), _plan(pask, flat, 0.33))
    # the same budget, spent by position: later bins hold more (mean action per bin rises)
    plan = _plan(both, flat, 0.33)[4:-16]
    per_bin = [chunk.mean() for chunk in np.array_split(plan, 10)]
    assert per_bin[-1] > per_bin[0] and per_bin == sorted(per_bin)
    assert (plan >= int(Action.L)).sum() > 0


# ------------------------------------------------------------------ end to end on SmolLM2
def get_weather(city: str, unit: str = "celsius") -> str:
    """Get the current weather in a city.

    Args:
        city: The city name, e.g. Oslo.
        unit: Temperature unit, celsius or fahrenheit.
    """
    return "sunny"


def test_parser_free_baselines_run_end_to_end_on_smollm2(smollm2) -> None:
    runs = [
        ("int4", Int4Policy(), 1.0),
        ("int4", Int4Policy(), 0.15),
        ("position_both", PositionBothPolicy(), 0.33),
    ]
    question = [{"role": "user", "content": "What is the weather in Oslo, in fahrenheit?"}]

    async def main() -> list[Any]:
        out = []
        async with Runtime.open(smollm2, config=RuntimeConfig(window=WINDOW)) as rt:
            for _, policy, budget in runs:
                result = await rt.chat(
                    question, tools=[get_weather], tool_choice="required", max_new_tokens=32,
                    policy=policy, budget=budget, parallel_tool_calls=False,
                )  # fmt: skip
                out.append(result)
        return out

    results = anyio.run(main)
    for (name, _, budget), r in zip(runs, results, strict=True):
        u = r.usage
        print(f"{name} B={budget}: measured B {u.measured_b:.3f}, B_P {u.measured_b_prompt:.3f}")
        assert r.tool_calls and r.tool_calls[0].name == "get_weather"
        assert 0 < u.measured_b < 1
    int4_full, int4_low, both = (r.usage for r in results)
    # SmolLM2 rows: INT4 is (32 + 2) / 128 = 0.266 of BF16, plus sinks and window in BF16
    assert 0.266 < int4_full.measured_b < 0.4 and int4_full.planned_b_prompt is None
    assert int4_low.measured_b <= 0.15
    # the stage budgets a table policy planned are reported beside what it measured
    assert both.planned_b_prompt is not None and both.planned_b_decode is not None
    assert both.measured_b < 0.33 + 0.06
