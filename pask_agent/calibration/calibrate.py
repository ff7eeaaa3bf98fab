"""``pask-agent calibrate``: recorded traces in, a frozen PASK table out (paper §3.4, Alg. 1).

1. **Runtime-V/D** on the calibration traces: every bucket × layer group × {L, R} probe,
   teacher-forced (``measure.py``).
2. **Decode candidates**: per threshold pair the floors and the greedy upgrade path
   (``frontier.py``); a spread of path points is replayed on the development traces and the
   cheapest one whose failure rate is within ``α_D`` of the reference wins. Its nominal cost is
   ``B_D``.
3. **Prompt candidates**, with decode all-high (App. D.8): floors per threshold pair and
   distortion priorities, planned at prompt budgets ``B_P``. With a target total ``B`` the
   runtime solves ``B_P`` per request from ``B``, ``B_D`` and the expected answer length
   (``policy/stages.py``, the same function here: :func:`selection_prompt_budgets`), so the
   candidates are replayed at exactly that ``B_P`` and the pair with the fewest failures wins;
   without one, the cheapest level within ``α_P`` wins.
4. **Reserve** ``Γ(s; B_D)`` from the reference deficits under the chosen floors (β, K).
5. The table, with a ``calibration`` record (command, trace hashes, wall time, CPUs, commit)
   and a report of every measurement next to it.

Every trace's result is appended to a checkpoint as soon as it exists, so a killed run
resumes where it stopped; tasks go to one in-process worker, ``--workers`` local processes, or
Ray actors (``--ray``).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pask_agent.calibration.buckets import DecodeKeys
from pask_agent.calibration.deficits import fit_reserve
from pask_agent.calibration.frontier import (
    Sensitivity,
)
from pask_agent.calibration.inputs import (
    Checkpoint,
    load_traces,
    model_vocab_size,
    run_fingerprint,
    run_record,
)
from pask_agent.calibration.measure import TraceMeasurement
from pask_agent.calibration.replay import TraceReplayer
from pask_agent.calibration.report import write_report
from pask_agent.calibration.runner import TaskRunner
from pask_agent.calibration.selection import (
    by_group,
    cheapest_within,
    decode_candidates,
    dev_decode_tokens,
    floor_costs,
    group_weights,
    prefill_choice,
    prompt_candidates,
    realized_prompt_budgets,
    selection_prompt_budgets,
    sensitivity_json,
)
from pask_agent.calibration.table_build import PromptChoice, assemble_table, mismatch_report
from pask_agent.calibration.worker import PrefillCandidates, WorkerSpec
from pask_agent.errors import ConfigError
from pask_agent.grammars.tags import SPAN_LABELS
from pask_agent.record.traces import Trace
from pask_agent.runtime.models.identity import model_identity


@dataclass(frozen=True)
class CalibrationConfig:
    """Everything one calibration run depends on (the table records it)."""

    traces: tuple[Path, ...]
    dev: tuple[Path, ...]
    out: Path
    model: str = "default"
    # target total B, or several (one prompt plan each); None: stage budgets by α alone
    budget: float | tuple[float, ...] | None = None
    alpha_decode: float = 0.05
    alpha_prefill: float = 0.02
    beta: float = 0.8
    horizon: int = 8
    workers: int = 1
    ray: str | None = None
    checkpoint: Path | None = None
    report: Path | None = None  # default: <out stem>.report.json next to the table
    dtype: str = "bfloat16"
    candidates_per_path: int = 8
    prefill_levels: tuple[float, ...] = (0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5)
    sinks: int = 4
    window: int = 16
    continue_calls_at: float | None = 0.01
    command: str = ""
    progress: bool = True

    def budgets(self) -> tuple[float, ...]:
        """The target budgets, increasing (empty: none)."""
        if self.budget is None:
            return ()
        given = (self.budget,) if isinstance(self.budget, int | float) else self.budget
        return tuple(sorted(set(given)))

    def checkpoint_path(self) -> Path:
        return self.checkpoint or self.out.with_name(self.out.name + ".checkpoint.jsonl")

    def report_path(self) -> Path:
        return self.report or self.out.with_name(self.out.stem + ".report.json")


@dataclass
class CalibrationResult:
    table_path: Path
    report_path: Path
    wall_seconds: float
    budget_decode: float
    budget_prefill: float
    report: dict[str, Any] = field(default_factory=dict)


def check_config(config: CalibrationConfig) -> None:
    """Reject bad input before any model is loaded.

    Raises
    ------
    ConfigError
        A budget outside (0, 1], no development traces, tolerances or β out of range.
    TraceError
        A trace file that is missing, empty or malformed (checked in :func:`load_traces`).
    """
    if config.budget is not None and (
        not config.budgets() or not all(0 < b <= 1 for b in config.budgets())
    ):
        raise ConfigError(f"--budget {config.budget} must be one or more values in (0, 1]")
    if not config.traces:
        raise ConfigError("no calibration traces: pass --traces FILE (record them first)")
    if not config.dev:
        raise ConfigError(
            "no development traces: pass --dev FILE; candidates are selected on traces the "
            "measurements did not see (record them with `pask-agent traces record --split dev`)"
        )
    if not (0 <= config.alpha_decode < 1 and 0 <= config.alpha_prefill < 1):
        raise ConfigError("alpha tolerances must lie in [0, 1)")
    if not 0 < config.beta <= 1 or config.horizon < 0:
        raise ConfigError("need 0 < beta <= 1 and horizon >= 0")
    if config.workers < 1:
        raise ConfigError(f"--workers {config.workers} must be >= 1")


def _threads_per_worker(workers: int) -> int:
    threads = max(1, (os.cpu_count() or 1) // workers)
    limit = os.environ.get("OMP_NUM_THREADS", "")
    return min(threads, int(limit)) if limit.isdigit() and int(limit) > 0 else threads


def _progress(total: int, desc: str, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="trace", disable=not enabled, dynamic_ncols=True)


def calibrate(config: CalibrationConfig) -> CalibrationResult:
    """Run a whole calibration and write the table (and its report)."""
    started = time.perf_counter()
    check_config(config)
    model = model_identity(config.model)
    cal = load_traces(config.traces, model)
    dev = load_traces(config.dev, model)
    spec = WorkerSpec(
        config.model,
        config.dtype,
        config.sinks,
        config.window,
        config.continue_calls_at,
        # One torch thread per worker process: on a busy machine OpenMP threads that spin for
        # each other made a replay 20x slower (measured: 22 s vs 1.1 s for one trace's prompt).
        threads=_threads_per_worker(config.workers),
    )
    from pask_agent.runtime.models.loading import load_tokenizer

    tokenizer = load_tokenizer(config.model)
    replayer = TraceReplayer(tokenizer, model_vocab_size(config.model, tokenizer))
    cal_replayed = [replayer.replay(t, where=w) for w, t in cal]
    dev_replayed = [replayer.replay(t, where=w) for w, t in dev]
    expected = round(float(np.mean([r.output_len for r in dev_replayed])), 2)  # as the table
    keys = DecodeKeys.choose([r for r in cal_replayed if r.ok])
    fingerprint = run_fingerprint(config, cal, dev, keys)
    checkpoint = Checkpoint(config.checkpoint_path(), fingerprint)
    with TaskRunner(spec, workers=config.workers, ray=config.ray) as runner:
        costs, dims = runner.costs(), runner.dims()
        # ---- 1. Runtime-V and Runtime-D on the calibration traces
        measured = _run_stage(
            runner, checkpoint, "measure", cal, config.progress,
            lambda w, t: ("measure", (t, w, keys)),
        )  # fmt: skip
        measurements = [TraceMeasurement.from_json(measured[w]) for w, _ in cal]
        dec = Sensitivity.aggregate(measurements, "decode", keys.size)
        pre = Sensitivity.aggregate(measurements, "prefill", len(SPAN_LABELS))
        dev_tokens = dev_decode_tokens(dev_replayed, keys)
        weights = group_weights([t.group for _, t in dev])
        # ---- 2. decode candidates on the development traces (prompt all H)
        candidates = decode_candidates(dec, dev_tokens, costs, config.candidates_per_path)
        maps = [c.actions for c in candidates]
        decode_eval = _run_stage(
            runner, checkpoint, "dev-decode", dev, config.progress,
            lambda w, t: ("evaluate", (t, w, keys, maps, None, None)),
        )  # fmt: skip
        flips = np.array([decode_eval[w]["decode"] for w, _ in dev], dtype=bool)
        decode_errors = weights @ flips
        chosen = cheapest_within(candidates, decode_errors, config.alpha_decode)
        b_d = min(1.0, round(chosen.cost + 5e-5, 4))  # rounded up: the ledger never starves it
        # ---- 3. prompt candidates (decode all H), at the runtime's own B_P for each budget:
        # one replay of each development trace evaluates every candidate at every budget
        pairs = prompt_candidates(pre, costs)
        budgets = config.budgets()
        if budgets:
            levels = budgets
            b_ps = [
                selection_prompt_budgets(dev_replayed, b, b_d, expected, config, costs.int4_share)
                for b in budgets
            ]
            per_trace = {w: [bp[i] for bp in b_ps] for i, (w, _) in enumerate(dev)}
        else:
            levels = config.prefill_levels
            per_trace = {w: list(levels) for w, _ in dev}
        rows = tuple((p, lv) for p in range(len(pairs)) for lv in range(len(levels)))
        prefill = PrefillCandidates(
            tuple(c.floors for c in pairs), tuple(c.priority for c in pairs), tuple(levels), rows
        )  # fmt: skip
        prefill_eval = _run_stage(
            runner, checkpoint, "dev-prefill", dev, config.progress,
            lambda w, t: ("evaluate", (t, w, keys, [], prefill, per_trace[w])),
        )  # fmt: skip
    pflips = np.array([prefill_eval[w]["prefill"] for w, _ in dev], dtype=bool)
    prefill_errors = weights @ pflips
    realized, targets = realized_prompt_budgets(
        rows, prefill, dev_replayed, [per_trace[w] for w, _ in dev], costs, config
    )
    alternative = np.array([pairs[p].order != "distortion" for p, _ in rows])
    chosen_rows: list[int] = []
    prompt: list[PromptChoice] = []
    for lv in range(len(levels)) if budgets else [None]:
        idx = [i for i, (_, r) in enumerate(rows) if lv is None or r == lv]
        pair_index, level_index = prefill_choice(
            [rows[i] for i in idx], prefill_errors[idx], realized[idx], targets[idx],
            config.alpha_prefill, bool(budgets), list(alternative[idx]),
        )  # fmt: skip
        chosen_rows.append(rows.index((pair_index, level_index)))
        picked = pairs[pair_index]
        b_p = np.mean([per_trace[w][level_index] for w, _ in dev]) if budgets else None
        prompt.append(
            PromptChoice(
                budgets[level_index] if budgets else None,
                float(levels[level_index] if b_p is None else b_p),
                picked.floors,
                picked.priority,
                f"tau={picked.pair[0]:g}/{picked.pair[1]:g} {picked.order} order",
            )
        )
    b_p = prompt[-1].budget_prefill
    # ---- 4. reserve from the reference deficits under the chosen decode floors
    answers = [floor_costs(r, keys, chosen.floors, costs) for r in cal_replayed + dev_replayed]
    reserve_rows = sorted({0.25, 0.33, 0.5, 0.75, 1.0, b_d})
    reserve = fit_reserve(answers, reserve_rows, beta=config.beta, horizon=config.horizon)
    wall = checkpoint.prior_seconds + time.perf_counter() - started
    record = run_record(config, wall)
    record["runs"] = checkpoint.prior_runs + 1
    table = assemble_table(
        model_name=config.model,
        tokenizer=tokenizer,
        costs=costs,
        dims=dims,
        keys=keys,
        decode=dec,
        chosen=chosen,
        prefill=pre,
        prompt=prompt,
        reserve=reserve,
        budget_decode=b_d,
        expected_output_tokens=expected,
        config=config,
        record=record,
    )
    table.save(config.out)
    report = {
        **record,
        "decode_keys": list(keys.keys),
        "cal_traces": len(cal),
        "cal_ok": sum(t.ok for _, t in cal),
        "dev_traces": len(dev),
        "dev_ok": sum(t.ok for _, t in dev),
        "decode": sensitivity_json(dec, keys.keys + ("<default>",)),
        "prefill": sensitivity_json(pre, SPAN_LABELS),
        "decode_candidates": [
            {"name": c.name, "cost": round(c.cost, 4), "dev_error": round(float(e), 4)}
            for c, e in zip(candidates, decode_errors, strict=True)
        ],
        "decode_choice": {"name": chosen.name, "budget_decode": b_d},
        "prefill_candidates": [
            {
                "pair": list(pairs[p].pair),
                "order": pairs[p].order,
                "budget": levels[lv],
                "dev_error": round(float(prefill_errors[i]), 4),
                "realized_b_p": round(float(realized[i]), 4),
                "asked_b_p": round(float(targets[i]), 4),
            }
            for i, (p, lv) in enumerate(rows)
        ],
        "prefill_choice": [
            {
                "budget": c.budget_total,
                "choice": c.name,
                "budget_prefill": round(c.budget_prefill, 4),
                "dev_error": round(float(prefill_errors[i]), 4),
            }
            for c, i in zip(prompt, chosen_rows, strict=True)
        ],
        "dev_groups": dict(sorted(Counter(t.group for _, t in dev).items())),
        "decode_choice_by_group": by_group(dev, flips[:, candidates.index(chosen)]),
        "prefill_choice_by_group": by_group(dev, pflips[:, chosen_rows[-1]]),
        "stable_fraction": round(float(np.mean([m.stable_fraction for m in measurements])), 4),
        "mismatch": {"decode": mismatch_report(dec), "prefill": mismatch_report(pre)},
    }
    write_report(config.report_path(), report)
    return CalibrationResult(config.out, config.report_path(), wall, b_d, b_p, report)


def _run_stage(
    runner: TaskRunner,
    checkpoint: Checkpoint,
    stage: str,
    items: list[tuple[str, Trace]],
    progress: bool,
    task: Callable[[str, Trace], tuple[str, tuple[Any, ...]]],
) -> dict[str, Any]:
    results = {w: checkpoint.done[(stage, w)] for w, _ in items if (stage, w) in checkpoint.done}
    todo = [(w, t) for w, t in items if w not in results]
    with _progress(len(items), stage, progress) as bar:
        bar.update(len(results))
        for where, result in runner.map([task(w, t) for w, t in todo], [w for w, _ in todo]):
            checkpoint.add(stage, where, result)
            results[where] = result
            bar.update(1)
    return results
