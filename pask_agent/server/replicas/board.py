"""What each replica last reported, and one Prometheus page over all of them.

Every replica pushes a ``ReplicaReport`` after each request it serves and every couple of
seconds; the ingress reads the board to answer ``/metrics`` (each replica's series with a
``replica`` label, a federation page) and ``/v1/replicas`` (the reports: requests per routing
key, live KV bytes). A report older than ``stale_after_s`` marks its replica down, which is
how a killed replica shows on the page.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """One replica's state, as it reported it at ``time``."""

    replica: str  # Ray Serve's unique replica id
    actor_name: str  # the replica's Ray actor (namespace "serve"), to find or kill it
    pid: int
    time: float
    started: float
    requests: int
    keys: Mapping[str, int] = field(default_factory=dict)  # requests per routing key
    kv_live_bytes: int = 0
    kv_allocated_bytes: int = 0
    live_requests: int = 0
    queue_depth: int = 0
    conversations: int = 0  # runtime conversations it holds now
    metrics: str = ""  # its own /metrics page

    def as_json(self, now: float, stale_after_s: float) -> dict[str, Any]:
        out = asdict(self)
        out["keys"] = dict(self.keys)
        out["up"] = now - self.time <= stale_after_s
        del out["metrics"]
        return out


class ReplicaBoard:
    """The latest report of every replica that ever reported (a Ray Serve deployment of one)."""

    def __init__(self, stale_after_s: float = 10.0) -> None:
        self.stale_after_s = stale_after_s
        self._reports: dict[str, ReplicaReport] = {}

    def push(self, report: ReplicaReport) -> None:
        held = self._reports.get(report.replica)
        if held is None or held.time <= report.time:
            self._reports[report.replica] = report

    def reports(self) -> list[dict[str, Any]]:
        now = time.time()
        return [r.as_json(now, self.stale_after_s) for r in self._reports.values()]

    def metrics_page(self) -> str:
        now = time.time()
        up = {r.replica: now - r.time <= self.stale_after_s for r in self._reports.values()}
        pages = {r.replica: r.metrics for r in self._reports.values() if up[r.replica]}
        lines = [
            "# HELP pask_replica_up 1 while a replica reports, 0 once it stopped",
            "# TYPE pask_replica_up gauge",
            *(f'pask_replica_up{{replica="{k}"}} {int(v)}' for k, v in sorted(up.items())),
        ]
        return "\n".join(lines) + "\n" + federate(pages)


def federate(pages: Mapping[str, str]) -> str:
    """Prometheus pages of several replicas as one page: every sample gains ``replica``."""
    families: dict[str, tuple[str, str, list[str]]] = {}
    for replica, text in sorted(pages.items()):
        for family in text_string_to_metric_families(text):
            _, _, samples = families.setdefault(
                family.name, (family.type, family.documentation, [])
            )
            for s in family.samples:
                labels = {**s.labels, "replica": replica}
                rendered = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                samples.append(f"{s.name}{{{rendered}}} {floatToGoString(s.value)}")
    out: list[str] = []
    for name, (kind, doc, samples) in families.items():
        named = f"{name}_total" if kind == "counter" else name  # as prometheus_client writes it
        out += [f"# HELP {named} {_escape(doc, help_text=True)}", f"# TYPE {named} {kind}"]
        out += samples
    return "\n".join(out) + ("\n" if out else "")


def _escape(value: str, *, help_text: bool = False) -> str:
    value = value.replace("\\", "\\\\").replace("\n", "\\n")
    return value if help_text else value.replace('"', '\\"')
