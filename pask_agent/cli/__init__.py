"""The ``pask-agent`` command line.

Each subcommand lives in its own module in this package and exposes ``add_parser(subparsers)``
(which registers the subcommand and sets ``func`` to a ``run(args) -> int``). Modules are
discovered, so adding a command never edits this file.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from pask_agent.errors import PaskError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pask-agent", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except PaskError as exc:
        print(f"pask-agent {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BaseExceptionGroup as group:  # errors raised inside the runtime's task group
        match, rest = group.split(PaskError)
        if match is None or rest is not None:
            raise
        for exc in _leaves(match):
            print(f"pask-agent {args.command}: error: {exc}", file=sys.stderr)
        return 2


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


if __name__ == "__main__":
    sys.exit(main())
