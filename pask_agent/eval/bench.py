"""Serving benchmark: aggregate decode throughput at several concurrency levels.

Each level submits ``c`` requests at once with prompts of exactly ``prompt_tokens`` tokens and
forces ``new_tokens`` new tokens each (stop tokens masked). Decode throughput counts the tokens
generated after every request has its first token, over the time from then to the end, so
prefill does not dilute it. Results go to JSON + Markdown.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import anyio

from pask_agent.runtime.engine import RuntimeConfig
from pask_agent.runtime.models import load_model
from pask_agent.runtime.results import Delta
from pask_agent.runtime.runtime import Runtime

FILLER = (
    "The agent reads a long tool catalogue before it answers. Each tool has a name, a "
    "description and typed parameters with enums and defaults. "
)


def _prompt(tokenizer: Any, n_tokens: int, salt: int) -> str:
    """A user message whose rendered chat prompt is exactly ``n_tokens`` tokens."""
    body = f"Request {salt}. " + FILLER * (n_tokens // 10 + 4)
    wrapper = tokenizer.apply_chat_template(
        [{"role": "user", "content": "X"}], tokenize=False, add_generation_prompt=True
    )
    overhead = len(tokenizer(wrapper, add_special_tokens=False)["input_ids"]) - 1
    ids = tokenizer(body, add_special_tokens=False)["input_ids"][: max(1, n_tokens - overhead)]
    return tokenizer.decode(ids)


async def run_level(
    rt: Runtime, c: int, prompt_tokens: int, new_tokens: int, policy: str, budget: float | None
) -> dict[str, Any]:
    prompts = [_prompt(rt.tokenizer, prompt_tokens, i) for i in range(c)]
    results: list[Any] = [None] * c
    stamps: list[list[tuple[float, int]]] = [[] for _ in range(c)]
    start = time.perf_counter()

    async def one(i: int) -> None:
        async for item in rt.stream(
            [{"role": "user", "content": prompts[i]}],
            max_new_tokens=new_tokens,
            ignore_eos=True,
            policy=policy,
            budget=budget,
            with_result=True,
        ):
            if isinstance(item, Delta):
                stamps[i].append((time.perf_counter(), len(item.token_ids)))
            else:
                results[i] = item

    async with anyio.create_task_group() as tg:
        for i in range(c):
            tg.start_soon(one, i)
    end = max(s[-1][0] for s in stamps)
    decode_from = max(s[0][0] for s in stamps)  # every request has its first token
    decode_tokens = sum(n for s in stamps for t, n in s if t > decode_from)
    return {
        "concurrency": c,
        "prompt_tokens": [r.usage.prompt_tokens for r in results],
        "new_tokens": [r.usage.completion_tokens for r in results],
        "wall_s": round(end - start, 3),
        "mean_ttft_s": round(sum(r.usage.ttft_s for r in results) / c, 3),
        "mean_tpot_s": round(sum(r.usage.tpot_s for r in results) / c, 4),
        "decode_tokens_per_s": round(decode_tokens / (end - decode_from), 2)
        if end > decode_from
        else None,
        "end_to_end_tokens_per_s": round(
            sum(r.usage.completion_tokens for r in results) / (end - start), 2
        ),
        "measured_b": round(
            sum(r.usage.kv_bytes for r in results) / sum(r.usage.full_kv_bytes for r in results),
            4,
        ),
    }


async def bench(
    model: str,
    levels: list[int],
    prompt_tokens: int,
    new_tokens: int,
    policy: str,
    budget: float | None,
) -> list[dict[str, Any]]:
    loaded = await anyio.to_thread.run_sync(load_model, model)
    config = RuntimeConfig(prefill_chunk_tokens=512, max_batch=max(levels))
    rows = []
    async with Runtime.open(loaded, config=config) as rt:
        await rt.chat([{"role": "user", "content": "warm up"}], max_new_tokens=2)
        for c in levels:
            rows.append(await run_level(rt, c, prompt_tokens, new_tokens, policy, budget))
    return rows


def write(rows: list[dict[str, Any]], out: Path, meta: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    base = rows[0]["decode_tokens_per_s"] or 1.0
    lines = [
        f"# Serving benchmark ({meta['model']}, policy {meta['policy']})",
        "",
        f"Command: `{meta['command']}`",
        "",
        "| concurrency | decode tok/s (aggregate) | speed-up vs 1 | mean TPOT s | "
        "mean TTFT s | wall s | measured B |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tps = r["decode_tokens_per_s"] or 0.0
        lines.append(
            f"| {r['concurrency']} | {tps} | {tps / base:.2f}x | {r['mean_tpot_s']} | "
            f"{r['mean_ttft_s']} | {r['wall_s']} | {r['measured_b']} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default")
    p.add_argument("--concurrency", default="1,4,8")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--policy", default="full")
    p.add_argument("--budget", type=float, default=None)
    p.add_argument("--out", default="results/bench")


def main_from_args(args: argparse.Namespace, command: str) -> int:
    levels = [int(x) for x in args.concurrency.split(",")]
    rows = anyio.run(
        bench, args.model, levels, args.prompt_tokens, args.new_tokens, args.policy, args.budget
    )
    meta = {
        "model": args.model,
        "policy": args.policy,
        "budget": args.budget,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "command": command,
    }
    write(rows, Path(args.out), meta)
    print(Path(args.out).with_suffix(".md").read_text())
    return 0
