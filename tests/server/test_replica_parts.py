"""The replicated server's parts without Ray: routing keys, rendezvous placement, the board's
federated metrics page, the in-process host that runs the server app inside a replica, and the
serve command's new flags."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from server_harness import SMOL

from pask_agent.cli import main
from pask_agent.errors import ConfigError
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.server import ServerSettings, create_app
from pask_agent.server.replicas.board import ReplicaBoard, ReplicaReport, federate
from pask_agent.server.replicas.forwarding import AsgiHost, ForwardedRequest
from pask_agent.server.replicas.routing_keys import rendezvous, route_key

CHAT = "/v1/chat/completions"


def body(**fields: Any) -> bytes:
    return json.dumps(
        {"model": SMOL, "messages": [{"role": "user", "content": "Hi"}]} | fields
    ).encode()


def test_route_key_prefers_the_conversation_then_the_user_then_the_opening() -> None:
    assert route_key("POST", CHAT, {"x-conversation-id": "c1"}, body(conversation_id="c2")) == (
        "conversation:c1"
    )
    assert route_key("POST", CHAT, {}, body(conversation_id="c2", user="u")) == "conversation:c2"
    assert route_key("POST", CHAT, {}, body(user="u")) == "user:u"
    assert route_key("DELETE", "/v1/conversations/c3", {}, b"") == "conversation:c3"
    assert route_key("GET", "/v1/models", {}, b"") is None
    assert route_key("POST", CHAT, {}, b"{not json") is None  # the replica answers the 400


def test_the_opening_key_follows_a_conversation_resent_without_an_id() -> None:
    first = [{"role": "system", "content": "S"}, {"role": "user", "content": "Tell me a fact."}]
    later = [
        *first,
        {"role": "assistant", "content": "A fact."},
        {"role": "user", "content": "More"},
    ]
    other = [{"role": "system", "content": "S"}, {"role": "user", "content": "Something else."}]
    key = route_key("POST", CHAT, {}, body(messages=first))
    assert key is not None and key.startswith("prefix:")
    assert route_key("POST", CHAT, {}, body(messages=later)) == key
    assert route_key("POST", CHAT, {}, body(messages=other)) != key
    assert route_key("POST", CHAT, {}, body(messages=first, tools=[{"x": 1}])) != key


def test_rendezvous_is_stable_balanced_and_moves_only_a_lost_replicas_keys() -> None:
    keys = [f"conversation:{i}" for i in range(2000)]
    three = ["r1", "r2", "r3"]
    placed = {k: rendezvous(k, three) for k in keys}
    assert placed == {k: rendezvous(k, list(reversed(three))) for k in keys}  # order-free
    shares = [sum(v == r for v in placed.values()) / len(keys) for r in three]
    assert all(0.28 < s < 0.39 for s in shares), shares
    after = {k: rendezvous(k, ["r1", "r3"]) for k in keys}
    moved = [k for k in keys if after[k] != placed[k]]
    assert moved and all(placed[k] == "r2" for k in moved)  # only r2's keys moved
    assert rendezvous("k", []) is None


def _page(requests: float, live: float) -> str:
    registry = CollectorRegistry()
    Counter("pask_requests", "Chat completions", ["status"], registry=registry).labels(
        status="200"
    ).inc(requests)
    Gauge("pask_kv_live_bytes", "KV bytes", registry=registry).set(live)
    return generate_latest(registry).decode()


def test_federated_page_labels_every_replica_and_parses_back() -> None:
    page = federate({"a": _page(3, 100), "b": _page(5, 0)})
    families = {f.name: f for f in text_string_to_metric_families(page)}
    totals = {
        s.labels["replica"]: s.value
        for s in families["pask_requests"].samples
        if s.name == "pask_requests_total"
    }
    assert totals == {"a": 3.0, "b": 5.0}
    live = {s.labels["replica"]: s.value for s in families["pask_kv_live_bytes"].samples}
    assert live == {"a": 100.0, "b": 0.0}
    assert page.count("# TYPE pask_requests_total counter") == 1  # as prometheus_client writes


def _report(replica: str, at: float, **kw: Any) -> ReplicaReport:
    return ReplicaReport(replica, f"actor-{replica}", 1, at, at, **{"requests": 0} | kw)


def test_board_keeps_the_newest_report_and_marks_silent_replicas_down() -> None:
    board = ReplicaBoard(stale_after_s=5)
    now = time.time()
    board.push(_report("a", now, requests=2, metrics=_page(2, 0)))
    board.push(_report("a", now - 1, requests=1))  # late, older: ignored
    board.push(_report("b", now - 60, metrics=_page(9, 0)))
    reports = {r["replica"]: r for r in board.reports()}
    assert reports["a"]["requests"] == 2 and reports["a"]["up"]
    assert not reports["b"]["up"]
    page = board.metrics_page()
    assert 'pask_replica_up{replica="a"} 1' in page and 'pask_replica_up{replica="b"} 0' in page
    assert 'replica="b",' not in page.replace('pask_replica_up{replica="b"}', "")


def _forwarded(path: str, payload: bytes, method: str = "POST") -> ForwardedRequest:
    headers = ((b"content-type", b"application/json"),)
    return ForwardedRequest(method, path, b"", headers, payload)


def test_host_runs_the_server_app_in_process(smollm2: Any) -> None:
    settings = ServerSettings(
        model="smollm2-135m", served_model_name=SMOL, runtime=RuntimeConfig(max_batch=2)
    )

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        host = AsgiHost(create_app(settings, loaded=smollm2))
        await host.start()
        assert host.alive
        answer = [m async for m in host.serve(_forwarded(CHAT, body(max_tokens=4)))]
        missing = [m async for m in host.serve(_forwarded("/v1/conversations/none", b"", "DELETE"))]
        await host.stop()
        assert not host.alive
        return answer, missing

    answer, missing = asyncio.run(scenario())
    assert answer[0]["type"] == "http.response.start" and answer[0]["status"] == 200
    completion = json.loads(b"".join(m.get("body", b"") for m in answer[1:]))
    assert completion["usage"]["completion_tokens"] == 4
    assert missing[0]["status"] == 404


def test_host_start_fails_with_the_apps_reason() -> None:
    host = AsgiHost(create_app(ServerSettings(model="no-such-model")))
    with pytest.raises(ConfigError, match="did not start: .*ModelNotAvailableError.*no-such-model"):
        asyncio.run(host.start())


def test_serve_flags_are_checked_before_any_work(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray.serve", None)  # as if the extra were not installed
    assert main(["serve", "--ray", "--model", "no-such-model"]) == 2
    assert "pip install 'pask-agent[ray]'" in capsys.readouterr().err
    monkeypatch.undo()
    assert main(["serve", "--ray", "--autoscale", "3", "--model", "no-such-model"]) == 2
    assert "MIN,MAX" in capsys.readouterr().err
    assert main(["serve", "--table", "t.json", "--policy", "streaming"]) == 2
    assert "PASK table" in capsys.readouterr().err
    assert main(["serve", "--table", "/no/such/table.json", "--policy", "pask"]) == 2
    assert "/no/such/table.json" in capsys.readouterr().err


def test_allow_transfer_serves_the_shipped_table_on_another_model(smollm2: Any) -> None:
    from pask_agent.cli.serve import _policy
    from pask_agent.policy.table import PolicyTableError
    from pask_agent.runtime.runtime import Runtime

    parser = __import__("pask_agent.cli", fromlist=["build_parser"]).build_parser()
    strict = _policy(parser.parse_args(["serve", "--policy", "pask"]))
    moved = _policy(parser.parse_args(["serve", "--policy", "pask", "--allow-transfer"]))

    async def check(policy: Any) -> None:
        async with Runtime.open(smollm2, policy=policy, config=RuntimeConfig(max_batch=1)) as rt:
            rt.check_policy()

    with pytest.raises(PolicyTableError, match="allow_transfer"):
        asyncio.run(check(strict))
    asyncio.run(check(moved))
    assert moved.allow_transfer and moved.name == "pask"


def test_random_keys_never_break_the_router_key_function() -> None:
    rng = random.Random(0)
    for _ in range(200):
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        key = route_key("POST", CHAT, {}, junk)
        assert key is None or key.split(":", 1)[0] in {"conversation", "user", "prefix"}
