"""``pask-agent serve``: the OpenAI-compatible server over one local model."""

from __future__ import annotations

import argparse
import os
from typing import Any

from pask_agent.runtime.models.weight_formats import DEFAULT_WEIGHTS, WEIGHT_FORMATS

API_KEY_ENV = "PASK_AGENT_API_KEY"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (/v1/chat/completions)")
    p.add_argument("--model", default="default", help="bundled name, HF folder or .gguf file")
    p.add_argument("--served-model-name", default=None, help="the model id clients send")
    p.add_argument("--policy", default="full", help="KV policy (full, pask, streaming, ...)")
    p.add_argument("--budget", type=float, default=None, help="KV budget B in (0, 1]")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key",
        default=None,
        help=f"bearer token clients must send (or set {API_KEY_ENV}); required off loopback",
    )
    p.add_argument(
        "--weights", default=DEFAULT_WEIGHTS, choices=WEIGHT_FORMATS,
        help="how the model's linear layers hold their weights (int8/int4: faster CPU decode)",
    )  # fmt: skip
    p.add_argument("--max-batch", type=int, default=16, help="requests decoded together")
    p.add_argument("--max-queue", type=int, default=64, help="waiting requests before 429")
    p.add_argument(
        "--kv-capacity-mb",
        type=int,
        default=None,
        help="KV pool memory preallocated and admitted against (MiB); default: max-batch "
        "Full-KV requests of the model's context, at most 4096",
    )
    p.add_argument("--max-tokens", type=int, default=256, help="when a request omits it")
    p.add_argument("--temperature", type=float, default=0.0, help="when a request omits it")
    p.add_argument("--log-level", default="info")
    p.add_argument("--table", default=None, help="PASK policy table file (implies --policy pask)")
    p.add_argument(
        "--allow-transfer",
        action="store_true",
        help="serve a PASK table calibrated for another model or tokenizer (paper §4.5)",
    )
    ray = p.add_argument_group("replicas on Ray Serve (pip install 'pask-agent[ray]')")
    ray.add_argument("--ray", action="store_true", help="serve replicas on Ray Serve")
    ray.add_argument("--replicas", type=int, default=2, help="replicas, one runtime each")
    ray.add_argument(
        "--autoscale", default=None, metavar="MIN,MAX", help="autoscale between MIN and MAX"
    )
    ray.add_argument("--ray-address", default=None, help="an existing cluster (default: local)")
    ray.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs (threads) per replica")
    ray.add_argument(
        "--routing",
        choices=("conversation", "pow2"),
        default="conversation",
        help="keep a conversation on its replica, or Ray's conversation-blind default",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pask_agent.errors import ConfigError
    from pask_agent.runtime.limits import check_budget
    from pask_agent.server.auth import check_bind

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    check_bind(args.host, api_key)  # at once: before seconds of imports and model loading
    check_budget(args.budget)
    plan = _replica_plan(args) if args.ray else None
    if args.table is not None and args.policy not in ("full", "pask"):
        raise ConfigError(f"--table is a PASK table; it cannot serve --policy {args.policy}")

    from pask_agent.runtime.config import RuntimeConfig
    from pask_agent.server import ServerSettings

    settings = ServerSettings(
        model=args.model,
        served_model_name=args.served_model_name,
        policy=_policy(args),
        budget=args.budget,
        api_key=api_key,
        max_queue=args.max_queue,
        default_max_tokens=args.max_tokens,
        default_temperature=args.temperature,
        runtime=RuntimeConfig(
            max_batch=args.max_batch,
            kv_capacity_bytes=args.kv_capacity_mb << 20 if args.kv_capacity_mb else None,
            weights=args.weights,
        ),
    )
    if plan is not None:
        from pask_agent.server.replicas.deployment import run as run_replicas

        run_replicas(settings, plan, host=args.host, port=args.port, address=args.ray_address)
        return 0
    import uvicorn

    from pask_agent.server import create_app

    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _policy(args: argparse.Namespace) -> Any:
    """The policy name, or a ``PaskPolicy`` value when a table or a transfer is asked for."""
    from pask_agent.policy import get_policy

    if args.table is None and not args.allow_transfer:
        get_policy(args.policy)
        return args.policy
    from pask_agent.policy.pask import PaskPolicy
    from pask_agent.policy.table import PolicyTable

    if args.table is None and args.policy != "pask":
        from pask_agent.errors import ConfigError

        raise ConfigError("--allow-transfer applies to --policy pask (or a --table)")
    table = PolicyTable.read(args.table) if args.table is not None else None
    return PaskPolicy(table=table, allow_transfer=args.allow_transfer)


def _replica_plan(args: argparse.Namespace) -> Any:
    """The replica plan; a missing Ray is named with the extra that brings it, before any work."""
    from pask_agent.errors import ConfigError

    try:
        import ray.serve  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"--ray needs Ray Serve ({exc.name} is missing): pip install 'pask-agent[ray]'"
        ) from exc
    from pask_agent.server.replicas.deployment import ReplicaPlan

    autoscale = None
    if args.autoscale is not None:
        try:
            low, high = (int(x) for x in args.autoscale.split(","))
        except ValueError as exc:
            raise ConfigError(
                f"--autoscale takes MIN,MAX (two integers), got {args.autoscale!r}"
            ) from exc
        if not 0 <= low <= high or high < 1:
            raise ConfigError(
                f"--autoscale needs 0 <= MIN <= MAX and MAX >= 1, got {args.autoscale}"
            )
        autoscale = (low, high)
    if args.replicas < 1:
        raise ConfigError(f"--replicas must be >= 1, got {args.replicas}")
    if args.replica_cpus <= 0:
        raise ConfigError(f"--replica-cpus must be > 0, got {args.replica_cpus}")
    return ReplicaPlan(
        replicas=args.replicas,
        autoscale=autoscale,
        replica_cpus=args.replica_cpus,
        routing=args.routing,
    )
