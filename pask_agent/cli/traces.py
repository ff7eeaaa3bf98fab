"""``pask-agent traces record``: recorded agent turns for calibration.

``--bfcl simple,multiple,parallel,parallel_multiple --split calibration`` serves one partition
of the fixed BFCL split (``calibration_data/splits/bfcl.json``) at Full KV and writes one trace
per case, with the checker's verdict (``ok``) and a ``reference`` to score replays against.
``--sql --split dev`` does the same for the project's SQL questions (split dev/test in
``questions.jsonl``): the SQL assistant's prompt and grammar, ``ok`` by execution accuracy.
Real use records the same format: ``RuntimeConfig(record_traces=...)``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("traces", help="record agent traces for calibration")
    actions = p.add_subparsers(dest="action", required=True)
    r = actions.add_parser("record", help="record BFCL cases or SQL questions at Full KV")
    which = r.add_mutually_exclusive_group(required=True)
    which.add_argument("--bfcl", help="categories: simple,multiple,parallel,...")
    which.add_argument("--sql", action="store_true", help="the project's SQL questions")
    r.add_argument("--split", required=True, choices=("calibration", "dev", "test"))
    r.add_argument("--out", required=True, type=Path, help="trace file (JSONL) to write")
    r.add_argument("--model", default="default")
    r.add_argument(
        "--cases", type=int, default=None, help="first n per category (SQL: first n; default all)"
    )
    r.add_argument("--max-new-tokens", type=int, default=200)
    r.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pask_agent.eval.trace_recording import bfcl_categories, record_bfcl, record_sql_split

    if args.sql:
        traces = record_sql_split(
            args.split, args.out, model=args.model, limit=args.cases,
            max_new_tokens=args.max_new_tokens,
        )  # fmt: skip
        ok = sum(bool(t.ok) for t in traces)
        print(f"wrote {len(traces)} traces to {args.out} ({ok} correct by execution at Full KV)")
        return 0

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
