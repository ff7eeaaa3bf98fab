"""Where calibration tasks run: in process, in local worker processes, or on Ray actors.

Each task is ``(method, args)`` for a :class:`ReplayWorker`; results come back in completion
order with the key they were submitted under, so the caller can checkpoint each as it lands.
Ray is optional (``pip install 'pask-agent[ray]'``); ``--ray local`` starts a private
instance, ``--ray auto`` or an address joins a running cluster.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from pask_agent.calibration.worker import ReplayWorker, WorkerSpec
from pask_agent.errors import ConfigError
from pask_agent.policy.costs import PayloadCosts

Task = tuple[str, tuple[Any, ...]]

_PROCESS_WORKER: ReplayWorker | None = None


def _init_process(spec: WorkerSpec) -> None:
    global _PROCESS_WORKER  # one model per worker process, loaded once
    _PROCESS_WORKER = ReplayWorker(spec)


def _run_in_process(task: Task) -> Any:
    assert _PROCESS_WORKER is not None
    method, args = task
    return getattr(_PROCESS_WORKER, method)(*args)


class TaskRunner:
    """Runs worker tasks; use as a context manager (it owns processes or Ray actors)."""

    def __init__(self, spec: WorkerSpec, *, workers: int = 1, ray: str | None = None) -> None:
        self.spec = spec
        self.workers = workers
        self.ray_address = ray
        self._local: ReplayWorker | None = None
        self._pool: ProcessPoolExecutor | None = None
        self._actors: list[Any] = []

    def __enter__(self) -> TaskRunner:
        if self.ray_address is not None:
            self._start_ray()
        elif self.workers > 1:
            import multiprocessing

            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_process,
                initargs=(self.spec,),
            )
        else:
            self._local = ReplayWorker(self.spec)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
        if self._actors:
            import ray

            for actor in self._actors:
                ray.kill(actor)
            self._actors = []

    def _start_ray(self) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ConfigError(
                "--ray needs Ray: pip install 'pask-agent[ray]' (or run without --ray)"
            ) from exc
        if not ray.is_initialized():
            address = None if self.ray_address == "local" else self.ray_address
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        actor = ray.remote(num_cpus=1)(ReplayWorker)
        self._actors = [actor.remote(self.spec) for _ in range(self.workers)]

    def dims(self) -> tuple[int, int, int]:
        """``(layers, kv heads, head dim)`` from the model's config (no weights needed)."""
        from pask_agent.runtime.models.loading import resolve_model_dir

        cfg = json.loads((resolve_model_dir(self.spec.model) / "config.json").read_text())
        heads = int(cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
        return int(cfg["num_hidden_layers"]), int(cfg["num_key_value_heads"]), head_dim

    def costs(self) -> PayloadCosts:
        """Payload costs of the model being calibrated."""
        return PayloadCosts.from_dims(*self.dims())

    def map(self, tasks: Sequence[Task], keys: Sequence[str]) -> Iterator[tuple[str, Any]]:
        if self._local is not None:
            for key, (method, args) in zip(keys, tasks, strict=True):
                yield key, getattr(self._local, method)(*args)
        elif self._pool is not None:
            futures: dict[Future[Any], str] = {
                self._pool.submit(_run_in_process, task): key
                for key, task in zip(keys, tasks, strict=True)
            }
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    yield futures[f], f.result()
        else:
            yield from self._map_ray(tasks, keys)

    def _map_ray(self, tasks: Sequence[Task], keys: Sequence[str]) -> Iterator[tuple[str, Any]]:
        import ray

        queue = list(zip(keys, tasks, strict=True))
        running: dict[Any, tuple[str, Any]] = {}
        idle = list(self._actors)
        while queue or running:
            while queue and idle:
                key, (method, args) = queue.pop(0)
                actor = idle.pop()
                running[getattr(actor, method).remote(*args)] = (key, actor)
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                key, actor = running.pop(ref)
                idle.append(actor)
                yield key, ray.get(ref)
