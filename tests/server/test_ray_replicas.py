"""Two SmolLM2 replicas on a local Ray Serve instance, through the real ``openai`` client.

Every turn of a conversation reaches one replica (the replicas' own counters), the answers
are the single-process server's, and when the replica holding the most conversations is
killed mid-run no request fails, its conversations continue on the survivor, and once every
conversation is deleted the survivor holds no KV. ``python -m pask_agent.eval.serve_ray``
runs the same at 20 conversations × 6 turns into ``results/serve_ray.md``.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from pask_agent.eval.serve_ray_report import same_answers
from pask_agent.eval.serve_ray_runs import (
    Workload,
    ray_replicas,
    replica_settings,
    run_affinity,
    run_failover,
    run_single,
)
from pask_agent.server.replicas.deployment import ReplicaPlan

# the replicas load SmolLM2 in their own processes: this worker's default model goes meanwhile
pytestmark = pytest.mark.usefixtures("no_default_model_here")


def test_two_replicas_keep_each_conversation_and_survive_a_killed_one(smollm2: Any) -> None:
    work = Workload(conversations=4, turns=3, max_tokens=6)
    settings = replica_settings()
    reference = run_single(settings, work, loaded=smollm2)
    with ray_replicas(settings, ReplicaPlan(replicas=2, report_every_s=0.5)) as app:
        aff = run_affinity(app, work, "t")
        assert [r.error for r in aff["records"] if r.error] == []
        assert aff["affinity"] == {"conversations": 4, "on_one_replica": 4, "affinity": 1.0}
        assert same_answers(aff["records"], reference) == {"answered": 12, "same": 12}
        assert aff["delete_statuses"] == [200] * 4
        page = httpx.get(f"{app.base_url}/metrics", timeout=30).text
        assert page.count("pask_replica_up{") == 2
        assert "pask_generated_tokens_total{replica=" in page

        fo = run_failover(app, work, "f")
        assert [r.error for r in fo["records"] if r.error] == []  # 0 failed requests
        killed = fo["killed"]["replica"]
        moved = {r.conversation for r in fo["records"] if r.replica == killed} & {
            r.conversation for r in fo["records"] if r.started > fo["killed"]["at"]
        }
        assert moved, "the killed replica held no conversation with turns left"
        after = [
            r for r in fo["records"] if r.conversation in moved and r.started > fo["killed"]["at"]
        ]
        assert all(r.replica not in (None, killed) for r in after)
        assert same_answers(fo["records"], reference) == {"answered": 12, "same": 12}
        assert fo["delete_statuses"] == [200] * 4
        assert fo["survivors"] and all(r["kv_live_bytes"] == 0 for r in fo["survivors"])
