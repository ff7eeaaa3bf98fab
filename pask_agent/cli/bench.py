"""``pask-agent bench``: aggregate decode tokens/s per concurrency, to JSON + Markdown."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="serving benchmark at several concurrency levels")
    from pask_agent.eval.bench import add_arguments

    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pask_agent.eval.bench import main_from_args

    return main_from_args(args, "pask-agent " + shlex.join(sys.argv[1:]))
