"""Run langchain-tests' ``ChatModelIntegrationTests`` on the default model; record pass/fail.

    python -m pask_agent.eval.langchain_suite            # whole suite, ~15-30 min on a CPU
    python -m pask_agent.eval.langchain_suite -k tool    # a subset (pytest -k expression)

Why a command and not CI: every test decodes on the real model. The suite class lives in
``tests/integrations/langchain_standard.py`` (a checkout is needed, as for the SQL samples);
CI runs a representative subset from ``tests/integrations/test_langchain_model.py``.
Writes ``results/langchain_integration.json`` (one record per test: id, outcome, seconds,
reason) and ``results/langchain_integration.md`` (a table).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pask_agent.errors import ConfigError
from pask_agent.record.provenance import provenance

SUITE_FILE = (
    Path(__file__).resolve().parents[2] / "tests" / "integrations" / "langchain_standard.py"
)


@dataclass(frozen=True, slots=True)
class TestOutcome:
    """One test's result; ``reason`` is the skip reason or the first failure line."""

    test: str
    outcome: str  # "passed" | "failed" | "skipped"
    seconds: float
    reason: str = ""


class _Recorder:
    """A pytest plugin that keeps one outcome per test (the call phase, or a setup error)."""

    def __init__(self) -> None:
        self.outcomes: dict[str, TestOutcome] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        name = report.nodeid.split("::", 1)[-1]
        if report.when == "call" or (report.when == "setup" and not report.passed):
            reason = ""
            if report.skipped and isinstance(report.longrepr, tuple):
                reason = str(report.longrepr[2])
            elif report.failed:
                lines = str(report.longrepr).strip().splitlines()
                errors = [ln for ln in lines if ln.startswith("E ")]
                reason = (errors[0] if errors else lines[-1] if lines else "")[:300]
            self.outcomes[name] = TestOutcome(
                name, report.outcome, round(report.duration, 2), reason
            )


def run_suite(select: str | None = None) -> list[TestOutcome]:
    """Run the suite (optionally a ``-k`` subset) in this process and return the outcomes."""
    import pytest

    if not SUITE_FILE.is_file():
        raise ConfigError(f"{SUITE_FILE} not found; run from a checkout of pask-agent")
    recorder = _Recorder()
    args = [
        str(SUITE_FILE),
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "asyncio_mode=auto",
        "-o",
        "asyncio_default_fixture_loop_scope=function",
    ]
    if select:
        args += ["-k", select]
    pytest.main(args, plugins=[recorder])
    return list(recorder.outcomes.values())


def write_results(outcomes: list[TestOutcome], out_dir: Path, seconds: float) -> Path:
    """Write the JSON record and the Markdown table; returns the JSON path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {k: sum(o.outcome == k for o in outcomes) for k in ("passed", "failed", "skipped")}
    record = {
        "suite": "langchain_tests.integration_tests.ChatModelIntegrationTests",
        "model": "default",
        "langchain_tests": _version("langchain-tests"),
        "langchain_core": _version("langchain-core"),
        **provenance(),
        "wall_seconds": round(seconds, 1),
        "counts": counts,
        "tests": [asdict(o) for o in outcomes],
    }
    json_path = out_dir / "langchain_integration.json"
    json_path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    lines = [
        "# LangChain standard integration tests: PaskChatModel on the default model",
        "",
        f"langchain-tests {record['langchain_tests']}, langchain-core {record['langchain_core']}; "
        f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
        f"in {seconds / 60:.1f} min.",
        "",
        f"Command: `{record['command']}` at commit `{record['git_commit']}` on "
        f"{record['machine']}.",
        "",
        "| test | outcome | s | reason |",
        "| --- | --- | ---: | --- |",
    ]
    for o in outcomes:
        reason = o.reason.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{o.test}` | {o.outcome} | {o.seconds:.1f} | {reason} |")
    (out_dir / "langchain_integration.md").write_text("\n".join(lines) + "\n")
    return json_path


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", dest="select", default=None, help="pytest -k expression")
    parser.add_argument("--out", type=Path, default=Path("results"), help="output folder")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    outcomes = run_suite(args.select)
    path = write_results(outcomes, args.out, time.perf_counter() - start)
    failed = [o.test for o in outcomes if o.outcome == "failed"]
    print(f"wrote {path}; {len(outcomes)} tests, {len(failed)} failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
