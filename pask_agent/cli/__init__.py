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

from pask_agent.errors import exit_code


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
    return exit_code(lambda: args.func(args), f"pask-agent {args.command}: error")


if __name__ == "__main__":
    sys.exit(main())
