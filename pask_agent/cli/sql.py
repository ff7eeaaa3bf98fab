"""``pask-agent sql``: ask a question about a SQLite file; print the SQL and the rows."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "sql", help="answer a question about a SQLite database with grammar-bound SQL (read-only)"
    )
    p.add_argument("--db", required=True, help="the SQLite database file (opened read-only)")
    p.add_argument("--question", required=True, help="the question, in plain language")
    p.add_argument("--model", default="default", help="bundled name, HF folder or .gguf file")
    p.add_argument("--policy", default=None, help="KV policy: full (default), pask, streaming")
    p.add_argument("--budget", type=float, default=None, help="KV budget B for the policy")
    p.add_argument("--max-rows", type=int, default=20, help="rows to print")
    p.add_argument("--time-limit", type=float, default=5.0, help="seconds per query")
    p.add_argument(
        "--candidates",
        type=int,
        default=None,
        help="queries decoded and voted on (default: the assistant's)",
    )
    p.add_argument(
        "--known",
        default=None,
        help='JSON Lines of checked {"question": ..., "sql": ...} pairs; the nearest are shown',
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import anyio

    from pask_agent.integrations.sql import SQLiteAssistant
    from pask_agent.integrations.sql_known import load_known_queries
    from pask_agent.runtime.runtime import Runtime

    known = load_known_queries(args.known) if args.known else []

    async def ask() -> Any:
        async with Runtime.open(args.model) as rt:
            assistant = SQLiteAssistant(
                args.db, runtime=rt, time_limit_s=args.time_limit, known_queries=known
            )
            try:
                return await assistant.ask(
                    args.question,
                    policy=args.policy,
                    budget=args.budget,
                    candidates=args.candidates,
                )
            finally:
                assistant.close()

    answer = anyio.run(ask)
    if args.json:
        print(
            json.dumps(
                {
                    "sql": answer.sql,
                    "columns": list(answer.columns),
                    "rows": [list(r) for r in answer.rows[: args.max_rows]],
                    "truncated": answer.truncated or len(answer.rows) > args.max_rows,
                    "error": answer.error,
                    "usage": answer.usage.as_dict(),
                    "candidates": [
                        {"sql": c.sql, "digest": c.digest, "votes": c.votes, "error": c.error}
                        for c in answer.candidates
                    ],
                },
                default=str,
            )
        )
    else:
        print(answer.sql)
        print()
        print(answer.table(args.max_rows))
        u = answer.usage
        print(f"\n[kv] B={u.measured_b:.3f} tokens={u.prompt_tokens}+{u.completion_tokens}")
    return 1 if answer.error else 0
