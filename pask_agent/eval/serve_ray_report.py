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


def failover_summary(
    records: list[TurnRecord], killed: dict[str, Any], affinity_run: list[TurnRecord]
) -> dict[str, Any]:
    """Which conversations moved off the killed replica, each one's last turn before the kill
    and first turn after it (times from the run's start), and what the first turn on the
    survivor cost beside the same turn in the affinity run (where nothing moved)."""
    start = min(r.started for r in records)
    at, victim = killed.get("at", float("inf")), killed.get("replica")
    by_conv: dict[int, list[TurnRecord]] = {}
    for r in sorted(records, key=lambda r: r.turn):
        by_conv.setdefault(r.conversation, []).append(r)
    rows, first_after = [], []
    for _, turns in sorted(by_conv.items()):
        before = [r for r in turns if r.started < at]
        after = [r for r in turns if r.started >= at]
        if not (before and after and before[-1].replica == victim):
            continue
        first_after.append(after[0])
        rows += [_row(r, start) for r in (before[-1], after[0])]
    out: dict[str, Any] = {
        "moved_conversations": sorted({r["conversation"] for r in rows}),
        "timeline": rows,
    }
    if "at" in killed:
        out["killed_t_s"] = round(at - start, 3)
    same_turn = {(r.conversation, r.turn): r for r in affinity_run}
    stay = [same_turn[k] for k in ((r.conversation, r.turn) for r in first_after) if k in same_turn]
    if first_after and stay:
        out["miss_cost"] = {
            "moved_first_turn_s": statistics.fmean(r.seconds for r in first_after),
            "moved_first_turn_prefilled": statistics.fmean(r.prefilled_tokens for r in first_after),
            "same_turn_with_affinity_s": statistics.fmean(r.seconds for r in stay),
            "same_turn_with_affinity_prefilled": statistics.fmean(r.prefilled_tokens for r in stay),
        }
    return out


def _row(r: TurnRecord, start: float) -> dict[str, Any]:
    return {
        "t_s": round(r.started - start, 3),
        "conversation": r.conversation,
        "turn": r.turn,
        "replica": r.replica,
        "seconds": round(r.seconds, 3),
        "prefilled_tokens": r.prefilled_tokens,
        "error": r.error,
    }


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
        f"**Failover**: replica `{fo['killed'].get('replica', '-')}` was killed "
        f"{fo.get('killed_t_s', float('nan')):.1f} s into the run, holding "
        f"{fo['killed'].get('conversations', 0)} conversations; "
        f"{len(fo['moved_conversations'])} had turns left and continued on a survivor; "
        f"{fo['failed']} requests failed; after every conversation was deleted the survivors "
        "held " + ", ".join(f"{r['kv_live_bytes']} B" for r in fo["survivors"]) + " of live KV.",
    ]
    cost = fo.get("miss_cost")
    if cost:
        lines += [
            "",
            f"**What a move costs**: the first turn on the survivor took "
            f"{cost['moved_first_turn_s']:.2f} s and prefilled "
            f"{cost['moved_first_turn_prefilled']:.0f} prompt tokens (the whole history); the "
            f"same turns in the affinity run took {cost['same_turn_with_affinity_s']:.2f} s and "
            f"prefilled {cost['same_turn_with_affinity_prefilled']:.0f}.",
        ]
    lines += [
        "",
        "Each moved conversation's last turn before the kill and first turn after it:",
        "",
        "| t (s) | conversation | turn | replica | seconds | prompt tokens prefilled |",
        "| ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for row in fo["timeline"]:
        lines.append(
            f"| {row['t_s']:.1f} | {row['conversation']} | {row['turn']} | "
            f"{row['replica'] or row['error']} | {row['seconds']:.2f} | {row['prefilled_tokens']} |"
        )
    lines += [
        "",
        "Checks: "
        + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in result["checks"].items()),
        "",
    ]
    return "\n".join(lines)
