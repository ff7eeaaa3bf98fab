"""``RuntimeConfig.schedule`` on SmolLM2: under "interleave" a prefilled request decodes while
the next prompt is prefilled; under "prefill_first" decoding waits until every admitted prompt
is in, so the requests admitted together decode together."""

from __future__ import annotations

import pytest

from pask_agent.errors import ConfigError
from pask_agent.policy.full import FullPolicy
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.engine import Engine
from pask_agent.runtime.requests import Request, SamplingParams
from pask_agent.runtime.turns.outputs import TEXT
from pask_agent.runtime.turns.results import Delta

NEW = 5


def _rows_per_step(smollm2, schedule: str) -> list[list[int]]:
    """For every step, the requests (by index) that received tokens in it."""
    engine = Engine(smollm2, RuntimeConfig(prefill_chunk_tokens=64, schedule=schedule))
    policy = FullPolicy()
    requests = []
    for i in range(3):
        text = f"Note {i}: the harbour log lists ships, cargo and tides for the week. " * 6
        ids = smollm2.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert len(ids) > 64  # every prompt needs two prefill chunks
        params = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
        state = engine.new_sequence(policy.start(None))
        requests.append(Request(ids, None, TEXT, params, state, policy))
    engine.inbox.extend(requests)
    steps = []
    while engine.has_work():
        got = {requests.index(r) for r, e in engine.step() if isinstance(e, Delta)}
        steps.append(sorted(got))
    tokens = [sum(i in s for s in steps) for i in range(3)]
    assert tokens == [NEW] * 3  # one token a step each, whatever the schedule
    return steps


def test_interleave_decodes_the_first_request_while_the_others_prefill(smollm2) -> None:
    steps = _rows_per_step(smollm2, "interleave")
    first_of_last = next(k for k, s in enumerate(steps) if 2 in s)
    assert sum(0 in s for s in steps[:first_of_last]) >= 2  # request 0 moved on meanwhile


def test_prefill_first_decodes_everything_admitted_together(smollm2) -> None:
    steps = _rows_per_step(smollm2, "prefill_first")
    first_of_last = next(k for k, s in enumerate(steps) if 2 in s)
    # until the last prompt is in, a step only hands out first tokens
    assert [i for s in steps[: first_of_last + 1] for i in s] == [0, 1, 2]
    # then every request decodes in every step until they finish
    assert steps[first_of_last + 1 :] == [[0, 1, 2]] * (NEW - 1)


def test_an_unknown_schedule_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="prefill_first"):
        RuntimeConfig(schedule="fifo")
