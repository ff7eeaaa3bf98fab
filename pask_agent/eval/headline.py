"""``pask-agent eval headline``: re-measure every figure the README headlines, at HEAD, into
``results/current/`` — one command, resumable, one stage at a time (issue 33, item 1).

    pask-agent eval headline                     # the full profile (hours on a 2-core CPU)
    pask-agent eval headline --quick             # SmolLM2 at smoke size, every stage it has
    pask-agent eval headline --only bfcl,sql --workers 2
    pask-agent eval headline --list              # the stages, their commands, what each measures

Why a runner of commands and not one big function: each stage is an eval command a reader can
run alone (``python -m pask_agent.eval.bfcl_eval ...``), which writes its own files with its own
provenance (``record/provenance.py``: command, commit, dirty flag, machine) and resumes its own
rows when killed. The runner adds what no single eval knows: the list of headline stages, a
manifest (``<out>/headline.json``) of which stage finished at which commit and in how many
seconds, so a rerun at the same commit skips finished stages and continues the one that was
cut; a progress line with an ETA per stage (from the last run's wall times); the pre-flight
refusal of a stage whose peer is not built, before any model loads; and the index of
``<out>`` (``eval/headline_report.py``) that ``results/README.md`` and the README's table come
from.

The quick profile runs on SmolLM2, where PASK's tables do not apply (the shipped and the
hand-written one are both bound to the default model's tokenizer), so its policies are the ones
that run on any model: ``full``, ``int4`` and ``position_both`` (PASK's machinery with position
bins instead of labels). Its numbers check the pipeline, never a claim.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pask_agent.errors import ConfigError
from pask_agent.eval.harness_args import names
from pask_agent.record.provenance import provenance

DEFAULT_OUT = Path("results/current")
QUICK_ESTIMATE_S = 90.0


@dataclass(frozen=True, slots=True)
class Stage:
    """One headline measurement: the eval command that makes it, in both profiles.

    Attributes
    ----------
    name:
        The stage's name (``--only``) and the name of its output under ``--out``.
    what:
        One line: what the stage measures (the index's description).
    module:
        The command's module, run as ``python -m module``.
    full, quick:
        The arguments without ``--out``, as typed; ``quick`` None: the stage has no
        smoke-sized form.
    out:
        ``--out``'s value relative to the output folder (a stem or a folder, as the eval
        takes it).
    workers:
        Whether the eval takes ``--workers`` (the harness's evals do).
    needs:
        A peer folder that must exist, and the command that builds it.
    estimate_s:
        The full profile's wall time on the 2-core CPU, for the first ETA (later runs use
        the manifest's measured seconds); a quick stage is estimated at ``QUICK_ESTIMATE_S``.
    """

    name: str
    what: str
    module: str
    full: str
    quick: str | None
    out: str
    workers: bool = False
    needs: tuple[str, str] | None = None
    estimate_s: float = 600.0

    def argv(self, out_dir: Path, *, quick: bool, workers: int) -> list[str]:
        """The stage's full command line (``sys.executable -m module ...``)."""
        args = self.quick if quick else self.full
        if args is None:
            raise ConfigError(f"stage {self.name!r} has no --quick form; leave it out with --skip")
        extra = ["--workers", str(workers)] if self.workers and workers > 1 else []
        out = ["--out", str(out_dir / self.out)]
        return [sys.executable, "-m", self.module, *shlex.split(args), *out, *extra]


_BUDGETS = "0.20,0.33"
_QUICK = "--model smollm2-135m"
STAGES: tuple[Stage, ...] = (
    Stage(
        "bfcl", "BFCL non-live test cases (50 per category): accuracy and measured B of every "
        "policy at B = 0.20 and 0.33, paired against Full KV",
        "pask_agent.eval.bfcl_eval",
        "--split test --cases-per-category 50 "
        f"--policies full,pask,int4,position_both,position,mikv,snapkv --budgets {_BUDGETS}",
        "--split dev --cases-per-category 1 --policies full,int4,position_both --budgets 0.33 "
        f"--max-new-tokens 48 {_QUICK}",
        "bfcl", workers=True, estimate_s=4 * 3600,
    ),
    Stage(
        "sql", "text-to-SQL test questions, 5 candidates: execution accuracy and measured B",
        "pask_agent.eval.sql_eval",
        f"--split test --policies full,pask,int4,mikv --budgets {_BUDGETS} --candidates 5",
        "--split dev --limit 2 --candidates 1 --policies full,int4 --budgets 0.33 "
        f"--max-new-tokens 48 {_QUICK}",
        "sql", workers=True, estimate_s=4 * 3600,
    ),
    Stage(
        "agent", "agent conversations that must read their history: per-turn accuracy",
        "pask_agent.eval.agent_eval",
        "--split test --policies full,pask,int4,position_both --budgets 0.20",
        "--split dev --conversations 1 --turns 2 --policies full,int4 --budgets 0.33 "
        f"--max-new-tokens 48 {_QUICK}",
        "agent", workers=True, estimate_s=6 * 3600,
    ),
    Stage(
        "extract", "long structured outputs (records extracted from documents): field F1",
        "pask_agent.eval.extract_eval",
        "--split test --policies full,pask,int4,position_both --budgets 0.20",
        f"--split dev --limit 1 --policies full,int4 --budgets 0.33 --max-new-tokens 96 {_QUICK}",
        "extract", workers=True, estimate_s=4 * 3600,
    ),
    Stage(
        "bench", "serving speed: Full KV, PASK and SnapKV at 1 and 8 concurrent 512-token "
        "requests (tok/s, TTFT, KV bytes)",
        "pask_agent.cli",
        "bench --policies full,pask,snapkv --budget 0.33 --concurrency 1,8 --prompt-tokens 512 "
        "--new-tokens 64",
        "bench --policies full,int4 --budget 0.33 --concurrency 1 --prompt-tokens 128 "
        f"--new-tokens 8 {_QUICK}",
        "bench", estimate_s=1200,
    ),
    Stage(
        "bench_peers", "llama.cpp's llama-batched-bench on the same GGUF beside our Full KV and "
        "PASK (prefill and decode tok/s, KV bytes per token, peak RSS)",
        "pask_agent.cli",
        "bench --peer llamacpp --policies full,pask --budget 0.33 --concurrency 1,8 "
        "--prompt-tokens 512,4096 --new-tokens 64 --threads 2",
        None, "bench_peers", needs=(".peers/llamacpp", "make peer-llamacpp"), estimate_s=2400,
    ),
    Stage(
        "kvpress", "NVIDIA kvpress's SnapKV, StreamingLLM, ExpectedAttention and KVzip on the "
        "same BFCL test cases, same grammar and greedy decoding",
        "pask_agent.eval.kvpress_peer",
        "--split test --cases-per-category 50 "
        f"--presses snapkv,streaming_llm,expected_attention,kvzip --budgets {_BUDGETS}",
        None, "bfcl_kvpress", needs=(".peers/kvpress/venv", "make peer-kvpress"),
        estimate_s=14 * 3600,
    ),
    Stage(
        "peak", "peak KV bytes of one long (~2.1k-token) tool prompt, Full KV against PASK",
        "pask_agent.eval.peak",
        "--policies full,pask --budget 0.33",
        f"--policies full,int4 --budget 0.33 --tools 2 {_QUICK}",
        "peak", estimate_s=300,
    ),
    Stage(
        "startup", "pask-agent serve: process launch to the first answer, 5 launches",
        "pask_agent.eval.startup",
        "--policy pask --budget 0.33 --launches 5",
        f"--policy full --launches 1 {_QUICK}",
        "serve_startup.json", estimate_s=300,
    ),
    Stage(
        "soak", "load and cancellation soak: every request ends, no KV or memory leaks",
        "pask_agent.eval.soak",
        "",
        f"--requests 12 --concurrency 4 --cancel-fraction 0.34 --max-batch 4 {_QUICK}",
        "soak", estimate_s=1800,
    ),
)  # fmt: skip
STAGE_NAMES = tuple(s.name for s in STAGES)


def select(only: str | None, skip: str | None, *, quick: bool) -> list[Stage]:
    """The stages to run, in the fixed order. ``--quick`` leaves out the stages without a
    smoke-sized form unless ``--only`` names them (then they are refused).

    Raises
    ------
    ConfigError
        A stage name that does not exist, or ``--only`` naming a stage ``--quick`` lacks.
    """
    wanted = names(only) if only else []
    left_out = names(skip) if skip else []
    unknown = sorted(set(wanted + left_out) - set(STAGE_NAMES))
    if unknown:
        raise ConfigError(f"unknown stage(s) {unknown}; the stages are {list(STAGE_NAMES)}")
    chosen = [s for s in STAGES if (not wanted or s.name in wanted) and s.name not in left_out]
    if quick:
        lacking = [s.name for s in chosen if s.quick is None and s.name in wanted]
        if lacking:
            raise ConfigError(f"stage(s) {lacking} have no --quick form (they need a peer)")
        chosen = [s for s in chosen if s.quick is not None]
    if not chosen:
        raise ConfigError("no stage left to run: check --only and --skip")
    return chosen


def preflight(stages: Sequence[Stage], root: Path) -> None:
    """Refuse, before any model loads, a stage whose peer is not built."""
    missing = [(s.name, s.needs) for s in stages if s.needs and not (root / s.needs[0]).exists()]
    if missing:
        how = "; ".join(f"{name}: {path} missing, build it with `{cmd}`" for name, (path, cmd)
                        in missing)  # fmt: skip
        raise ConfigError(f"{how}; or leave the stage(s) out with --skip")


class Manifest:
    """``<out>/headline.json``: the profile, and per stage its status, command, commit and
    wall time. A stage finished at the current commit with the same command is skipped."""

    def __init__(self, path: Path, profile: str, restart: bool) -> None:
        self.path = path
        data = json.loads(path.read_text()) if path.exists() and not restart else {}
        if data and data.get("profile") != profile:
            raise ConfigError(
                f"{path} holds a {data.get('profile')!r} run; pass --restart to start a "
                f"{profile!r} one there, or another --out"
            )
        self.data: dict[str, Any] = data or {"profile": profile, "stages": {}}

    def done(self, stage: Stage, command: str, commit: str) -> bool:
        entry = self.data["stages"].get(stage.name, {})
        return (entry.get("status"), entry.get("command"), entry.get("git_commit")) == (
            "done", command, commit)  # fmt: skip

    def seconds(self, stage: Stage) -> float:
        guess = QUICK_ESTIMATE_S if self.data["profile"] == "quick" else stage.estimate_s
        return float(self.data["stages"].get(stage.name, {}).get("seconds", guess))

    def record(self, stage: Stage, **entry: Any) -> None:
        self.data["stages"][stage.name] = entry
        self.data.update(provenance())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        tmp.replace(self.path)  # never half-written


def _clock(seconds: float) -> str:
    m = int(seconds // 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{int(seconds % 60):02d}s"


def run_headline(
    stages: Sequence[Stage],
    out: Path,
    *,
    quick: bool,
    workers: int = 1,
    restart: bool = False,
    runner: Callable[[list[str]], int] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run ``stages`` in order into ``out`` (module docstring); returns the manifest.

    A stage whose command fails stops the run (its manifest entry says ``failed`` and the
    exit code); rerunning continues there, since every eval resumes its own rows.
    """
    root = Path(__file__).resolve().parents[2]
    preflight(stages, root)
    manifest = Manifest(out / "headline.json", "quick" if quick else "full", restart)
    commit = provenance()["git_commit"]
    run = runner or (lambda argv: subprocess.run(argv, cwd=root, check=False).returncode)
    left = sum(manifest.seconds(s) for s in stages)
    for i, stage in enumerate(stages, 1):
        argv = stage.argv(out, quick=quick, workers=workers)
        command = " ".join(["python", *argv[1:]])
        expected = manifest.seconds(stage)
        if manifest.done(stage, command, commit):
            log(f"[{i}/{len(stages)}] {stage.name}: done at this commit, kept")
            left -= expected
            continue
        log(f"[{i}/{len(stages)}] {stage.name}: {stage.what}\n    {command}\n"
            f"    ETA this stage ~{_clock(expected)}, all stages left ~{_clock(left)}")  # fmt: skip
        started = time.monotonic()
        code = run(argv)
        seconds = round(time.monotonic() - started, 1)
        status = "done" if code == 0 else "failed"
        manifest.record(stage, status=status, exit_code=code, command=command,
                        git_commit=commit, seconds=seconds, what=stage.what,
                        output=stage.out)  # fmt: skip
        left -= expected
        log(f"[{i}/{len(stages)}] {stage.name}: {status} in {_clock(seconds)}")
        if code != 0:
            raise ConfigError(f"stage {stage.name} failed (exit {code}); rerun to continue it")
    from pask_agent.eval.headline_report import write_index

    write_index(out, manifest.data, STAGES)
    return manifest.data


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="SmolLM2 at smoke size (CI's profile)")
    p.add_argument("--only", default=None, help=f"comma-separated stages of {STAGE_NAMES}")
    p.add_argument("--skip", default=None, help="comma-separated stages to leave out")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="default results/current")
    p.add_argument("--workers", type=int, default=1, help="processes per harness eval")
    p.add_argument("--restart", action="store_true", help="forget the manifest's finished stages")
    p.add_argument("--list", action="store_true", help="print the stages and exit")


def run(args: argparse.Namespace) -> int:
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: give 1 or more processes")
    stages = select(args.only, args.skip, quick=args.quick)
    if args.list:
        for s in stages:
            cmd = " ".join(s.argv(args.out, quick=args.quick, workers=args.workers)[1:])
            print(f"{s.name}: {s.what}\n    python {cmd}")
        return 0
    run_headline(stages, args.out, quick=args.quick, workers=args.workers, restart=args.restart)
    return 0


def main(argv: list[str] | None = None) -> int:
    from pask_agent.eval.harness_args import main_of

    return main_of(add_arguments, run, "pask-agent eval headline", __doc__ or "", argv)


if __name__ == "__main__":
    raise SystemExit(main())
