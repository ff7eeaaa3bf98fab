"""``pask-agent calibrate``: recorded traces → a frozen PASK table for one model.

    pask-agent calibrate --model default --traces cal.jsonl --dev dev.jsonl \\
        --budget 0.10,0.15,0.20,0.25,0.33 --out calibration_data/policies/default.json

Several budgets share every measurement and decode replay; each gets its own prompt plan,
selected at the ``B_P`` the runtime plans for that budget, and a request is served the plan of
its budget or the next stricter one (``PolicyTable.at_budget``).

A killed run resumes from its checkpoint (``<out>.checkpoint.jsonl``) when started again with
the same inputs. ``--workers N`` spreads traces over N local processes; ``--ray local|auto|ADDR``
runs the same tasks as Ray actors.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="calibrate a PASK table from recorded traces")
    p.add_argument("--model", default="default")
    p.add_argument("--traces", required=True, type=Path, nargs="+", help="calibration traces")
    p.add_argument("--dev", required=True, type=Path, nargs="+", help="development traces")
    p.add_argument(
        "--budget",
        type=_budgets,
        default=None,
        help="target total KV budget B, or several comma-separated (one prompt plan each)",
    )
    p.add_argument("--out", required=True, type=Path, help="table to write (JSON)")
    p.add_argument("--alpha-decode", type=float, default=0.05)
    p.add_argument("--alpha-prefill", type=float, default=0.02)
    p.add_argument("--beta", type=float, default=0.8, help="reserve quantile")
    p.add_argument("--horizon", type=int, default=8, help="reserve lookahead K")
    p.add_argument(
        "--workers",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="local worker processes, one torch thread each (default: up to 2)",
    )
    p.add_argument("--ray", default=None, help="run on Ray: local, auto, or a cluster address")
    p.add_argument("--checkpoint", type=Path, default=None, help="default: <out>.checkpoint.jsonl")
    p.add_argument("--report", type=Path, default=None, help="default: <out stem>.report.json")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--candidates-per-path", type=int, default=8)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def _budgets(text: str) -> float | tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a budget like 0.33 or several like 0.1,0.2,0.33"
        ) from None
    return values[0] if len(values) == 1 else values


def run(args: argparse.Namespace) -> int:
    from pask_agent.calibration.calibrate import CalibrationConfig, calibrate

    config = CalibrationConfig(
        traces=tuple(args.traces),
        dev=tuple(args.dev),
        out=args.out,
        model=args.model,
        budget=args.budget,
        alpha_decode=args.alpha_decode,
        alpha_prefill=args.alpha_prefill,
        beta=args.beta,
        horizon=args.horizon,
        workers=args.workers,
        ray=args.ray,
        checkpoint=args.checkpoint,
        report=args.report,
        dtype=args.dtype,
        candidates_per_path=args.candidates_per_path,
        command="pask-agent " + shlex.join(sys.argv[1:]),
        progress=not args.no_progress,
    )
    result = calibrate(config)
    print(
        f"wrote {result.table_path} in {result.wall_seconds:.0f} s: B_D={result.budget_decode}, "
        f"B_P={result.budget_prefill:.4f} (report: {result.report_path})"
    )
    for plan in result.report.get("prefill_choice", []):
        if plan["budget"] is not None:
            print(f"  B={plan['budget']:g}: B_P={plan['budget_prefill']:.4f}, {plan['choice']}")
    return 0
