"""``pask-agent call``: one structured call (JSON Schema or tools) on a local model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pask_agent.errors import ConfigError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("call", help="one constrained call: --schema S.json or --tools T.json")
    p.add_argument("--model", default="default")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--schema", help="JSON Schema file; the answer validates against it")
    src.add_argument("--tools", help="JSON list of tools in any format ToolSpec accepts")
    p.add_argument("--prompt", required=True)
    p.add_argument("--tool-choice", default="auto")
    p.add_argument("--policy", default="full")
    p.add_argument("--budget", type=float, default=None)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _read_json(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read JSON from {path}: {exc}") from exc


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    import jsonschema

    from pask_agent.runtime.runtime import Runtime
    from pask_agent.runtime.turns.outputs import schema_prompt

    async with Runtime.open(args.model, policy=args.policy, budget=args.budget) as rt:
        kw = dict(max_new_tokens=args.max_new_tokens)
        if args.tools:
            tools = _read_json(args.tools)
            result = await rt.chat(
                [{"role": "user", "content": args.prompt}],
                tools=tools,
                tool_choice=args.tool_choice,
                **kw,
            )
            return {"message": result.message, "usage": result.usage.as_dict()}
        schema = _read_json(args.schema)
        messages = [{"role": "user", "content": f"{args.prompt}\n\n{schema_prompt(schema)}"}]
        result = await rt.chat(messages, spec=rt.outputs.json_schema(schema), **kw)
        value = json.loads(result.text)
        jsonschema.validate(value, schema)
        return {"message": result.message, "usage": result.usage.as_dict(), "value": value}


def run(args: argparse.Namespace) -> int:
    import anyio

    out = anyio.run(_run, args)
    if args.json:
        print(json.dumps(out))
    else:
        print(json.dumps(out.get("value", out["message"]), indent=2))
        u = out["usage"]
        print(
            f"[usage] prompt={u['prompt_tokens']} completion={u['completion_tokens']} "
            f"kv={u['kv_bytes']}B measured B={u['measured_b']:.3f} ttft={u['ttft_s']:.2f}s"
        )
    return 0
