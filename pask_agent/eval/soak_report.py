"""The soak's report: counts, checks and where it ran → ``<out>.json`` and ``<out>.md``.

Why a file of its own: the soak (``soak.py``) decides what happened; this file only judges it
against the pass criteria of issue 14 and writes it down, so the criteria sit in one place.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pask_agent.eval.soak_workload import KINDS, SoakConfig

if TYPE_CHECKING:
    from pask_agent.eval.soak import Outcome
    from pask_agent.runtime.models.loading import LoadedModel


def build_report(
    config: SoakConfig,
    loaded: LoadedModel,
    outcomes: list[Outcome],
    warm: list[Outcome],
    *,
    wall_s: float,
    warm_s: float,
    time_limit_hit: bool,
    leaked: int,
    audit_error: str | None,
    engine_idle: bool,
    sequences_left: int,
    rss: tuple[int, int],
    pool_baseline: int,
    pool_after: int,
    path: str = "in-process",
    transport: dict[str, Any] | None = None,
    extra_errors: list[str] | None = None,
) -> dict[str, Any]:
    """Judge one run. ``path`` names what the requests went through: ``in-process`` (the
    ``Runtime`` API) or ``serve`` (HTTP to the OpenAI-compatible server, described by
    ``transport``); ``extra_errors`` are faults found outside any request (the drain's)."""

    def count(status: str, fate: str | None = None) -> int:
        return sum(o.status == status and (fate is None or o.fate == fate) for o in outcomes)

    errors = [
        f"warm-up #{o.index} {o.kind}/{o.fate}: {o.error or o.status}"
        for o in warm
        if o.status != "ok"
    ]
    errors += [f"#{o.index} {o.kind}/{o.fate}: {o.error}" for o in outcomes if o.status == "error"]
    errors += extra_errors or []
    per_kind = {}
    for kind in KINDS:
        done = [o for o in outcomes if o.kind == kind and o.status == "ok"]
        lat = [o.latency_s for o in done]
        per_kind[kind] = {
            "requests": sum(o.kind == kind for o in outcomes),
            "completed": len(done),
            "cancelled": sum(o.kind == kind and o.status == "cancelled" for o in outcomes),
            "timed_out": sum(o.kind == kind and o.status == "timed_out" for o in outcomes),
            "median_latency_s": round(statistics.median(lat), 2) if lat else None,
            "max_latency_s": round(max(lat), 2) if lat else None,
        }
    per_kind["sql"]["sqlite_refused"] = sum(
        o.kind == "sql" and o.status == "ok" and bool(o.detail.get("sqlite_error"))
        for o in outcomes
    )
    baseline, after = rss
    checks = {
        "all_requests_ended": len(outcomes) == config.requests and not time_limit_hit,
        "no_unexpected_errors": not errors,
        "no_leaked_kv_bytes": leaked == 0 and sequences_left == 0,
        "slot_free_lists_whole": audit_error is None,
        "engine_idle": engine_idle,
        "rss_within_tolerance": after <= baseline * (1 + config.rss_tolerance),
        "some_cancelled_and_timed_out": count("cancelled") > 0 and count("timed_out") > 0,
    }
    return {
        "path": path,
        "transport": transport or {"api": "pask_agent.runtime.Runtime (in this process)"},
        "requests": len(outcomes),
        "requests_planned": config.requests,
        "concurrency": config.concurrency,
        "completed": count("ok"),
        "cancelled": count("cancelled"),
        "timed_out": count("timed_out"),
        "planned": {
            "cancel": sum(o.fate == "cancel" for o in outcomes),
            "timeout": sum(o.fate == "timeout" for o in outcomes),
            "cancel_finished_first": count("ok", "cancel"),
            "timeout_met_deadline": count("ok", "timeout"),
        },
        "unexpected_errors": len(errors),
        "errors": errors[:20],
        "leaked_kv_bytes": leaked,
        "sequences_left": sequences_left,
        "slot_audit_error": audit_error,
        "rss_baseline_bytes": baseline,
        "rss_after_bytes": after,
        "rss_growth": round(after / baseline - 1, 4),
        "kv_pool_bytes_baseline": pool_baseline,
        "kv_pool_bytes_after": pool_after,
        "wall_s": round(wall_s, 1),
        "warmup_s": round(warm_s, 1),
        "warmup_requests": len(warm),
        "time_limit_hit": time_limit_hit,
        "per_kind": per_kind,
        "checks": checks,
        "passed": all(checks.values()),
        "config": asdict(config),
        "model": loaded.name,
    }


def environment(command: str) -> dict[str, Any]:
    """The command line, git commit and machine a result comes from (call it at the start).

    ``git_modified`` lists tracked files of the package that differ from the commit, so a
    result run on a working tree with edits says so.
    """

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], capture_output=True, text=True, check=True, cwd=package
            ).stdout
        except (OSError, subprocess.CalledProcessError):
            return "unknown"

    package = Path(__file__).resolve().parents[1]
    modified = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    import torch

    return {
        "command": command,
        "git_commit": git("rev-parse", "HEAD").strip(),
        "git_modified": [line[3:] for line in modified.splitlines() if line != "unknown"],
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "memory_bytes": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
    }


def write(report: dict[str, Any], out: Path) -> None:
    """``<out>.json`` (the whole report) and ``<out>.md`` (a summary table)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    mib = 1 << 20
    edited = report.get("git_modified")
    edits = f" (local edits to {', '.join(edited)})" if edited else ""
    path = report.get("path", "in-process")
    lines = [
        f"# Soak ({path}): {report['requests']} of {report['requests_planned']} requests ended, "
        f"concurrency {report['concurrency']} "
        f"({report['model']}) — {'PASSED' if report['passed'] else 'FAILED'}",
        "",
        f"Command: `{report['command']}` at commit `{report['git_commit'][:10]}`{edits} on "
        f"{report['machine']['cpu_count']} CPUs ({report['machine']['platform']}).",
        "",
        f"Path: **{path}** — "
        + "; ".join(f"{k}: {v}" for k, v in report.get("transport", {}).items())
        + ".",
        "",
        f"Wall time {report['wall_s']} s after a {report['warmup_s']} s warm-up of "
        f"{report['warmup_requests']} requests; max_new_tokens "
        f"{report['config']['max_new_tokens']}, max_batch {report['config']['max_batch']}.",
        "",
        "| kind | requests | completed | cancelled | timed out | median latency s | max s |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, k in report["per_kind"].items():
        lines.append(
            f"| {kind} | {k['requests']} | {k['completed']} | {k['cancelled']} | "
            f"{k['timed_out']} | {k['median_latency_s']} | {k['max_latency_s']} |"
        )
    p = report["planned"]
    lines += [
        "",
        f"Planned: {p['cancel']} cancels ({p['cancel_finished_first']} finished before the "
        f"cancel landed), {p['timeout']} short deadlines ({p['timeout_met_deadline']} met "
        f"them). SQL answers SQLite refused (model misses, not faults): "
        f"{report['per_kind']['sql']['sqlite_refused']}.",
        "",
        "| check | value | ok |",
        "|---|---|---|",
        f"| unexpected errors | {report['unexpected_errors']} | "
        f"{report['checks']['no_unexpected_errors']} |",
        f"| leaked KV bytes (sequences left) | {report['leaked_kv_bytes']} "
        f"({report['sequences_left']}) | {report['checks']['no_leaked_kv_bytes']} |",
        f"| slot free lists whole | {report['slot_audit_error'] or 'yes'} | "
        f"{report['checks']['slot_free_lists_whole']} |",
        f"| engine idle (no live or queued request) | {report['checks']['engine_idle']} | "
        f"{report['checks']['engine_idle']} |",
        f"| RSS warm baseline → after (MiB) | {report['rss_baseline_bytes'] / mib:.0f} → "
        f"{report['rss_after_bytes'] / mib:.0f} ({report['rss_growth']:+.1%}) | "
        f"{report['checks']['rss_within_tolerance']} |",
        f"| KV pool tensors baseline → after (MiB) | {report['kv_pool_bytes_baseline'] / mib:.0f}"
        f" → {report['kv_pool_bytes_after'] / mib:.0f} | (pools keep their capacity) |",
        f"| every request ended within {report['config']['time_limit_s']:.0f} s | "
        f"{not report['time_limit_hit']} | {report['checks']['all_requests_ended']} |",
    ]
    if report.get("server_statuses"):
        codes = ", ".join(f"{c}: {n}" for c, n in sorted(report["server_statuses"].items()))
        lines += ["", f"Server's chat completions by HTTP status (warm-up included; 499: the "
                  f"client went away): {codes}. Conversations deleted over HTTP at the drains: "
                  f"{report.get('conversations_deleted')}."]  # fmt: skip
    if report["errors"]:
        lines += ["", "Errors:", "", *[f"- {e}" for e in report["errors"]]]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
