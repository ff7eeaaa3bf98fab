"""LangGraph threads → runtime conversations, under LangChain's own ``create_agent`` (SmolLM2).

A thread's turns must continue one runtime conversation (its KV is reused, its ledger is one),
another thread must not share it even when it opens with the same words (the derived key would
merge them), and the conversation must be let go when the thread is deleted from the
checkpointer, when it sits idle past the model's timeout, or when ``end_thread`` is called.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver

from pask_agent.integrations._lc_threads import thread_key
from pask_agent.integrations._lc_turn import conversation_key
from pask_agent.integrations._portal import SWEEP_EVERY_S, RuntimeHost, runtime_registry
from pask_agent.integrations.langchain import PaskChatModel

MODEL = "smollm2-135m"


def _model(**kwargs: Any) -> PaskChatModel:
    return PaskChatModel(model=MODEL, max_tokens=12, **kwargs)


def _config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def _reply(state: dict[str, Any]) -> AIMessage:
    reply = state["messages"][-1]
    assert isinstance(reply, AIMessage)
    return reply


def _cache_read(reply: AIMessage) -> int:
    assert reply.usage_metadata is not None
    return reply.usage_metadata["input_token_details"]["cache_read"]


def _host() -> RuntimeHost:
    return runtime_registry().host(MODEL)


def _wait_until(done: Callable[[], bool], *, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.1)
    return done()


def _thread() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"  # the host is shared by every test in the process


def test_a_thread_continues_one_conversation_and_another_thread_gets_its_own() -> None:
    saver = InMemorySaver()
    model = _model()
    agent = create_agent(model, [], checkpointer=saver)
    a, b = _thread(), _thread()
    opening = {"messages": [{"role": "user", "content": "Hello! My name is Ada."}]}
    first = _reply(agent.invoke(opening, _config(a)))
    follow_up = {"messages": [{"role": "user", "content": "What is my name?"}]}
    second = _reply(agent.invoke(follow_up, _config(a)))
    # The second turn's prompt is the first turn's prompt and answer plus the new question:
    # all of the first prompt is read from the cache (but, at most, its last token).
    assert _cache_read(first) == 0
    assert _cache_read(second) >= first.usage_metadata["input_tokens"] - 1
    # Thread b opens with the same words; a key derived from the opening messages would put it
    # in a's conversation and read a's cache. Run it through the async path as well.
    other = _reply(asyncio.run(agent.ainvoke(opening, _config(b))))
    assert _cache_read(other) == 0
    leases = _host().leased_conversations()
    key_a = thread_key(MODEL, model.policy, model.budget, a)
    key_b = thread_key(MODEL, model.policy, model.budget, b)
    assert leases[key_a] == a and leases[key_b] == b
    assert {key_a, key_b} <= set(_host().runtime().conversation_ids)
    assert sum(1 for thread in leases.values() if thread in (a, b)) == 2


def test_deleting_the_thread_releases_its_conversation() -> None:
    saver = InMemorySaver()
    model = _model()
    agent = create_agent(model, [], checkpointer=saver)
    kept, deleted = _thread(), _thread()
    for thread in (kept, deleted):
        agent.invoke({"messages": [{"role": "user", "content": "Say hi."}]}, _config(thread))
    rt = _host().runtime()
    key_kept = thread_key(MODEL, model.policy, model.budget, kept)
    key_deleted = thread_key(MODEL, model.policy, model.budget, deleted)
    assert {key_kept, key_deleted} <= set(rt.conversation_ids)
    live_before, _ = rt.kv_bytes()
    saver.delete_thread(deleted)
    assert _wait_until(lambda: key_deleted not in rt.conversation_ids, timeout_s=10 * SWEEP_EVERY_S)
    assert key_kept in rt.conversation_ids  # still in the checkpointer, not idle yet
    assert key_deleted not in _host().leased_conversations()
    # The engine frees a retired sequence at its next step (ending a conversation wakes it).
    assert _wait_until(lambda: rt.kv_bytes()[0] < live_before, timeout_s=5.0)
    model.end_thread(kept)


def test_an_idle_thread_is_released_after_the_timeout_and_end_thread_releases_at_once() -> None:
    idle = _model(idle_timeout_s=0.5)
    agent = create_agent(idle, [], checkpointer=InMemorySaver())
    thread = _thread()
    agent.invoke({"messages": [{"role": "user", "content": "Say hi."}]}, _config(thread))
    key = thread_key(MODEL, idle.policy, idle.budget, thread)
    rt = _host().runtime()
    assert key in rt.conversation_ids
    assert _wait_until(lambda: key not in rt.conversation_ids, timeout_s=0.5 + 10 * SWEEP_EVERY_S)

    patient = _model()  # the default timeout (10 minutes) will not fire during the test
    agent = create_agent(patient, [], checkpointer=InMemorySaver())
    thread = _thread()
    agent.invoke({"messages": [{"role": "user", "content": "Say hi."}]}, _config(thread))
    key = thread_key(MODEL, patient.policy, patient.budget, thread)
    assert key in rt.conversation_ids
    assert patient.end_thread(thread) == [key]
    assert key not in rt.conversation_ids and patient.end_thread(thread) == []


def test_without_a_thread_the_opening_messages_still_pick_the_conversation() -> None:
    model = _model()
    question = [{"role": "user", "content": f"Count to three. ({uuid.uuid4().hex[:6]})"}]
    first = model.invoke(question)
    second = model.invoke([*question, first, {"role": "user", "content": "Again."}])
    assert _cache_read(second) >= first.usage_metadata["input_tokens"] - 1
    derived = conversation_key(MODEL, model.policy, model.budget, question)
    assert derived in _host().leased_conversations()  # leased too: the idle timeout applies
    assert _host().leased_conversations()[derived] is None


@pytest.fixture(autouse=True, scope="module")
def _quiet_threads() -> Any:
    yield
    # Leave no thread conversation of this module holding KV for later tests in the process.
    host = _host()
    for thread in set(host.leased_conversations().values()) - {None}:
        host.end_thread(thread)


def test_end_thread_during_a_turn_releases_the_conversation_when_the_turn_ends() -> None:
    model = _model()
    agent = create_agent(model, [], checkpointer=InMemorySaver())
    thread = _thread()
    agent.invoke({"messages": [{"role": "user", "content": "Say hi."}]}, _config(thread))
    key = thread_key(MODEL, model.policy, model.budget, thread)
    host, rt = _host(), _host().runtime()

    async def claim(_: Any) -> bool:  # what a turn of this thread does when it starts
        return host.claim_conversation(key)

    async def release(_: Any) -> None:  # ... and when it ends
        host.release_conversation(key)

    assert host.call(claim)
    assert model.end_thread(thread) == []  # a turn holds it: not ended under it
    time.sleep(3 * SWEEP_EVERY_S)
    assert key in rt.conversation_ids  # sweeps leave a running turn's conversation alone
    host.call(release)
    assert _wait_until(lambda: key not in rt.conversation_ids, timeout_s=10 * SWEEP_EVERY_S)
    assert key not in host.leased_conversations()
