"""``pask-agent eval bfcl``: BFCL non-live accuracy and measured KV budget per policy.

``--policy`` and ``--budget`` take one value or a comma-separated list; every combination runs
(``full`` once, at ``B = 1``). Results go to ``<out>.jsonl``, ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("eval", help="accuracy harnesses (BFCL) under a KV policy and budget")
    benches = p.add_subparsers(dest="bench", required=True)
    b = benches.add_parser("bfcl", help="BFCL non-live, official AST checker")
    b.add_argument(
        "--policy",
        default="pask",
        help="policy name(s), comma-separated: full,pask,streaming,h2o,snapkv,mikv,position",
    )
    b.add_argument("--budget", default="0.33", help="target total KV budget(s) B in (0, 1]")
    b.add_argument("--cases", type=int, default=10, help="cases per category")
    b.add_argument("--split", default="dev", choices=("calibration", "dev", "test"))
    b.add_argument("--out", default="results/bfcl_dev", help="output path without extension")
    b.add_argument("--model", default="default", help="bundled name or model folder")
    b.add_argument("--max-new-tokens", type=int, default=200)
    b.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pask_agent.eval import bfcl_eval

    ns = argparse.Namespace(
        policies=args.policy,
        budgets=args.budget,
        cases_per_category=args.cases,
        split=args.split,
        out=args.out,
        model=args.model,
        max_new_tokens=args.max_new_tokens,
    )
    return bfcl_eval.run(ns)
