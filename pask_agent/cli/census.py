"""``pask-agent census``: count decode tag buckets over BFCL ground-truth calls (App. A.1)."""

from __future__ import annotations

import argparse
from typing import Any

from pask_agent.grammars.bfcl import NON_LIVE_CATEGORIES


def add_parser(sub: Any) -> None:
    p = sub.add_parser("census", help="count tag buckets over the BFCL non-live ground-truth calls")
    p.add_argument("--model", default="default", help="bundled name or HF folder (tokenizer only)")
    p.add_argument(
        "--out", default="results/tag_census.json", help="JSON output; a .md is written beside it"
    )
    p.add_argument(
        "--categories",
        nargs="+",
        default=list(NON_LIVE_CATEGORIES),
        help="BFCL categories (default: the four non-live ones, 1000 cases)",
    )
    p.add_argument("--limit", type=int, default=None, help="first N cases per category")
    p.add_argument(
        "--tool-choice",
        default="auto",
        choices=["auto", "required", "any"],
        help="the grammar mode the tags assume (auto: the first token decides call vs text)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pask_agent.grammars.census import bfcl_census, write_census

    census = bfcl_census(
        args.model, categories=args.categories, limit=args.limit, tool_choice=args.tool_choice
    )
    json_path, md_path = write_census(census, args.out)
    print(
        f"{census.cases} cases, {census.tokens} tokens, {census.distinct_buckets} distinct "
        f"buckets ({len(census.rejected)} answers rejected by the grammar)"
    )
    print(f"wrote {json_path} and {md_path}")
    return 0
