"""Peak KV bytes of one long tool prompt, Full KV against PASK (issue 11 item 1).

A ~2,048-token prompt (many tools, each with a description and typed parameters) is answered
once per policy through ``Runtime.chat``; the row records ``usage.peak_kv_bytes`` over
``usage.full_kv_bytes``. Written with the command, git commit and machine.

Usage::

    python -m pask_agent.eval.peak --out results/peak
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import anyio

from pask_agent.record.provenance import provenance

_KINDS = ("string", "integer", "number", "boolean")


def many_tools(n: int) -> list[dict[str, Any]]:
    """``n`` OpenAI-style tools with descriptions, typed parameters and an enum each."""
    tools = []
    for i in range(n):
        params = {
            f"field_{j}": {
                "type": _KINDS[(i + j) % len(_KINDS)],
                "description": f"Parameter {j} of operation {i}: what it selects and its unit.",
            }
            for j in range(4)
        }
        params["mode"] = {"type": "string", "enum": ["fast", "careful", "dry_run"]}
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": f"operation_{i}",
                    "description": f"Operation {i} of the inventory service: looks up, checks "
                    "and updates records of one warehouse, and reports what changed.",
                    "parameters": {
                        "type": "object",
                        "properties": params,
                        "required": ["field_0", "mode"],
                    },
                },
            }
        )
    return tools


async def measure(
    model: str, policies: list[str], budget: float, n_tools: int, chunk: int
) -> list[dict[str, Any]]:
    from pask_agent.runtime.config import RuntimeConfig
    from pask_agent.runtime.models.loading import load_model
    from pask_agent.runtime.runtime import Runtime

    loaded = await anyio.to_thread.run_sync(load_model, model)
    messages = [{"role": "user", "content": "Check record 12 of warehouse 3 carefully."}]
    rows = []
    for policy in policies:
        config = RuntimeConfig(prefill_chunk_tokens=chunk)
        async with Runtime.open(loaded, policy=policy, budget=budget, config=config) as rt:
            res = await rt.chat(
                messages, tools=many_tools(n_tools), tool_choice="required", max_new_tokens=32
            )
        u = res.usage
        rows.append(
            {
                "policy": policy,
                "budget": 1.0 if policy == "full" else budget,
                "prompt_tokens": u.prompt_tokens,
                "completion_tokens": u.completion_tokens,
                "prefill_chunk_tokens": chunk,
                "peak_kv_bytes": u.peak_kv_bytes,
                "kv_bytes": u.kv_bytes,
                "full_kv_bytes": u.full_kv_bytes,
                "peak_over_full": round(u.peak_kv_bytes / u.full_kv_bytes, 4),
                "measured_b": round(u.measured_b, 4),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--policies", default="full,pask")
    p.add_argument("--budget", type=float, default=0.33)
    p.add_argument("--tools", type=int, default=9, help="tools in the prompt (9: ~2.1k tokens)")
    p.add_argument("--chunk", type=int, default=256, help="RuntimeConfig.prefill_chunk_tokens")
    p.add_argument("--label", default="", help="name of this run in the output (before/after)")
    p.add_argument("--out", default="", help="append to OUT.json (a list of runs)")
    args = p.parse_args(argv)
    started = time.monotonic()
    rows = anyio.run(
        measure, args.model, args.policies.split(","), args.budget, args.tools, args.chunk
    )
    run = {
        "label": args.label,
        **provenance(None if argv is None else ["-m pask_agent.eval.peak", *argv]),
        "wall_s": round(time.monotonic() - started, 1),
        "rows": rows,
    }
    print(json.dumps(run, indent=1))
    if args.out:
        path = Path(args.out).with_suffix(".json")
        runs = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps([*runs, run], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
