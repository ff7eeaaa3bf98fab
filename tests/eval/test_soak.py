"""The reduced soak (issue 14, item 1) on SmolLM2, in process and over HTTP (``--serve``):
cancels and timeouts leave nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import anyio

from pask_agent.eval.soak import SoakConfig, plan, run_soak
from pask_agent.eval.soak_report import environment, write
from pask_agent.eval.soak_serve import run_serve_soak

# Each SQL question on a database not yet in the store prefills its ~1,400-token schema prompt
# (about 6 s of SmolLM2 on one core), the bulk of the soak; this seed's warm-up touches two
# databases, and each planned SQL cancel is the first request on its database, so the cancel
# lands during that prefill (tool calls are cancelled right after their first token).
CONFIG = SoakConfig(
    model="smollm2-135m",
    requests=9,
    concurrency=3,
    cancel_fraction=0.45,  # 4 cancels (2 tool calls, 2 SQL), 1 timeout (structured, 0.4 s)
    max_new_tokens=32,
    time_limit_s=300,
    seed=0,
)


def test_plan_is_seeded_and_honours_the_fractions() -> None:
    questions = [("shop", "How many customers are there?")]
    a, b = plan(SoakConfig(requests=200), questions), plan(SoakConfig(requests=200), questions)
    assert a == b
    assert sum(p.fate == "cancel" for p in a) == 50
    assert sum(p.fate == "timeout" for p in a) == 20
    assert {p.kind for p in a} == {"tools", "structured", "sql"}
    assert plan(SoakConfig(requests=200, seed=1), questions) != a


def test_reduced_soak_ends_clean(smollm2, tmp_path: Path) -> None:
    report = anyio.run(lambda: run_soak(CONFIG, smollm2))
    report.update(environment("pytest tests/eval/test_soak.py"))
    write(report, tmp_path / "soak")
    assert report["errors"] == [] and report["unexpected_errors"] == 0
    assert report["requests"] == 9 and not report["time_limit_hit"]
    # the cancels and deadlines really interrupted requests, and the rest completed
    assert report["cancelled"] >= 3 and report["timed_out"] >= 1
    assert report["completed"] + report["cancelled"] + report["timed_out"] == 9
    assert report["leaked_kv_bytes"] == 0 and report["sequences_left"] == 0
    assert report["slot_audit_error"] is None
    assert report["checks"]["engine_idle"]
    assert report["rss_after_bytes"] <= 1.1 * report["rss_baseline_bytes"]
    assert report["passed"]
    saved = json.loads((tmp_path / "soak.json").read_text())
    for key in (
        "requests",
        "concurrency",
        "cancelled",
        "timed_out",
        "unexpected_errors",
        "leaked_kv_bytes",
        "rss_baseline_bytes",
        "rss_after_bytes",
        "command",
        "git_commit",
        "machine",
    ):
        assert key in saved
    assert "PASSED" in (tmp_path / "soak.md").read_text()


SERVE_CONFIG = SoakConfig(
    model="smollm2-135m",
    requests=9,
    concurrency=3,
    cancel_fraction=0.34,  # 3 cancels: a structured answer dropped, two SQL streams cut
    timeout_fraction=0.12,  # 1 streamed tool call with a client timeout of 0.4 s
    max_new_tokens=32,
    time_limit_s=300,
    seed=2,
    max_batch=3,
)


def test_reduced_serve_soak_ends_clean(smollm2, tmp_path: Path) -> None:
    """The same checks over HTTP: the real server on a loopback port, the real openai client."""
    report = anyio.run(lambda: run_serve_soak(SERVE_CONFIG, smollm2))
    report.update(environment("pytest tests/eval/test_soak.py"))
    write(report, tmp_path / "soak_serve")
    assert report["path"] == "serve"
    assert report["errors"] == [] and report["unexpected_errors"] == 0
    assert report["requests"] == 9 and not report["time_limit_hit"]
    assert report["cancelled"] >= 2 and report["timed_out"] >= 1
    assert report["completed"] + report["cancelled"] + report["timed_out"] == 9
    # the server saw clients go away (499), answered no 5xx, and its conversations were real
    statuses = report["server_statuses"]
    assert statuses.get("499", 0) >= 2 and not any(c.startswith("5") for c in statuses)
    assert report["conversations_deleted"] >= 1
    assert report["leaked_kv_bytes"] == 0 and report["sequences_left"] == 0
    assert report["slot_audit_error"] is None
    assert report["checks"]["engine_idle"]
    assert report["rss_after_bytes"] <= 1.1 * report["rss_baseline_bytes"]
    assert report["passed"]
    md = (tmp_path / "soak_serve.md").read_text()
    assert "PASSED" in md and "Soak (serve)" in md
