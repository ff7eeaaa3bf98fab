"""``pask-agent serve``: the OpenAI-compatible server over one local model."""

from __future__ import annotations

import argparse
import os
from typing import Any

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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pask_agent.runtime.limits import check_budget
    from pask_agent.server.auth import check_bind

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    check_bind(args.host, api_key)  # at once: before seconds of imports and model loading
    check_budget(args.budget)

    import uvicorn

    from pask_agent.policy import get_policy
    from pask_agent.runtime.config import RuntimeConfig
    from pask_agent.server import ServerSettings, create_app

    get_policy(args.policy)
    settings = ServerSettings(
        model=args.model,
        served_model_name=args.served_model_name,
        policy=args.policy,
        budget=args.budget,
        api_key=api_key,
        max_queue=args.max_queue,
        default_max_tokens=args.max_tokens,
        default_temperature=args.temperature,
        runtime=RuntimeConfig(
            max_batch=args.max_batch,
            kv_capacity_bytes=args.kv_capacity_mb << 20 if args.kv_capacity_mb else None,
        ),
    )
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level=args.log_level)
    return 0
