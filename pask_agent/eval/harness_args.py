"""The flags every eval shares, and the one entry point behind each eval's command.

``python -m pask_agent.eval.<eval>`` and ``pask-agent eval <eval>`` build their parsers with
the same ``add_arguments``, so a flag has one name and one default wherever it is typed; an
eval adds only its own flags (``--cases-per-category``, SQL's ``--candidates``). ``run_eval``
turns the parsed flags into a run: ``--merge`` joins earlier runs' files and runs nothing,
``--workers N`` runs N shard processes and merges them, otherwise one process runs its
``--shard`` of the cases, resuming whatever an earlier run left in ``--out``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pask_agent.errors import ConfigError, exit_code
from pask_agent.runtime.models.weight_formats import DEFAULT_WEIGHTS, WEIGHT_FORMATS

SPLITS = ("calibration", "dev", "test")


@dataclass(frozen=True, slots=True)
class Defaults:
    """One eval's defaults for the shared flags (the names never change)."""

    out: str
    policies: str = "full,pask"
    budgets: str = "0.33"
    split: str | None = "dev"
    splits: tuple[str, ...] = SPLITS
    max_new_tokens: int = 200
    reference: str = "full"
    concurrency: int | None = None  # None: every case of a configuration at once
    policy_flags: tuple[str, ...] = ()  # older names of --policies that commands still use


def add_arguments(p: argparse.ArgumentParser, d: Defaults) -> None:
    """The shared flags, with ``d``'s defaults."""
    p.add_argument("--split", default=d.split, choices=d.splits, help="which cases")
    p.add_argument(
        "--policies", "--policy", *d.policy_flags, dest="policies", default=d.policies,
        help="comma-separated policy names (full runs once, at B = 1)",
    )  # fmt: skip
    p.add_argument(
        "--budgets", "--budget", dest="budgets", default=d.budgets,
        help="comma-separated target total budgets B in (0, 1]",
    )  # fmt: skip
    p.add_argument("--out", default=d.out, help=f"where results go (default {d.out})")
    p.add_argument("--model", default="default", help="bundled model name or model folder")
    p.add_argument(
        "--device", default=None,
        help="where the model and KV pools run: cpu, cuda, cuda:N (default: where it loads)",
    )  # fmt: skip
    p.add_argument(
        "--weights", default=DEFAULT_WEIGHTS, choices=WEIGHT_FORMATS,
        help=f"how the model's linear layers hold their weights (default {DEFAULT_WEIGHTS})",
    )  # fmt: skip
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument(
        "--reference", default=d.reference,
        help="comma-separated configurations every other one is paired against",
    )  # fmt: skip
    p.add_argument("--shard", default=None, help="I/N: every N-th case from the I-th")
    p.add_argument(
        "--workers", type=int, default=1,
        help="run N processes, one shard each, and merge them into --out",
    )  # fmt: skip
    p.add_argument(
        "--concurrency", type=int, default=d.concurrency,
        help=f"cases in flight at once per process (default {d.concurrency or 'all'}; the "
        "runtime batches their requests)",
    )  # fmt: skip
    p.add_argument(
        "--merge", type=Path, nargs="+", default=None,
        help="join earlier runs' results (their --out) into --out; runs nothing",
    )  # fmt: skip
    p.add_argument(
        "--restart", action="store_true",
        help="start over instead of resuming the rows an earlier run left in --out",
    )  # fmt: skip


def names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def budgets(text: str) -> list[float]:
    try:
        return [float(b) for b in names(text)]
    except ValueError as exc:
        raise ConfigError(f"--budgets must be comma-separated numbers: {exc}") from exc


def run_eval(
    args: argparse.Namespace,
    workload: Any,
    *,
    module: str,
    policies: Sequence[Any] | None = None,
    log: Callable[[str], None] = print,
) -> int:
    """Run (or merge) what the flags say; ``module`` is the eval's module (``--workers`` runs
    its ``run`` in each process) and ``policies`` replaces ``--policies`` (``Policy`` objects).

    Raises
    ------
    ConfigError
        Bad flags: no policy, a bad budget or shard, ``--workers`` with ``--shard``.
    """
    import anyio

    from pask_agent.eval.harness import Run, Shard, configurations, evaluate
    from pask_agent.eval.harness_report import merge

    refs = tuple(names(args.reference))
    out = workload.stem(Path(args.out))
    if args.merge:
        merge(workload, args.merge, out, references=refs)
        log(f"wrote {out}.{{jsonl,json,md,png}}")
        return 0
    configs = configurations(policies or names(args.policies), budgets(args.budgets))
    if args.workers > 1:
        if args.shard is not None:
            raise ConfigError("--workers runs its own shards; drop --shard")
        workload.check(configs)  # bad names fail before any process starts
        parts = run_workers(module, args)
        merge(workload, parts, out, references=refs)
        log(f"merged {len(parts)} workers into {out}.{{jsonl,json,md,png}}")
        return 0
    shard = Shard.parse(args.shard) if args.shard else None
    run = Run(out, refs, args.restart, args.concurrency, shard, args.device, args.weights)
    anyio.run(lambda: evaluate(workload, configs, run, model=args.model, log=log))
    log(f"wrote {out}.{{jsonl,json,md,png}}")
    return 0


def run_workers(module: str, args: argparse.Namespace) -> list[Path]:
    """Run ``module.run`` in ``args.workers`` processes, shard ``i`` writing to
    ``<out>-shard<i>of<n>`` (each resumes on its own), and return their outputs."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    n = args.workers
    threads = max(1, (os.cpu_count() or 1) // n)
    jobs = [
        argparse.Namespace(
            **{**vars(args), "workers": 1, "shard": f"{i}/{n}", "out": f"{args.out}-shard{i}of{n}"}
        )  # fmt: skip
        for i in range(n)
    ]
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked runtime
    with ProcessPoolExecutor(max_workers=n, mp_context=context) as pool:
        codes = list(pool.map(_worker, [module] * n, jobs, [threads] * n))
    failed = [i for i, code in enumerate(codes) if code != 0]
    if failed:
        raise ConfigError(f"worker shards {failed} failed; rerun to resume them")
    return [Path(job.out) for job in jobs]


def _worker(module: str, args: argparse.Namespace, threads: int) -> int:
    from importlib import import_module

    import torch

    torch.set_num_threads(threads)  # this worker process's share of the cores
    return int(import_module(module).run(args) or 0)


def main_of(
    add: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int],
    prog: str,
    description: str,
    argv: list[str] | None,
) -> int:
    """A module's ``main``: parse, run, and print a typed error as ``error: ...`` (exit 2)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add(parser)
    args = parser.parse_args(argv)
    return exit_code(lambda: run(args))
