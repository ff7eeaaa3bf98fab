"""Per-chunk prefill settling against the one-chunk path, on BFCL dev cases (issue 11 item 1).

Settling each prefill chunk before the next one caps a request's peak KV, but later chunks then
read the compressed prefix instead of a high-precision one (a departure from paper §3.6). This
runs the same cases under PASK with ``prefill_chunk_tokens`` small (the server default) and
large enough to hold every prompt in one chunk (the §3.6 path: the plan is carried out after a
high-precision prefill), and reports the accuracy of each and the cases that differ.

Usage::

    python -m pask_agent.eval.chunk_settling --chunks 256,100000 --cases-per-category 5 \\
        --split dev --out results/peak_chunks
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio

from pask_agent.eval.bfcl_eval import BfclWorkload, load_split
from pask_agent.eval.harness import Config, run_cases
from pask_agent.eval.harness_report import summarize_rows
from pask_agent.record.provenance import provenance


async def compare(
    chunks: list[int], *, per_category: int, split: str, model: str, budget: float
) -> dict[str, Any]:
    from pask_agent.runtime.config import RuntimeConfig
    from pask_agent.runtime.models.loading import load_model
    from pask_agent.runtime.runtime import Runtime

    cases = load_split(split, per_category)
    loaded = await anyio.to_thread.run_sync(load_model, model)
    run = provenance()
    variants: dict[str, Any] = {}
    for chunk in chunks:
        config = RuntimeConfig(max_batch=max(16, len(cases)), prefill_chunk_tokens=chunk)
        start = time.perf_counter()
        async with Runtime.open(loaded, config=config) as rt:
            rows = await run_cases(BfclWorkload(), rt, cases, Config("pask", budget), run=run)
        (summary,) = summarize_rows(rows)
        variants[str(chunk)] = {
            "summary": asdict(summary),
            "seconds": round(time.perf_counter() - start, 1),
            "correct": {r.id: r.correct for r in rows},
            "max_prompt_tokens": max(r.measured.prompt_tokens for r in rows),
        }
        print(f"chunk {chunk}: acc {summary.overall:.3f} measured B {summary.measured_b:.3f}")
    first, *rest = variants.values()
    differ = {
        name: sorted(i for i, ok in v["correct"].items() if ok != first["correct"][i])
        for name, v in zip(list(variants)[1:], rest, strict=True)
    }
    return {**run, "cases": len(cases), "budget": budget, "variants": variants, "differ": differ}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunks", default="256,100000", help="prefill_chunk_tokens values")
    p.add_argument("--cases-per-category", type=int, default=5)
    p.add_argument("--split", default="dev")
    p.add_argument("--model", default="default")
    p.add_argument("--budget", type=float, default=0.33)
    p.add_argument("--out", default="results/peak_chunks")
    args = p.parse_args(argv)
    report = anyio.run(
        lambda: compare(
            [int(c) for c in args.chunks.split(",")],
            per_category=args.cases_per_category,
            split=args.split,
            model=args.model,
            budget=args.budget,
        )
    )
    Path(args.out).with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["differ"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
