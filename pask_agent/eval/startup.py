"""How long ``pask-agent serve`` takes to start: process launch to ``/health`` answering.

    python -m pask_agent.eval.startup --model default --policy pask --budget 0.33 --launches 3

Each launch runs the real command in a fresh process on a free loopback port and polls
``/health`` until it answers (uvicorn listens only after the app's lifespan has opened the
runtime, so the first answer means "ready to serve"). The model cache is built first, outside
the timing: the number is the start of a server whose cache exists.

Wall time depends on what else the machine runs, so each launch also records the process's
own CPU seconds at the moment it became ready (from ``/proc``, Linux) and the load average:
on a shared machine the CPU seconds are the number that carries over. To compare two
commits under the same load, ``--checkout LABEL=DIR`` (repeatable) runs the server from
other source trees instead (``git archive <commit> | tar -x -C DIR``), launches
interleaved. Writes ``results/serve_startup.{json,md}`` with the command, commit and machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pask_agent.record.provenance import provenance

_POLL_S = 0.05


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (``/proc/<pid>/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class ServedProcess:
    """A ``pask-agent serve`` process that answers ``/health``: its port, pid and how long it
    took (wall seconds from launch)."""

    port: int
    pid: int
    ready_wall_s: float

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@contextmanager
def served_process(
    serve_args: list[str],
    *,
    timeout_s: float,
    source: Path | None = None,
    log: Path | None = None,
) -> Iterator[ServedProcess]:
    """Run ``pask-agent serve`` (from ``source`` when given) on a free loopback port until the
    block ends; yields once ``/health`` answers. ``log`` receives the server's output
    (default: only its errors are kept, for the message when it exits early)."""
    port = free_port()
    cmd = [sys.executable, "-m", "pask_agent.cli", "serve", *serve_args, "--port", str(port)]
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), env.get("PYTHONPATH")]))
    with ExitStack() as stack:
        out = stack.enter_context(log.open("w")) if log is not None else None
        start = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            stdout=out if out is not None else subprocess.DEVNULL,
            stderr=out if out is not None else subprocess.PIPE,
            text=True,
            env=env,
            cwd=source,
        )
        try:
            while True:
                if proc.poll() is not None:
                    err = log.read_text() if log is not None else proc.stderr.read()  # type: ignore[union-attr]
                    raise RuntimeError(f"the server exited with {proc.returncode}: {err[-2000:]}")
                if time.perf_counter() - start > timeout_s:
                    raise TimeoutError(f"no /health answer within {timeout_s} s")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    pass
                time.sleep(_POLL_S)
            yield ServedProcess(port, proc.pid, time.perf_counter() - start)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def launch_once(
    serve_args: list[str], *, timeout_s: float, source: Path | None = None
) -> dict[str, Any]:
    """Start the server (from ``source`` when given), wait for ``/health``, stop it; wall and
    CPU seconds to ready."""
    load_before = os.getloadavg()[0]
    with served_process(serve_args, timeout_s=timeout_s, source=source) as server:
        cpu = process_cpu_s(server.pid)
    return {
        "wall_s": round(server.ready_wall_s, 2),
        "cpu_s": round(cpu, 2),
        "load_avg_before": round(load_before, 2),
        "load_avg_after": round(os.getloadavg()[0], 2),
    }


def to_markdown(report: dict[str, Any]) -> str:
    lines = [
        "# `pask-agent serve` startup (process launch to `/health` answering, cache present)",
        "",
        f"- command: `{report['command']}`",
        f"- serve arguments: `{' '.join(report['serve_args'])}`",
        f"- git commit: `{report['git_commit']}`",
        f"- machine: {report['machine']}; the servers ran at niceness {report['niceness']} "
        f"(other processes on the machine get the CPU first when it is positive)",
        "",
        "| source | launch | wall s | process CPU s | load avg (1 min) before |",
        "| --- | ---: | ---: | ---: | ---: |",
        *(
            f"| {r['source']} | {i + 1} | {r['wall_s']} | {r['cpu_s']} | {r['load_avg_before']} |"
            for i, r in enumerate(report["launches"])
        ),
        "",
        "| source | median wall s | median process CPU s |",
        "| --- | ---: | ---: |",
        *(
            f"| {label} | **{s['median_wall_s']}** | **{s['median_cpu_s']}** |"
            for label, s in report["summary"].items()
        ),
        "",
        "The machine's other work sets the gap between wall and CPU seconds; the load average",
        "is the 1-minute one when the launch began.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--policy", default="pask")
    p.add_argument("--budget", type=float, default=0.33)
    p.add_argument("--launches", type=int, default=3)
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--out", default="results/serve_startup.json")
    p.add_argument(
        "--checkout",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="launch from this source tree instead of the running checkout (repeatable)",
    )
    args = p.parse_args(argv)
    sources: dict[str, Path | None] = {} if args.checkout else {"this": None}
    for item in args.checkout:
        label, _, folder = item.partition("=")
        sources[label] = Path(folder).resolve()

    from pask_agent.runtime.models.loading import resolve_model_dir

    resolve_model_dir(args.model)  # build the cache now, outside the timing
    serve_args = ["--model", args.model, "--policy", args.policy, "--log-level", "warning"]
    if args.budget is not None:
        serve_args += ["--budget", str(args.budget)]
    launches = []
    for i in range(args.launches):
        for label, source in sources.items():  # interleaved: each round sees similar load
            row = {
                "source": label,
                **launch_once(serve_args, timeout_s=args.timeout_s, source=source),
            }
            launches.append(row)
            print(f"round {i + 1}: {row}", flush=True)
    summary = {}
    for label in sources:
        rows = [r for r in launches if r["source"] == label]
        summary[label] = {
            "median_wall_s": round(statistics.median(r["wall_s"] for r in rows), 2),
            "median_cpu_s": round(statistics.median(r["cpu_s"] for r in rows), 2),
        }
    report = {
        **provenance(),
        "serve_args": serve_args,
        "niceness": os.nice(0),
        "sources": {label: str(src) if src else "this checkout" for label, src in sources.items()},
        "launches": launches,
        "summary": summary,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(to_markdown(report), encoding="utf-8")
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
