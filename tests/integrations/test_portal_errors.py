"""What a caller of the runtime host sees when its call cannot finish (issue 34, SmolLM2).

The recipe's ``served.invoke`` died with a bare ``CancelledError`` from the portal: an engine
step raised, the error ended the runtime's worker, the host loop ended, and every call in
flight was cancelled, the error itself lost (and every later call of the process got it as a
stale host error). Now a request that fails inside an engine step raises its own error,
through ``iterate``, ``aiterate``, ``call`` and ``acall`` alike, and the runtime serves the
next request; a host closed under a call says so with a ``PaskError``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from pask_agent.errors import PaskError
from pask_agent.grammars.tags import Tag
from pask_agent.integrations._portal import RuntimeHost
from pask_agent.policy.actions import Action
from pask_agent.policy.base import Actions, Policy, PolicyEnv, RetentionView
from pask_agent.runtime.runtime import Runtime

MODEL = "smollm2-135m"
HIGH: Actions = (Action.H, Action.H, Action.H)
ASK = [{"role": "user", "content": "Say hi."}]


class BrokenRevise:
    """A user's policy session with a bug in its ``revise`` hook, which the engine calls in
    the middle of a batched step (after the forward, before sampling)."""

    def plan_prefill(self, labels: Sequence[str]) -> Sequence[Actions]:
        return [HIGH] * len(labels)

    def on_token(self, tag: Tag | None, *, is_stop: bool = False) -> Actions:
        return HIGH

    def revise(self, view: RetentionView) -> list[Any]:
        raise ValueError(f"revise got {view.length} tokens and broke")


@dataclass(frozen=True)
class BrokenRevisePolicy(Policy):
    name = "broken-revise"
    revises = True

    def start(self, env: PolicyEnv) -> BrokenRevise:
        return BrokenRevise()


def _broken_turn(rt: Runtime) -> Any:
    return rt.stream(ASK, policy=BrokenRevisePolicy(), max_new_tokens=4)


@pytest.fixture(scope="module")
def host():
    """A host of its own (not the registry's shared one), closed at the end."""
    host = RuntimeHost(MODEL)
    yield host
    host.close()


def test_a_request_that_fails_in_a_step_raises_its_own_error_and_the_runtime_serves_on(
    host: RuntimeHost,
) -> None:
    with pytest.raises(ValueError, match=r"revise got \d+ tokens and broke"):
        list(host.iterate(_broken_turn))
    with pytest.raises(ValueError, match="broke"):
        host.call(lambda rt: rt.chat(ASK, policy=BrokenRevisePolicy(), max_new_tokens=4))

    async def from_another_loop() -> None:
        with pytest.raises(ValueError, match="broke"):
            async for _ in host.aiterate(_broken_turn):
                pass
        with pytest.raises(ValueError, match="broke"):
            await host.acall(lambda rt: rt.chat(ASK, policy=BrokenRevisePolicy()))

    asyncio.run(from_another_loop())
    # the failed requests gave their rows back, and the same runtime answers the next one
    result = host.call(lambda rt: rt.chat(ASK, max_new_tokens=4))
    assert len(result.token_ids) > 0 and host.runtime().live_requests == 0
    assert host.runtime().kv_bytes()[0] == 0


def test_a_host_closed_under_a_call_says_so(host: RuntimeHost) -> None:
    started = threading.Event()

    async def outlives_the_host(rt: Runtime) -> None:
        started.set()
        await anyio.sleep(120)

    def close_when_started() -> None:
        started.wait(60)
        host.close()

    closer = threading.Thread(target=close_when_started)
    closer.start()
    with pytest.raises(PaskError, match=f"host for '{MODEL}' was closed while this call ran"):
        host.call(outlives_the_host)
    closer.join(60)
    with pytest.raises(PaskError, match="was closed"):
        host.call(outlives_the_host)  # a closed host stays closed, and says so at once
