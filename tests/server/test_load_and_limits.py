"""Concurrent streams with clients that go away, the queue limit (429) and the API key (SmolLM2)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from server_harness import SMOL, ThreadServer, smol_server

from pask_agent.runtime.config import RuntimeConfig

STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
KEY = "test-key-123"


def test_concurrent_streams_with_disconnects_free_all_kv(smol: ThreadServer) -> None:
    """32 streams at once, 8 dropped after two chunks, plus one non-streamed request whose client
    gives up: the others finish whole, the dropped ones stop decoding, and live KV returns to 0."""
    n_streams, n_tokens, dropped = 32, 24, {1, 4, 6, 11, 15, 20, 26, 31}
    tokens_before = smol.metric("pask_generated_tokens_total")
    gone_before = _requests(smol, "499")

    async def one(i: int, client: openai.AsyncOpenAI) -> tuple[str, str | None, int]:
        stream = await client.chat.completions.create(
            model=SMOL,
            messages=[{"role": "user", "content": f"Story {i}: a lighthouse keeper's day."}],
            max_tokens=n_tokens,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, reason, seen = "", None, 0
        async for chunk in stream:
            if not chunk.choices:
                return text, reason, chunk.usage.completion_tokens
            text += chunk.choices[0].delta.content or ""
            reason = chunk.choices[0].finish_reason or reason
            seen += 1
            if i in dropped and seen == 3:
                await stream.close()  # the client goes away mid-stream
                return text, "dropped", 0
        raise AssertionError("the stream ended without its usage chunk")

    async def impatient() -> None:
        async with httpx.AsyncClient(timeout=2.0) as http:
            body = {"model": SMOL, "messages": STORY, "max_tokens": 200}
            with pytest.raises(httpx.ReadTimeout):
                await http.post(f"{smol.base_url}/v1/chat/completions", json=body)

    async def main() -> list[tuple[str, str | None, int]]:
        client = openai.AsyncOpenAI(
            base_url=f"{smol.base_url}/v1", api_key="unused", max_retries=0, timeout=120
        )
        async with client:
            results = await asyncio.gather(*(one(i, client) for i in range(n_streams)), impatient())
        return results[:n_streams]

    results = asyncio.run(main())
    for i, (text, reason, _) in enumerate(results):
        assert reason in (("dropped",) if i in dropped else ("length", "stop")), (i, reason)
        assert text
    # The impatient request would decode for many seconds more had it not been cancelled.
    assert smol.wait_for_metric("pask_live_requests", 0.0, timeout_s=3) == 0
    assert smol.wait_for_metric("pask_kv_live_bytes", 0.0) == 0.0
    assert smol.metric("pask_queue_depth") == 0
    assert _requests(smol, "499") - gone_before == len(dropped) + 1
    # The dropped ones stopped too: beside the finished streams' tokens, at most a few steps
    # each (not 8 x 24 + 200 more).
    generated = smol.metric("pask_generated_tokens_total") - tokens_before
    finished = sum(tokens for _, _, tokens in results)
    assert finished <= generated <= finished + len(dropped) * 15 + 60, (finished, generated)


def _requests(server: ThreadServer, status: str) -> float:
    try:
        return server.metric(f'pask_requests_total{{status="{status}"}}')
    except KeyError:
        return 0.0


@pytest.fixture(scope="module")
def strict(smollm2: Any) -> Iterator[ThreadServer]:
    """One request at a time, one waiting, and an API key."""
    with smol_server(
        smollm2, api_key=KEY, max_queue=1, runtime=RuntimeConfig(max_batch=1)
    ) as server:
        yield server


def test_api_key_guards_v1(strict: ThreadServer) -> None:
    url = f"{strict.base_url}/v1/models"
    assert httpx.get(url).status_code == 401
    wrong = httpx.get(url, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(url, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert httpx.get(f"{strict.base_url}/health").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{strict.base_url}/v1", api_key="nope", max_retries=0).models.list()


def test_full_queue_answers_429(strict: ThreadServer) -> None:
    client = openai.OpenAI(base_url=f"{strict.base_url}/v1", api_key=KEY, max_retries=0)
    running = client.chat.completions.create(
        model=SMOL, messages=STORY, max_tokens=200, stream=True
    )
    next(iter(running))  # admitted: the one batch slot is taken
    waiting: dict[str, Any] = {}

    def queued() -> None:
        r = client.chat.completions.create(model=SMOL, messages=STORY, max_tokens=2)
        waiting["reason"] = r.choices[0].finish_reason

    thread = threading.Thread(target=queued)
    thread.start()
    deadline = time.monotonic() + 20
    while strict.metric("pask_queue_depth") < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model=SMOL, messages=STORY, max_tokens=2)
    assert info.value.code == "queue_full"
    running.close()  # frees the slot: the queued request runs
    thread.join(timeout=60)
    assert waiting["reason"] == "length"
    assert strict.wait_for_metric("pask_kv_live_bytes", 0.0) == 0.0


def test_policy_made_for_other_weights_stops_startup(
    smollm2: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shipped PASK table names the default model: a SmolLM2 server under it never opens."""
    with pytest.raises(RuntimeError, match="did not start"):
        with smol_server(smollm2, policy="pask", budget=0.33):
            pass
    logged = capsys.readouterr().err  # uvicorn's log of the failed startup
    assert "PolicyTableError" in logged and "calibrated for model" in logged
