"""What a calibration reads and where it keeps its progress: trace files checked against the
model, file digests, and the resumable checkpoint of finished tasks."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pask_agent.record.traces import ModelId, Trace, TraceError, read_traces

if TYPE_CHECKING:
    from pask_agent.calibration.buckets import DecodeKeys
    from pask_agent.calibration.calibrate import CalibrationConfig


def load_traces(paths: Sequence[Path], model: ModelId) -> list[tuple[str, Trace]]:
    """``(where, trace)`` for every line of every file, checked for model and outcome."""
    out = []
    for path in paths:
        for i, trace in enumerate(read_traces(path, model=model), 1):
            where = f"{path}:{i}"
            if trace.ok is None:
                raise TraceError(
                    f"{where}: the trace has a 'reference' but no 'ok'; calibration needs each "
                    "turn's outcome (record with `pask-agent traces record`, which scores it)"
                )
            if not trace.tools and trace.sql_schema is None:
                raise TraceError(
                    f"{where}: a turn with neither tools nor sql_schema has no structure to "
                    "calibrate"
                )
            out.append((where, trace))
    return out


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Checkpoint:
    """Append-only JSONL of finished tasks, keyed by stage and trace; read back on resume.

    Each line also records which run wrote it and that run's elapsed seconds, so a resumed
    calibration reports the wall time of all its runs together (``prior_seconds``).
    """

    def __init__(self, path: Path, fingerprint: str) -> None:
        self.path = path
        self.fingerprint = fingerprint
        self.done: dict[tuple[str, str], Any] = {}
        self.run_id = os.urandom(6).hex()
        self._started = time.perf_counter()
        elapsed: dict[str, float] = {}
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line torn by a kill: that task runs again
                if row.get("fingerprint") == fingerprint:
                    self.done[(row["stage"], row["where"])] = row["result"]
                    run = str(row.get("run", ""))
                    elapsed[run] = max(elapsed.get(run, 0.0), float(row.get("elapsed", 0.0)))
        self.prior_seconds = sum(elapsed.values())
        self.prior_runs = len(elapsed)

    def add(self, stage: str, where: str, result: Any) -> None:
        self.done[(stage, where)] = result
        line = json.dumps(
            {
                "fingerprint": self.fingerprint,
                "stage": stage,
                "where": where,
                "run": self.run_id,
                "elapsed": round(time.perf_counter() - self._started, 2),
                "result": result,
            }
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


def model_vocab_size(model: str, tokenizer: Any) -> int:
    from pask_agent.runtime.models.loading import resolve_model_dir

    cfg = json.loads((resolve_model_dir(model) / "config.json").read_text())
    return int(cfg.get("vocab_size") or len(tokenizer))


def count_lines(path: Path) -> int:
    with path.open(encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def run_fingerprint(
    config: CalibrationConfig,
    cal: list[tuple[str, Trace]],
    dev: list[tuple[str, Trace]],
    keys: DecodeKeys,
) -> str:
    body = json.dumps(
        {
            "files": [file_digest(p) for p in (*config.traces, *config.dev)],
            "model": config.model,
            "dtype": config.dtype,
            "sinks": config.sinks,
            "window": config.window,
            "keys": keys.keys,
            # one budget is stored as before, so an earlier run's checkpoint still resumes
            "budget": config.budget if isinstance(config.budget, float) else config.budgets(),
            "per_path": config.candidates_per_path,
            # what a checkpoint's verdicts mean: v3 = re-tokenizations are not flips and the
            # continue-calls rule is replayed per intervention
            "proxy": 3,
            # the B_P rule the prompt candidates are replayed at (policy/stages.py): 2 = the
            # calibrated B_D served, B_P never below the store's protection
            "stages": 2,
            "levels": config.prefill_levels,
            "alpha": [config.alpha_decode, config.alpha_prefill],
            "n": [len(cal), len(dev)],
        },
        sort_keys=True,
    )
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def run_record(config: CalibrationConfig, wall: float) -> dict[str, Any]:
    from pask_agent.record.provenance import provenance

    prov = provenance()
    return {
        "command": config.command or prov["command"],
        "traces": [
            {"path": str(p), "sha256": file_digest(p), "n": count_lines(p)}
            for p in (*config.traces, *config.dev)
        ],
        "wall_seconds": round(wall, 1),
        "cpu_count": os.cpu_count() or 1,
        "git_commit": prov["git_commit"],
        "machine": prov["machine"],
        "dtype": config.dtype,
        "workers": config.workers,
    }
