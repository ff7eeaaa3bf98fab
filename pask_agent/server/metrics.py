"""Prometheus metrics of one server: KV bytes, measured B, queue, throughput, tagger fallbacks.

Gauges that describe the runtime now (live and allocated KV bytes, queue depth, live
requests, tokens/s) are read from it when ``/metrics`` is scraped; counters and histograms are
fed by the chat handler as requests stream and finish. Each server owns its registry (no
process-wide default registry), so two apps in one process never share numbers.
"""

from __future__ import annotations

import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from pask_agent.runtime.runtime import Runtime
from pask_agent.runtime.turns.results import Usage

CONTENT_TYPE = CONTENT_TYPE_LATEST
_B_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.33, 0.4, 0.5, 0.6, 0.75, 0.9, 1.0)


class TokenRate:
    """Generated tokens per second over the last ``window_s`` seconds (all requests)."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque()

    def add(self, n: int, now: float | None = None) -> None:
        self._events.append((time.monotonic() if now is None else now, n))

    def per_second(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        while self._events and self._events[0][0] < now - self.window_s:
            self._events.popleft()
        return sum(n for _, n in self._events) / self.window_s


class ServerMetrics:
    """The registry ``/metrics`` renders, bound to one runtime."""

    def __init__(self, runtime: Runtime) -> None:
        self.registry = r = CollectorRegistry()
        self.rate = TokenRate()
        Gauge(
            "pask_kv_live_bytes", "KV payload bytes held by all sequences now", registry=r
        ).set_function(lambda: runtime.kv_bytes()[0])
        Gauge(
            "pask_kv_allocated_bytes", "Bytes of the KV pools (capacity incl. free slots)",
            registry=r,
        ).set_function(lambda: runtime.kv_bytes()[1])  # fmt: skip
        Gauge("pask_queue_depth", "Requests waiting for admission", registry=r).set_function(
            lambda: runtime.queue_depth
        )
        Gauge("pask_live_requests", "Requests decoding now", registry=r).set_function(
            lambda: runtime.live_requests
        )
        Gauge(
            "pask_tokens_per_second", "Generated tokens per second over the last 10 s",
            registry=r,
        ).set_function(self.rate.per_second)  # fmt: skip
        self.generated = Counter(
            "pask_generated_tokens", "Tokens generated (streamed or not)", registry=r
        )
        self.prompt = Counter(
            "pask_prompt_tokens", "Prompt tokens of finished requests", registry=r
        )
        self.measured_b = Histogram(
            "pask_measured_b",
            "Measured KV budget B of finished requests (live payload / Full-KV bytes)",
            buckets=_B_BUCKETS,
            registry=r,
        )
        self.kv_bytes = Histogram(
            "pask_request_kv_bytes",
            "KV payload bytes a request held when it finished",
            buckets=tuple(float(1 << k) for k in range(16, 32, 2)),
            registry=r,
        )
        self.fallbacks = Counter(
            "pask_tagger_fallbacks",
            "Generated tokens the structural tagger could not place (default bucket used)",
            registry=r,
        )
        self.ceiling_tokens = Counter(
            "pask_ceiling_fallback_tokens",
            "Answer tokens the answer ceiling stored INT4 where the table kept them BF16",
            registry=r,
        )
        self.shed_rows = Counter(
            "pask_shed_fallback_rows",
            "Pool rows (token x layer group) requests shed past their reservation",
            registry=r,
        )
        self.requests = Counter(
            "pask_requests", "Chat completions by HTTP status (499: client went away)",
            ["status"], registry=r,
        )  # fmt: skip

    def tokens(self, n: int) -> None:
        self.generated.inc(n)
        self.rate.add(n)

    def finished(self, usage: Usage) -> None:
        self.prompt.inc(usage.prompt_tokens)
        self.measured_b.observe(usage.measured_b)
        self.kv_bytes.observe(usage.kv_bytes)
        self.fallbacks.inc(usage.tagger_fallbacks)
        self.ceiling_tokens.inc(usage.ceiling_fallback_tokens)
        self.shed_rows.inc(usage.shed_fallback_rows)

    def status(self, code: int) -> None:
        self.requests.labels(status=str(code)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
