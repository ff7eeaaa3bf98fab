"""Runtime behaviour on SmolLM2 (fast): batching exactness, cancellation, conversations."""

from __future__ import annotations

import anyio
import pytest
from engine_greedy import greedy

from pask_agent.errors import ConfigError
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.runtime import Runtime
from pask_agent.runtime.turns.results import Delta

PROMPTS = [
    "Name three colors.",
    "Write a haiku about the sea and the wind that blows over it at night.",
    "What is 2+2?",
    "List the planets of the solar system in order from the sun.",
    "Say hello.",
    "Explain recursion to a child in two sentences.",
    "Give me a fun fact about cats.",
    "Translate 'good morning' to French, Spanish and German.",
]


def _msgs(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


NEAR_TIE = 0.02
"""Logit gap below which two greedy choices count as tied to fp32 rounding. A batched row goes
through matmuls of other shapes than a lone row, so its rounding differs (MKL's and oneDNN's
alike); greedy tokens may then part where two candidates are that close. A wider gap where
they part means one sequence's rows leaked into another's."""


def _same_or_near_tie(engine, prompt_ids: list[int], solo: tuple, other: tuple) -> None:
    """``other`` equals ``solo``, or they part where the solo run's own logits (replayed
    alone through the same engine) put the two choices within ``NEAR_TIE``."""
    if other == solo:
        return
    pairs = enumerate(zip(solo, other, strict=False))
    i = next((k for k, (a, b) in pairs if a != b), min(len(solo), len(other)))
    (end,) = greedy(engine, [prompt_ids + list(solo[:i])], max_new_tokens=1, keep_logits=True)
    logits = end.step_logits[0].float()
    stop = max(float(logits[t]) for t in engine.stop_ids)  # a shorter run chose to stop
    choice = [float(logits[seq[i]]) if i < len(seq) else stop for seq in (solo, other)]
    assert abs(choice[0] - choice[1]) < NEAR_TIE, (i, choice, solo, other)


def test_batching_is_exact_and_cancellation_frees_kv(smollm2) -> None:
    async def main() -> None:
        async with Runtime.open(smollm2) as rt:
            solo = [(await rt.chat(_msgs(p), max_new_tokens=20)).token_ids for p in PROMPTS]
            batched: list = [None] * 8

            async def one(i: int) -> None:
                batched[i] = (await rt.chat(_msgs(PROMPTS[i]), max_new_tokens=20)).token_ids

            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(one, i)
            ids = [rt.prepare(_msgs(p), None, "auto", True, labels=False)[0] for p in PROMPTS]
            for i in range(8):  # 8 prompts of different lengths, one forward per step
                _same_or_near_tie(rt.engine, ids[i], solo[i], batched[i])
            assert rt.engine.store.live_bytes() == 0

            # 16 concurrent calls; cancel 8 of them mid-generation
            done: dict[int, tuple] = {}
            progress = {i: 0 for i in range(16)}

            async def streamed(i: int) -> None:
                tokens: list[int] = []
                async for d in rt.stream(_msgs(PROMPTS[i % 8]), max_new_tokens=20):
                    assert isinstance(d, Delta)
                    tokens.extend(d.token_ids)
                    progress[i] += 1
                done[i] = tuple(tokens)

            async with anyio.create_task_group() as tg:
                scopes = []
                for i in range(16):
                    scope = anyio.CancelScope()
                    scopes.append(scope)

                    async def runner(i: int = i, scope: anyio.CancelScope = scope) -> None:
                        with scope:
                            await streamed(i)

                    tg.start_soon(runner)
                with anyio.fail_after(300):
                    while min(progress[i] for i in range(1, 16, 2)) < 3:
                        await anyio.sleep(0.05)
                for i in range(1, 16, 2):
                    scopes[i].cancel()
            kept = sorted(done)
            assert all(i % 2 == 0 for i in kept) and len(kept) == 8
            for i in kept:
                _same_or_near_tie(rt.engine, ids[i % 8], solo[i % 8], done[i])
            assert rt.engine.store.live_bytes() == 0
            assert not rt.engine.live and not rt.engine.inbox

    anyio.run(main)


def test_conversation_second_turn_prefills_only_new_tokens(smollm2) -> None:
    async def main() -> None:
        async with Runtime.open(smollm2) as rt:
            conv = rt.conversation("c1")
            messages = _msgs("Name a fruit.")
            first = await rt.chat(messages, max_new_tokens=12, conversation=conv)
            assert first.usage.prefilled_tokens == first.usage.prompt_tokens
            # the pools' own size is reported next to what the turn holds
            allocated = rt.engine.store.allocated_bytes()
            assert first.usage.allocated_kv_bytes == allocated >= first.usage.kv_bytes > 0
            in_store = conv.tokens_in_store
            messages = [
                *messages,
                first.message | {"content": first.text},
                {"role": "user", "content": "And a vegetable?"},
            ]
            second = await rt.chat(messages, max_new_tokens=12, conversation=conv)
            reused = second.usage.prompt_tokens - second.usage.prefilled_tokens
            # everything the first turn left in the store is reused, up to where the rendered
            # history diverges from the generated tokens (at most the turn's closing tokens)
            assert in_store - 2 <= reused <= in_store
            assert second.usage.prefilled_tokens < second.usage.prompt_tokens // 2
            assert rt.engine.store.live_bytes() > 0  # the conversation keeps its KV

    anyio.run(main)


def test_admission_waits_instead_of_failing(smollm2) -> None:
    # room for about one request's worst case at a time: the rest must queue, not fail
    per_token = 30 * 2 * 3 * 64 * 2
    config = RuntimeConfig(kv_capacity_bytes=per_token * 120)

    async def main() -> None:
        async with Runtime.open(smollm2, config=config) as rt:
            results: list = []

            async def one(p: str) -> None:
                results.append(await rt.chat(_msgs(p), max_new_tokens=8))

            async with anyio.create_task_group() as tg:
                for p in PROMPTS[:4]:
                    tg.start_soon(one, p)
            assert len(results) == 4
            with pytest.raises(ConfigError, match="kv_capacity_bytes"):
                await rt.chat(_msgs("word " * 200), max_new_tokens=8)

    anyio.run(main)


def test_long_prompt_prefills_in_chunks_without_stalling_decode(smollm2) -> None:
    from pask_agent.policy.full import FullPolicy
    from pask_agent.runtime.engine import Engine
    from pask_agent.runtime.requests import Request, SamplingParams
    from pask_agent.runtime.turns.outputs import TEXT

    engine = Engine(smollm2, RuntimeConfig(prefill_chunk_tokens=64, window=8))
    tok = smollm2.tokenizer

    def request(text: str, n: int) -> Request:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        params = SamplingParams(max_new_tokens=n, ignore_eos=True)
        return Request(ids, None, TEXT, params, engine.new_sequence(FullPolicy().start(None)))

    short = request("Count: one, two,", 12)
    engine.inbox.append(short)
    engine.step()  # short prompt prefilled, first token out
    long = request("word " * 300, 2)
    engine.inbox.append(long)
    lengths = []
    while long.prefill_pos < len(long.prompt_ids):
        before = len(short.generated)
        engine.step()
        assert len(short.generated) == before + 1  # decode advanced every step
        lengths.append(engine.store.length(long.state.seq_id))
        # nothing of the long prompt settles (leaves the window) before it is fully prefilled
        high, low = tuple(a.tolist() for a in engine.store.retained_arrays(long.state.seq_id, 0))
        assert len(high) == lengths[-1] and not low
    assert len(lengths) >= 4 and all(
        b - a <= 64 for a, b in zip([0, *lengths], lengths, strict=False)
    )


def test_cancelled_turn_frees_conversation_and_end_releases_kv(smollm2) -> None:
    async def main() -> None:
        async with Runtime.open(smollm2) as rt:
            conv = rt.conversation("c2")
            with anyio.move_on_after(0.5):
                await rt.chat(
                    _msgs("Tell me a long story."),
                    max_new_tokens=200,
                    conversation=conv,
                    ignore_eos=True,
                )
            assert not conv.busy  # the next turn may start at once
            again = await rt.chat(_msgs("Say hi."), max_new_tokens=4, conversation=conv)
            assert again.usage.completion_tokens >= 1
            assert rt.engine.store.live_bytes() > 0
            rt.end_conversation("c2")
            await rt.chat(_msgs("ok"), max_new_tokens=1)  # one more step frees it
            assert rt.engine.store.live_bytes() == 0

    anyio.run(main)
