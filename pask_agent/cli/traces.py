"""``pask-agent traces record``: recorded agent turns for calibration.

``--bfcl simple,multiple,parallel,parallel_multiple --split calibration`` serves one partition
of the fixed BFCL split (``calibration_data/splits/bfcl.json``) at Full KV and writes one trace
per case, with the checker's verdict (``ok``) and a ``reference`` to score replays against.
Real use records the same format: ``RuntimeConfig(record_traces=...)``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("traces", help="record agent traces for calibration")
    actions = p.add_subparsers(dest="action", required=True)
    r = actions.add_parser("record", help="record BFCL cases of one split at Full KV")
    r.add_argument("--bfcl", required=True, help="categories: simple,multiple,parallel,...")
    r.add_argument("--split", required=True, choices=("calibration", "dev", "test"))
    r.add_argument("--out", required=True, type=Path, help="trace file (JSONL) to write")
    r.add_argument("--model", default="default")
    r.add_argument("--cases", type=int, default=None, help="first n per category (default all)")
    r.add_argument("--max-new-tokens", type=int, default=200)
    r.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pask_agent.eval.trace_recording import bfcl_categories, record_bfcl

    categories = bfcl_categories(args.bfcl)  # a bad list fails before the model loads
    traces = record_bfcl(
        categories,
        args.split,
        args.out,
        model=args.model,
        per_category=args.cases,
        max_new_tokens=args.max_new_tokens,
    )
    ok = sum(bool(t.ok) for t in traces)
    print(f"wrote {len(traces)} traces to {args.out} ({ok} checked correct at Full KV)")
    return 0
