"""Shared prefill (``Engine._join``, ``KVStore.copy_sequence``) on the tiny random Qwen2.

Requests queued together with the same prompt under the same plan (an SQL question's
candidates, samples of one prompt) compute that prompt once: the others copy its KV and its
last logits. Each must still write exactly what it writes alone, hold the same KV, and report
that it computed none of its prompt.
"""

from __future__ import annotations

import pytest
import torch
from engine_greedy import engine_for, tiny_loaded

from pask_agent.errors import KVStoreError
from pask_agent.policy import (
    Int4Policy,
    KeyDiffPolicy,
    LabelReleasePolicy,
    Policy,
    PolicyEnv,
    SnapKVInt4Policy,
)
from pask_agent.policy.actions import Action
from pask_agent.policy.uniform import UniformPolicy
from pask_agent.runtime.engine import Engine
from pask_agent.runtime.models.loading import load_tokenizer
from pask_agent.runtime.requests import Failed, Request, SamplingParams
from pask_agent.runtime.turns.outputs import TEXT
from pask_agent.runtime.turns.results import Finished

NEW = 12
BUDGET = 0.2  # below the tiny model's INT4 share: the revising sessions release


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return tiny_loaded(tiny_model, load_tokenizer("default"))


def _prompt(n: int, seed: int = 3) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _request(
    engine: Engine, prompt: list[int], action: Action | Policy, seed: int | None
) -> Request:
    """A request under ``UniformPolicy(action)``, or under ``action`` itself at ``BUDGET``."""
    if isinstance(action, Action):
        policy: Policy = UniformPolicy(action)
        session = policy.start()
    else:
        policy = action
        session = policy.start(
            PolicyEnv(engine.costs, engine.config.sinks, engine.config.window, BUDGET)
        )
    params = SamplingParams(
        max_new_tokens=NEW, temperature=0.0 if seed is None else 0.9, seed=seed, ignore_eos=True
    )
    return Request(list(prompt), None, TEXT, params, engine.new_sequence(session), policy)


def _ends(engine: Engine, requests: list[Request]) -> list[Finished]:
    ends = engine.run(requests)
    for end in ends:
        if isinstance(end, Failed):
            raise end.error
    return ends  # type: ignore[return-value]


@pytest.mark.parametrize(
    "action",
    [Action.H, Action.L, Action.R, Int4Policy(), LabelReleasePolicy(), KeyDiffPolicy()],
    ids=["H", "L", "R", "int4", "pask_release", "keydiff"],
)
def test_candidates_of_one_prompt_prefill_it_once_and_answer_as_alone(tiny, action) -> None:
    """A greedy request and two seeded samples of one 150-token prompt, queued together: the
    prompt is computed once (the samples report no prefilled token), each writes the tokens
    it writes alone and holds the same KV (high, INT4 or released rows alike). Sessions that
    revise after each step (``int4``, label release, ``keydiff`` with its copied keys) copy
    the prompt before the step's revisions and release the same rows as alone."""
    prompt, seeds = _prompt(150), [None, 11, 12]
    alone = []
    for seed in seeds:
        engine = engine_for(tiny, prefill_chunk_tokens=64)
        alone.append(_ends(engine, [_request(engine, prompt, action, seed)])[0])
    engine = engine_for(tiny, prefill_chunk_tokens=64)
    together = _ends(engine, [_request(engine, prompt, action, s) for s in seeds])
    assert [e.prefilled_tokens for e in together] == [150, 0, 0]
    assert [e.prefilled_tokens for e in alone] == [150, 150, 150]
    for a, t in zip(alone, together, strict=True):
        assert t.token_ids == a.token_ids
        assert (t.kv.high_bytes, t.kv.low_bytes) == (a.kv.high_bytes, a.kv.low_bytes)
    assert len({e.token_ids for e in together}) == 3  # the samples did sample
    if not isinstance(action, Action):  # the revising sessions did release (B = 0.2)
        assert all(e.kv.measured_b <= BUDGET + 1e-9 for e in together)
    assert engine.store.num_sequences == 0
    engine.store.audit()


def test_a_follower_whose_leader_is_cancelled_prefills_alone(tiny) -> None:
    """The leader is cancelled halfway through its prompt: the follower computes the prompt
    itself and writes what it writes alone."""
    prompt = _prompt(160)
    engine = engine_for(tiny, prefill_chunk_tokens=32)
    (alone,) = _ends(engine, [_request(engine, prompt, Action.L, 5)])
    leader, follower = (_request(engine, prompt, Action.L, s) for s in (None, 5))
    engine.inbox.extend([leader, follower])
    engine.step()
    assert follower.leader is leader and 0 < leader.prefill_pos < len(prompt)
    leader.cancelled = True
    ends = [e for _ in range(200) for r, e in engine.step() if r is follower]
    end = ends[-1]
    assert isinstance(end, Finished) and not engine.has_work()
    assert end.prefilled_tokens == len(prompt)
    assert end.token_ids == alone.token_ids
    engine.store.audit()


def test_requests_with_other_plans_or_prompts_prefill_their_own(tiny) -> None:
    """Same prompt under another plan (INT4 against BF16), or another prompt: no sharing."""
    prompt = _prompt(120)
    engine = engine_for(tiny, prefill_chunk_tokens=64)
    requests = [
        _request(engine, prompt, Action.H, None),
        _request(engine, prompt, Action.L, None),
        _request(engine, _prompt(120, seed=4), Action.H, None),
    ]
    assert [e.prefilled_tokens for e in _ends(engine, requests)] == [120, 120, 120]


def test_policies_that_rank_by_attention_prefill_their_own(tiny) -> None:
    """``snapkv_int4`` ranks the prompt by the attention its own prefill gathers: a copy would
    skip it, so its candidates compute the prompt each."""
    prompt = _prompt(120)
    engine = engine_for(tiny, prefill_chunk_tokens=64)
    requests = [_request(engine, prompt, SnapKVInt4Policy(), s) for s in (None, 5)]
    assert [e.prefilled_tokens for e in _ends(engine, requests)] == [120, 120]


def test_copy_sequence_refuses_a_held_target_and_a_full_pool_before_taking_a_row(tiny) -> None:
    engine = engine_for(tiny)
    store = engine.store
    store.add_sequence("a")
    store.add_sequence("b")
    step = store.begin_step([("a", 40), ("b", 1)])
    store.end_step(step)
    with pytest.raises(KVStoreError, match="must be empty"):
        store.copy_sequence("a", "b")
    store.remove_sequence("b")
    store.add_sequence("b", centered=True)
    with pytest.raises(KVStoreError, match="centered like"):
        store.copy_sequence("a", "b")
    store.remove_sequence("b")
    store.add_sequence("b")
    free = store.pools.free_rows()
    store.pools.high_alloc[0].take(int(free[0, 0]) - 10)  # fewer than "a" holds are left
    with pytest.raises(KVStoreError, match="no room"):
        store.copy_sequence("a", "b")
    assert store.length("b") == 0 and (store.pools.free_rows()[0, 0] == 10)
