"""Run the async ``Runtime`` for synchronous callers (and for other event loops).

Why: LangChain calls ``invoke`` from plain threads and ``ainvoke`` from the caller's asyncio
loop, while a ``Runtime`` lives inside one event loop (its worker task, its queues). So each
model gets a ``RuntimeHost``: a daemon thread running its own event loop with an anyio
``BlockingPortal``, where the ``Runtime`` is opened once, lazily, and served until the process
exits. Sync callers block on ``portal.call``; async callers await a ``concurrent.futures``
future from their own loop; streams are pumped across with a thread-safe queue.

The process-wide ``RuntimeRegistry`` (``runtime_registry()``) keeps one host per model name so
that every ``PaskChatModel`` (and ``SQLiteAssistant`` built without a runtime) shares one
model in memory. It is the only shared state here: a small object guarded by a lock.

A host also keeps the lease of every runtime conversation an integration opened (an agent
loop's derived key, a LangGraph thread): a conversation holds its KV between turns, so one
that nobody continues must be let go. A sweep on the host loop (every ``SWEEP_EVERY_S``) ends a
conversation once it has been idle longer than its lease allows, or once the checkpointer its
thread lives in no longer has that thread (``delete_thread``).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
from anyio.from_thread import BlockingPortal

from pask_agent.errors import ConfigError, PaskError
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.models.quantized_linear import check_weight_format
from pask_agent.runtime.models.weight_formats import DEFAULT_WEIGHTS
from pask_agent.runtime.runtime import Runtime

T = TypeVar("T")
_END = object()
SWEEP_EVERY_S = 1.0  # how often the host loop looks for idle or deleted conversations
_STOP_WAIT_S = 30.0  # the longest a caller waits to learn why the host loop ended
_THREAD_CHECK_S = 5.0  # the longest a checkpointer may take to say whether a thread exists


@dataclass(slots=True)
class ConversationLease:
    """How long an integration's runtime conversation may sit idle, and whose thread it is.

    ``saver`` is the LangGraph checkpointer the thread lives in (any object with the sync
    ``get_tuple(config)`` of ``BaseCheckpointSaver``); ``None`` for conversations that belong to
    no thread. Only the host loop reads or writes a lease.
    """

    conversation_id: str
    idle_s: float
    last_used: float
    thread_id: str | None = None
    saver: Any = None


class RuntimeHost:
    """One model's ``Runtime``, opened on first use and served from a daemon loop thread."""

    def __init__(self, model: str, weights: str = DEFAULT_WEIGHTS) -> None:
        self.model = model
        self.weights = weights
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stopped = threading.Event()  # the loop ended and ``_error`` says why
        self._portal: BlockingPortal | None = None
        self._runtime: Runtime | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._busy_conversations: set[str] = set()
        self._leases: dict[str, ConversationLease] = {}
        self.thread_check_failures = 0  # checkpointers that failed to say if a thread exists

    # ------------------------------------------------------------------ life cycle
    def _ensure_started(self) -> tuple[BlockingPortal, Runtime]:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=anyio.run, args=(self._serve,), name=f"pask-{self.model}", daemon=True
                )
                self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise _unwrapped(self._error)
        if self._portal is None or self._runtime is None:
            raise PaskError(f"the runtime host for {self.model!r} was closed; make a new one")
        return self._portal, self._runtime

    async def _serve(self) -> None:
        try:
            async with (
                BlockingPortal() as portal,
                Runtime.open(self.model, config=RuntimeConfig(weights=self.weights)) as rt,
            ):
                self._portal, self._runtime = portal, rt
                self._ready.set()
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._sweep_forever, rt)
                    await portal.sleep_until_stopped()
                    tasks.cancel_scope.cancel()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            self._error = exc
        finally:
            self._portal = self._runtime = None
            self._ready.set()
            self._stopped.set()

    def close(self) -> None:
        """Stop serving (finishing the engine step in flight) and join the loop thread."""
        portal, thread = self._portal, self._thread
        if portal is not None:
            try:
                portal.call(portal.stop, True)
            except RuntimeError:
                pass  # already stopping
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)

    # ------------------------------------------------------------------ calls
    def runtime(self) -> Runtime:
        """The served runtime (opened now if needed). Use it only through ``call``/``acall``."""
        return self._ensure_started()[1]

    def call(self, fn: Callable[[Runtime], Awaitable[T]]) -> T:
        """Run ``await fn(runtime)`` on the host loop and wait for it (sync callers)."""
        portal, rt = self._ensure_started()
        try:
            return portal.call(fn, rt)
        except CancelledError:
            raise self._stop_reason() from None

    async def acall(self, fn: Callable[[Runtime], Awaitable[T]]) -> T:
        """Await ``fn(runtime)`` on the host loop from the caller's asyncio loop.

        Cancelling the caller cancels the task on the host loop (and so the request).
        """
        portal, rt = await asyncio.to_thread(self._ensure_started)
        future: Future[T] = portal.start_task_soon(fn, rt)
        return await self._outcome(future)

    def iterate(self, fn: Callable[[Runtime], AsyncIterator[T]]) -> Iterator[T]:
        """Iterate ``fn(runtime)`` (an async iterator on the host loop) from sync code.

        Closing the returned generator early cancels the producer (and so the request).
        """
        portal, rt = self._ensure_started()
        items: queue.Queue[Any] = queue.Queue()
        future = portal.start_task_soon(_pump, fn, rt, items.put)
        try:
            while True:
                item = items.get()
                if item is _END:
                    break
                yield item
            try:
                future.result()  # re-raise a producer error
            except CancelledError:  # not by us: the host loop ended under the producer
                raise self._stop_reason() from None
        finally:
            future.cancel()

    async def aiterate(self, fn: Callable[[Runtime], AsyncIterator[T]]) -> AsyncIterator[T]:
        """Iterate ``fn(runtime)`` from the caller's asyncio loop."""
        portal, rt = await asyncio.to_thread(self._ensure_started)
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[Any] = asyncio.Queue()

        def put(item: Any) -> None:
            loop.call_soon_threadsafe(items.put_nowait, item)

        future = portal.start_task_soon(_pump, fn, rt, put)
        try:
            while True:
                item = await items.get()
                if item is _END:
                    break
                yield item
            await self._outcome(future)  # re-raise a producer error
        finally:
            future.cancel()

    async def _outcome(self, future: Future[T]) -> T:
        """Await a host-loop task from the caller's loop. Cancelling the caller cancels the
        task; the task cancelled without the caller asking raises :meth:`_stop_reason`."""
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # our caller was cancelled (and the task on the host loop with it)
            raise await asyncio.to_thread(self._stop_reason) from None

    def _stop_reason(self) -> BaseException:
        """Why a call's task was cancelled on the host loop without its caller asking: the
        loop ended. What ended it is raised to the caller, never a bare ``CancelledError``,
        which says nothing and reads as if the caller itself had been cancelled: the
        runtime's failure as raised (a ``KVStoreError`` from the engine, say), or a
        ``PaskError`` when the host was closed. Blocks until the loop has recorded it."""
        self._stopped.wait(_STOP_WAIT_S)
        if self._error is not None:
            return _unwrapped(self._error)
        return PaskError(f"the runtime host for {self.model!r} was closed while this call ran")

    # ------------------------------------------------------------------ conversations
    def claim_conversation(self, conversation_id: str) -> bool:
        """Mark a conversation as running a turn; False when another turn holds it.

        Called only on the host loop (inside ``fn``), so the set needs no lock.
        """
        if conversation_id in self._busy_conversations:
            return False
        self._busy_conversations.add(conversation_id)
        return True

    def release_conversation(self, conversation_id: str) -> None:
        self._busy_conversations.discard(conversation_id)
        lease = self._leases.get(conversation_id)
        if lease is not None:
            lease.last_used = time.monotonic()

    def lease_conversation(
        self,
        conversation_id: str,
        *,
        idle_s: float,
        thread_id: str | None = None,
        saver: Any = None,
    ) -> None:
        """Record (or renew) a conversation's lease before its turn; host loop only."""
        lease = self._leases.get(conversation_id)
        if lease is None:
            lease = self._leases[conversation_id] = ConversationLease(
                conversation_id, idle_s, time.monotonic(), thread_id, saver
            )
        lease.idle_s, lease.last_used = idle_s, time.monotonic()
        if saver is not None:
            lease.thread_id, lease.saver = thread_id, saver

    def leased_conversations(self) -> dict[str, str | None]:
        """Conversation id → thread id (``None`` for a derived key) of every live lease."""
        return {cid: lease.thread_id for cid, lease in self._leases.items()}

    def end_thread(self, thread_id: str) -> list[str]:
        """End every conversation of ``thread_id`` now (from any thread); the ids ended.

        A turn of that thread still running keeps its conversation until it ends; its lease is
        marked expired, so the first sweep after the turn lets it go.
        """
        if self._portal is None or self._runtime is None:
            return []  # never started: nothing holds KV
        return self.call(lambda rt: self._end_matching(rt, thread_id))

    async def _end_matching(self, rt: Runtime, thread_id: str) -> list[str]:
        ids = [cid for cid, lease in self._leases.items() if lease.thread_id == thread_id]
        for cid in ids:
            self._leases[cid].idle_s = -1.0  # a running turn's conversation goes at its end
        return [cid for cid in ids if self._end(rt, cid)]

    async def sweep(self, rt: Runtime) -> list[str]:
        """End the conversations that are idle past their lease or whose thread was deleted;
        returns their ids. Host loop only; conversations with a turn running are kept."""
        now = time.monotonic()
        ended = []
        for cid, lease in list(self._leases.items()):
            if cid in self._busy_conversations:
                continue
            if now - lease.last_used > lease.idle_s or not await self._thread_exists(lease):
                if self._end(rt, cid):
                    ended.append(cid)
        return ended

    def _end(self, rt: Runtime, conversation_id: str) -> bool:
        if conversation_id in self._busy_conversations:
            return False
        try:
            rt.end_conversation(conversation_id)
        except ConfigError:
            return False  # a cancelled turn still holds it until the engine's next step
        self._leases.pop(conversation_id, None)  # a sweep may end it while end_thread waits
        return True

    async def _thread_exists(self, lease: ConversationLease) -> bool:
        if lease.saver is None or lease.thread_id is None:
            return True
        config = {"configurable": {"thread_id": lease.thread_id, "checkpoint_ns": ""}}
        # The sync API from a worker thread is the one every saver serves across threads
        # (async savers hand it to their own loop); the host loop must not block on it.
        with anyio.move_on_after(_THREAD_CHECK_S):
            try:
                found = await anyio.to_thread.run_sync(
                    lease.saver.get_tuple, config, abandon_on_cancel=True
                )
            except Exception:  # noqa: BLE001 - a closed or failing saver cannot end the host
                # Stop asking this saver; the idle lease still releases the conversation.
                lease.saver = None
                self.thread_check_failures += 1
                return True
            return found is not None
        return True  # no answer in time: keep the conversation; the idle lease still applies

    async def _sweep_forever(self, rt: Runtime) -> None:
        while True:
            await anyio.sleep(SWEEP_EVERY_S)
            await self.sweep(rt)


def _unwrapped(error: BaseException) -> BaseException:
    """The one error inside task-group wrappers (a runtime's worker failure reaches the host
    as an ``ExceptionGroup`` of one), so callers can catch it by its own type."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


async def _pump(
    fn: Callable[[Runtime], AsyncIterator[Any]], rt: Runtime, put: Callable[[Any], None]
) -> None:
    try:
        async for item in fn(rt):
            put(item)
    finally:
        put(_END)


class RuntimeRegistry:
    """Model name → ``RuntimeHost``; hosts are created on first request and live until exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hosts: dict[tuple[str, str], RuntimeHost] = {}
        self._exit_hook = False
        self._conversation_models: dict[str, str] = {}

    def bind_conversation(self, conversation_id: str, model: str) -> None:
        """Tie a caller-chosen conversation id to the model of its first turn.

        Its KV lives in that model's runtime; the same id on another model would silently
        start an unrelated conversation there, so it is refused instead.

        Raises
        ------
        ConfigError
            The id was already used with another model.
        """
        with self._lock:
            first = self._conversation_models.setdefault(conversation_id, model)
        if first != model:
            raise ConfigError(
                f"conversation_id {conversation_id!r} is already used with model {first!r}; a "
                f"conversation's KV cannot move to model {model!r}: pass another conversation_id"
            )

    def host(self, model: str, weights: str = DEFAULT_WEIGHTS) -> RuntimeHost:
        """The host serving ``model`` with ``weights`` (one per pair, opened on first use)."""
        if not isinstance(model, str) or not model:
            raise ConfigError(f"model must be a non-empty model name, got {model!r}")
        check_weight_format(weights)
        with self._lock:
            if not self._exit_hook:
                # The engine's worker threads (anyio's) are non-daemon and end only when the
                # host loop ends, so the loops must stop before Python joins non-daemon threads
                # at exit; ``atexit`` runs too late for that. ``threading._register_atexit`` is
                # the hook concurrent.futures uses for the same reason.
                threading._register_atexit(self.close_all)  # type: ignore[attr-defined]
                self._exit_hook = True
            if (model, weights) not in self._hosts:
                self._hosts[model, weights] = RuntimeHost(model, weights)
            return self._hosts[model, weights]

    def close_all(self) -> None:
        """Stop every host. Runs at interpreter exit, before non-daemon threads are joined."""
        with self._lock:
            hosts = list(self._hosts.values())
            self._hosts.clear()
        for host in hosts:
            host.close()


_REGISTRY = RuntimeRegistry()


def runtime_registry() -> RuntimeRegistry:
    """The process-wide registry shared by every integration object."""
    return _REGISTRY
