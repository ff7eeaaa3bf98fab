"""Replicas on Ray Serve, measured: affinity, the cost of a miss, and failover.

``python -m pask_agent.eval.serve_ray`` runs one workload (``--conversations`` × ``--turns``
multi-turn chats through the ``openai`` client, each on its own ``conversation_id``) four ways,
on SmolLM2 by default, and writes ``results/serve_ray.{json,md}``:

1. **single**: one in-process server (``pask-agent serve``'s app on loopback): the reference
   answers.
2. **affinity**: ``--replicas`` Ray Serve replicas behind ``ConversationRouter``. Every turn
   of a conversation must reach one replica (read from the replicas' own request counters),
   and every answer must equal the reference.
3. **failover**: the same, on fresh conversation ids; when half the turns are done the
   replica holding the most conversations is killed. No request may fail, the moved
   conversations continue on a survivor (which prefills the history the client sends), and
   after every conversation is deleted the survivors hold 0 live KV bytes.
4. **pow2**: Ray's conversation-blind router, to measure what a miss costs (the turn's
   latency and prompt tokens prefilled, beside the affinity run's).

A broken invariant is reported in the files and makes the command exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pask_agent.eval.serve_ray_report import (
    checks,
    failover_summary,
    latency,
    per_replica,
    render,
    same_answers,
)
from pask_agent.eval.serve_ray_runs import (
    Workload,
    ray_replicas,
    replica_settings,
    run_affinity,
    run_conversations,
    run_failover,
    run_single,
)
from pask_agent.record.provenance import provenance


def bench(work: Workload, replicas: int, *, model: str, pow2: bool = True) -> dict[str, Any]:
    from pask_agent.server.replicas.deployment import ReplicaPlan

    settings = replica_settings(model)
    t0 = time.time()
    reference = run_single(settings, work)
    runs: dict[str, Any] = {"single": {"records": reference}}
    with ray_replicas(settings, ReplicaPlan(replicas=replicas)) as ray_app:
        runs["affinity"] = run_affinity(ray_app, work, "aff")
        runs["failover"] = run_failover(ray_app, work, "fo")
    if pow2:
        with ray_replicas(settings, ReplicaPlan(replicas=replicas, routing="pow2")) as ray_app:
            runs["pow2"] = {
                "records": asyncio.run(run_conversations(ray_app.base_url, work, ids="p2"))
            }
    summary: dict[str, Any] = {}
    for name, run in runs.items():
        records = run["records"]
        summary[name] = {
            "failed": sum(r.error is not None for r in records),
            "per_replica_turns": per_replica(records),
            "latency": latency(records),
            "answers": same_answers(records, reference),
        } | {k: v for k, v in run.items() if k != "records"}
    summary["failover"] |= failover_summary(
        runs["failover"]["records"], runs["failover"]["killed"], runs["affinity"]["records"]
    )
    return {
        "workload": asdict(work),
        "replicas": replicas,
        "model": model,
        "summary": summary,
        "checks": checks(summary),
        "wall_s": time.time() - t0,
        "records": {k: [asdict(r) for r in v["records"]] for k, v in runs.items()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pask_agent.eval.serve_ray", description=__doc__)
    p.add_argument("--conversations", type=int, default=20)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--no-pow2", action="store_true", help="skip the conversation-blind run")
    p.add_argument("--out", type=Path, default=Path("results/serve_ray"))
    args = p.parse_args(argv)
    work = Workload(args.conversations, args.turns, args.max_tokens)
    result = bench(work, args.replicas, model=args.model, pow2=not args.no_pow2)
    result["provenance"] = provenance(
        argv if argv is None else ["-m", "pask_agent.eval.serve_ray", *argv]
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(render(result))
    print(render(result))
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
