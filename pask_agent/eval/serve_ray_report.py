"""What ``eval.serve_ray``'s runs mean: latency, answers beside the reference, per-replica
load, the invariants, and the Markdown page of ``results/serve_ray.md``."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pask_agent.eval.serve_ray import TurnRecord


def latency(records: list[TurnRecord], *, later_turns: bool = True) -> dict[str, float]:
    """Turn latency and prompt tokens prefilled, over turns after the first (where a replica
    that holds the conversation prefills only the new messages)."""
    chosen = [r for r in records if r.error is None and (r.turn > 0 or not later_turns)]
    if not chosen:
        return {}
    seconds = sorted(r.seconds for r in chosen)
    return {
        "turns": len(chosen),
        "mean_s": statistics.fmean(seconds),
        "p50_s": seconds[len(seconds) // 2],
        "p95_s": seconds[min(len(seconds) - 1, int(0.95 * len(seconds)))],
        "prefilled_tokens_mean": statistics.fmean(r.prefilled_tokens for r in chosen),
        "prompt_tokens_mean": statistics.fmean(r.prompt_tokens for r in chosen),
    }


def same_answers(records: list[TurnRecord], reference: list[TurnRecord]) -> dict[str, int]:
    want = {(r.conversation, r.turn): r.answer for r in reference}
    done = [r for r in records if r.error is None]
    return {
        "answered": len(done),
        "same": sum(want.get((r.conversation, r.turn)) == r.answer for r in done),
    }


def per_replica(records: list[TurnRecord]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        if r.replica is not None:
            out[r.replica] = out.get(r.replica, 0) + 1
    return out


def checks(summary: dict[str, Any]) -> dict[str, bool]:
    """The invariants the replicated server must keep (the command exits 1 when one breaks)."""
    aff, fo = summary["affinity"], summary["failover"]
    return {
        "affinity_is_100_percent": aff["affinity"]["affinity"] == 1.0,
        "affinity_answers_equal_single": aff["answers"]["same"] == aff["answers"]["answered"]
        and aff["failed"] == 0,
        "failover_no_failed_request": fo["failed"] == 0,
        "failover_survivors_hold_no_kv": bool(fo["survivors"])
        and all(r["kv_live_bytes"] == 0 for r in fo["survivors"]),
        "failover_deletes_found_every_conversation": all(s == 200 for s in fo["delete_statuses"]),
    }


def render(result: dict[str, Any]) -> str:
    s, w = result["summary"], result["workload"]
    prov = result["provenance"]
    lines = [
        "# Replicas on Ray Serve: affinity, the cost of a miss, failover",
        "",
        f"`{prov['command']}` at `{prov['git_commit']}` on {prov['machine']}; "
        f"{result['replicas']} replicas of `{result['model']}`, {w['conversations']} conversations "
        f"× {w['turns']} turns, {w['max_tokens']} new tokens a turn; {result['wall_s']:.0f} s.",
        "",
        "| run | failed | turns per replica | answers = single | turn p50 s | p95 s "
        "| prompt tokens prefilled (mean, turns ≥ 2) |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for name in ("single", "affinity", "failover", "pow2"):
        if name not in s:
            continue
        r, lat = s[name], s[name]["latency"]
        load = ", ".join(str(v) for v in sorted(r["per_replica_turns"].values(), reverse=True))
        lines.append(
            f"| {name} | {r['failed']} | {load or '1 process'} | "
            f"{r['answers']['same']}/{r['answers']['answered']} | {lat.get('p50_s', 0):.2f} | "
            f"{lat.get('p95_s', 0):.2f} | {lat.get('prefilled_tokens_mean', 0):.1f} of "
            f"{lat.get('prompt_tokens_mean', 0):.1f} |"
        )
    aff, fo = s["affinity"]["affinity"], s["failover"]
    lines += [
        "",
        f"**Affinity**: {aff['on_one_replica']} of {aff['conversations']} conversations had every "
        "turn served by one replica (the replicas' own request counters).",
        "",
        f"**Failover**: replica `{fo['killed'].get('replica', '-')}` was killed at "
        f"t = {fo['killed'].get('t_s', float('nan')):.1f} s holding "
        f"{fo['killed'].get('conversations', 0)} conversations; "
        f"{len(fo['moved_conversations'])} continued on a survivor, "
        f"{fo['failed']} requests failed; "
        "after deleting every conversation the survivors hold "
        + ", ".join(f"{r['kv_live_bytes']} B" for r in fo["survivors"])
        + " of live KV.",
        "",
        "| t (s) | conversation | turn | replica | seconds |",
        "| ---: | ---: | ---: | --- | ---: |",
    ]
    moved = set(fo["moved_conversations"])
    for row in fo["timeline"]:
        if row["conversation"] in moved or row["error"]:
            lines.append(
                f"| {row['t_s']:.1f} | {row['conversation']} | {row['turn']} | "
                f"{row['replica'] or row['error']} | {row['seconds']:.2f} |"
            )
    lines += [
        "",
        "Checks: "
        + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in result["checks"].items()),
        "",
    ]
    return "\n".join(lines)
