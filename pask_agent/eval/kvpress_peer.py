"""NVIDIA kvpress's own presses on our BFCL cases, as a cross-check of our baselines (issue 30).

    make peer-kvpress   # .peers/kvpress/venv: kvpress 0.5.5 (transformers<5.3) + this repo
    python -m pask_agent.eval.kvpress_peer --split test --cases-per-category 50 \\
        --presses snapkv,streaming_llm,expected_attention,kvzip --budgets 0.20,0.33 \\
        --out results/bfcl_kvpress
    python -m pask_agent.eval.bfcl_eval --merge results/bfcl_test50_centered_full \\
        results/bfcl_kvpress --out results/bfcl_kvpress_paired

The presses run in a side venv (``eval/kvpress_worker.py``, driven by subprocess as
``eval/bfcl_official.py`` drives the official harness): the same prompt our runtime builds for
each case (checked: each row records whether its prompt's token ids equal the ones this venv's
``prepare_turn`` gives), the whole prompt prefilled under the press, then greedy decoding under
the same xgrammar tool grammar, ``tool_choice="required"``, parallel calls only in the parallel
categories, as ``eval/bfcl_eval.py`` asks. This process scores the answers with our BFCL
scorer and writes the harness's files (``<out>.jsonl/.json/.md/.png``), one configuration per
press and budget named ``kvpress:<press>`` (``kvpress:full``: no press, the parity row).

**Budget mapping.** kvpress compresses the prompt once, at prefill, and keeps every generated
token. A target ``B`` becomes ``compression_ratio = 1 - B``: each press keeps
``int(L · B)`` of a prompt's ``L`` tokens per layer and KV head (KVzip spreads the same total
unevenly over layers and heads). Measured ``B`` is what our budgets count: KV bytes kept
(prompt entries kept + every generated token) over Full-KV bytes of prompt + answer, both at
BF16, scales none; the prompt's part is the ``B_P`` column, which sits at ``B``, so measured
``B`` lies above the target by the answer's share.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pask_agent.errors import ConfigError, PaskError, exit_code
from pask_agent.eval.bfcl import BfclCase
from pask_agent.eval.bfcl_eval import (
    BfclWorkload,
    add_peer_arguments,
    peer_workload,
    print_summaries,
)
from pask_agent.eval.harness import Config, Measured, Row, Scored
from pask_agent.eval.harness_args import budgets as parse_budgets
from pask_agent.eval.harness_args import names
from pask_agent.eval.harness_report import write_report
from pask_agent.eval.harness_rows import RowFile
from pask_agent.record.provenance import provenance

DEFAULT_VENV = Path(".peers/kvpress/venv")
_INSTALL = "make peer-kvpress  (a side venv with kvpress==0.5.5 and transformers<5.3)"
_ROOT = Path(__file__).resolve().parents[2]

# our name -> kvpress class (None: no press, Full KV through the same path)
PRESSES: dict[str, str | None] = {
    "full": None,
    "snapkv": "SnapKVPress",
    "streaming_llm": "StreamingLLMPress",
    "expected_attention": "ExpectedAttentionPress",
    "kvzip": "KVzipPress",
}
PREFIX = "kvpress:"


def compression_ratio(budget: float) -> float:
    """kvpress's ``compression_ratio`` (share of prompt entries dropped) for a budget ``B``:
    ``1 - B``, so the kept share of the prompt is ``B``.

    Raises
    ------
    ConfigError
        ``B`` outside ``(0, 1]``.
    """
    if not 0 < budget <= 1:
        raise ConfigError(f"budget {budget} must lie in (0, 1] (the kept share of the prompt)")
    return round(1.0 - budget, 12)


@dataclass(frozen=True, slots=True)
class PressRun:
    """One configuration: a kvpress press (by our name) at a budget."""

    press: str
    budget: float

    @property
    def config(self) -> str:
        return PREFIX + self.press

    @property
    def press_class(self) -> str | None:
        return PRESSES[self.press]

    @property
    def compression_ratio(self) -> float:
        return 0.0 if self.press_class is None else compression_ratio(self.budget)


def plan_runs(presses: Sequence[str], budgets: Sequence[float]) -> list[PressRun]:
    """Every press at every budget, budget by budget; ``full`` once, at ``B = 1``.

    Raises
    ------
    ConfigError
        No press or budget, an unknown press (the message lists them), a budget outside (0, 1].
    """
    if not presses or not budgets:
        raise ConfigError("name at least one press and one budget")
    unknown = [p for p in presses if p not in PRESSES]
    if unknown:
        raise ConfigError(f"unknown kvpress press {unknown}; valid: {', '.join(PRESSES)}")
    runs: list[PressRun] = []
    for b in budgets:
        compression_ratio(b)
        for p in presses:
            run = PressRun(p, 1.0 if PRESSES[p] is None else b)
            if run not in runs:
                runs.append(run)
    return runs


def peer_python(venv: Path) -> Path:
    """The side venv's interpreter, with kvpress installed.

    Raises
    ------
    ConfigError
        No such venv, or one without kvpress (the message names the command that makes it).
    """
    python = venv.absolute() / "bin" / "python"
    found = venv / "lib"
    has_kvpress = found.is_dir() and any(found.glob("python3*/site-packages/kvpress"))
    if not python.is_file() or not has_kvpress:
        raise ConfigError(f"no kvpress side venv at {venv}; make it with: {_INSTALL}")
    return python


def usage_of(record: Mapping[str, Any]) -> Any:
    """The worker's record as our ``Usage``: bytes at BF16, K and V, every generated token kept.

    ``kept_prompt_entries`` counts (layer, KV head, token) entries the press left; a Full-KV
    token is ``layers × kv_heads`` entries of ``head_dim × 2 × 2`` bytes.
    """
    from pask_agent.runtime.turns.results import Usage

    per_entry = int(record["head_dim"]) * 2 * 2
    per_token = int(record["layers"]) * int(record["kv_heads"]) * per_entry
    prompt, answer = int(record["prompt_tokens"]), len(record["token_ids"])
    prompt_kv = int(record["kept_prompt_entries"]) * per_entry
    kv, full = prompt_kv + answer * per_token, (prompt + answer) * per_token
    return Usage(
        prompt_tokens=prompt, completion_tokens=answer, prefilled_tokens=prompt, kv_bytes=kv,
        full_kv_bytes=full, measured_b=kv / full, peak_kv_bytes=full,
        ttft_s=float(record["ttft_s"]), tpot_s=float(record["tpot_s"]), prompt_kv_bytes=prompt_kv,
        prompt_full_kv_bytes=prompt * per_token,
    )  # fmt: skip


def result_of(case: BfclCase, record: Mapping[str, Any]) -> Any:
    """The answer as our runtime returns it (``ChatResult``): calls parsed from the text and
    checked against their schemas as ``runtime/turns/turn_output.chat_result`` does.

    Raises
    ------
    ToolCallError
        A call breaks its tool's schema (the row is then invalid, as in our harness).
    """
    from pask_agent.runtime.turns.outputs import parse_tool_calls
    from pask_agent.runtime.turns.results import ChatResult
    from pask_agent.runtime.turns.tool_validation import checked_tool_calls

    specs = case.tools()
    calls = checked_tool_calls(parse_tool_calls(record["text"], specs), specs)
    reason = "tool_calls" if calls else str(record["reason"])
    return ChatResult(record["text"], calls, usage_of(record), reason, tuple(record["token_ids"]))


@dataclass(frozen=True)
class KvpressWorkload(BfclWorkload):
    """``BfclWorkload``'s cases, groups and scorer; the answers come from the side venv."""

    title: ClassVar[str] = "BFCL non-live under NVIDIA kvpress's presses (side venv)"

    def note(self, cases: int) -> str:
        return (
            f"{cases} BFCL v4 non-live cases ({self.per_category or 'all'} per category, split "
            f"{self.split!r}), greedy under our tool grammar, max_new_tokens="
            f"{self.max_new_tokens}, official AST checker. Presses from NVIDIA kvpress in "
            "its side venv: the prompt prefilled once under the press at compression_ratio "
            "= 1 - B (B_P = kept prompt entries / prompt entries), every generated token kept; "
            "measured B = Σ kept KV bytes / Σ Full-KV bytes (prompt + answer, BF16). "
            "kvpress:full is the same path without a press."
        )


def score_record(
    workload: KvpressWorkload, case: BfclCase, run: PressRun, record: Mapping[str, Any],
    ours: str | None,
) -> Scored:  # fmt: skip
    """A worker record scored by our BFCL scorer, with the peer's fields added to the row."""
    extra = {
        "press": run.press_class or "none", "compression_ratio": run.compression_ratio,
        "prompt_matches_runtime": ours is not None and ours == record.get("prompt_sha256"),
    }  # fmt: skip
    if "error" in record:
        detail = {**workload.failed_detail, **extra}
        return Scored(False, False, str(record["error"]), Measured.values(), detail)
    try:
        scored = workload.score(case, (result_of(case, record), None))
    except PaskError as exc:  # a call that breaks its schema: invalid, as run_cases records it
        error = f"{type(exc).__name__}: {str(exc)[:300]}"
        measured = Measured.of([usage_of(record)])
        detail = {"calls": [], "text": record["text"], "finish_reason": record["reason"]}
        return Scored(False, False, error, measured, {**detail, **extra})
    return Scored(
        scored.correct, scored.valid_call, scored.error, scored.measured,
        {**scored.detail, **extra},
    )  # fmt: skip


def runtime_prompts(cases: Sequence[BfclCase], model: str) -> dict[str, str]:
    """Per case, the digest of the prompt ids our runtime builds (``prepare_turn``, this venv)."""
    from pask_agent.eval.kvpress_worker import prompt_digest
    from pask_agent.runtime.models.loading import load_tokenizer, resolve_model_dir
    from pask_agent.runtime.turns.outputs import OutputCompiler
    from pask_agent.runtime.turns.prompting import prepare_turn

    tokenizer = load_tokenizer(model)
    config = json.loads((resolve_model_dir(model) / "config.json").read_text())
    outputs = OutputCompiler(tokenizer, int(config["vocab_size"]))
    out = {}
    for case in cases:
        r = case.request()
        turn = prepare_turn(
            tokenizer, outputs, r["messages"], r["tools"], r["tool_choice"],
            r["parallel_tool_calls"], labels=False,
        )  # fmt: skip
        out[case.id] = prompt_digest(turn.prompt_ids)
    return out


def peer_versions(python: Path) -> str:
    code = "import importlib.metadata as m; print(m.version('kvpress'), m.version('transformers'))"
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    kvpress, transformers = done.stdout.split()
    return f"kvpress=={kvpress}, transformers=={transformers}"


def worker_records(
    python: Path, job: Mapping[str, Any], log_path: Path
) -> Any:  # an iterator of dicts
    """Run the worker on ``job`` and yield its records as it writes them.

    Raises
    ------
    PaskError
        The worker exited with an error (the rows it finished are kept; rerun to resume).
    """
    env = os.environ | {
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",  # never reach for the Hub
        "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="kvpress-job-") as tmp:
        job_file = Path(tmp) / "job.json"
        job_file.write_text(json.dumps(job), encoding="utf-8")
        cmd = [str(python), "-m", "pask_agent.eval.kvpress_worker", str(job_file)]
        with log_path.open("w", encoding="utf-8") as log, subprocess.Popen(
            cmd, cwd=_ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True
        ) as proc:  # fmt: skip
            for line in proc.stdout or ():
                if line.strip():
                    yield json.loads(line)
        if proc.returncode != 0:
            tail = log_path.read_text(encoding="utf-8")[-2000:]
            raise PaskError(f"the kvpress worker exited {proc.returncode} ({log_path}): {tail}")


def worker_job(workload: Any, model_dir: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """What the side venv's worker is sent: the model folder, the case selection (so its cases
    are the ones scored here, ``kvpress_worker.job_cases``) and the runs still to do."""
    return {
        "model_dir": model_dir, "split": workload.split,
        "per_category": workload.per_category, "categories": list(workload.categories),
        "skip_per_category": workload.skip_per_category,
        "max_new_tokens": workload.max_new_tokens, "runs": runs,
    }  # fmt: skip


def evaluate(
    workload: KvpressWorkload,
    runs: Sequence[PressRun],
    out: Path,
    *,
    venv: Path = DEFAULT_VENV,
    model: str = "default",
    references: Sequence[str] = ("full", "kvpress:full"),
    restart: bool = False,
    log: Callable[[str], None] = print,
) -> list[Any]:
    """Run every press configuration through the side venv, score and write the files
    (resuming the rows an earlier run of the same settings left in ``<out>.jsonl``)."""
    from pask_agent.eval.harness_report import summarize_rows
    from pask_agent.runtime.models.loading import resolve_model_dir

    python = peer_python(venv)
    cases = {c.id: c for c in workload.cases()}
    settings = {"workload": workload.name, "model": model, "peer_versions": peer_versions(python)}
    settings |= workload.settings()
    started = provenance()
    file = RowFile(out.with_suffix(".jsonl"), workload)
    keys = [(r.config, r.budget, cid) for r in runs for cid in cases]
    done = {} if restart else file.resume(settings, set(keys))
    note = workload.note(len(cases))

    def write() -> list[Any]:
        rows = [done[k] for k in keys if k in done]
        file.rewrite(rows)
        return write_report(out, workload, rows, started, settings, references, note)

    write()
    todo = [
        {"press": r.press, "budget": r.budget, "press_class": r.press_class,
         "compression_ratio": r.compression_ratio,
         "case_ids": [c for c in cases if (r.config, r.budget, c) not in done]}
        for r in runs
    ]  # fmt: skip
    todo = [t for t in todo if t["case_ids"]]
    if todo:
        ours = runtime_prompts(list(cases.values()), model)
        job = worker_job(workload, str(resolve_model_dir(model)), todo)
        by_key = {(r.press, r.budget): r for r in runs}
        start = time.perf_counter()
        for record in worker_records(python, job, out.with_suffix(".worker.log")):
            run, case = by_key[(record["press"], record["budget"])], cases[record["id"]]
            scored = score_record(workload, case, run, record, ours.get(case.id))
            row = Row.of(
                workload, case, run.config, Config(run.config, run.budget), scored,
                float(record.get("seconds", 0.0)), started,
            )  # fmt: skip
            done[row.key] = row
            file.append(row)
            mark = "ok " if row.correct else "BAD"
            log(f"[{row.label}] {row.id}: {mark} B={row.measured.measured_b:.3f} {row.error}")
        answers = sum(len(t["case_ids"]) for t in todo)
        log(f"{answers} answers in {time.perf_counter() - start:.0f}s")
    write()
    return summarize_rows([done[k] for k in keys if k in done])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pask_agent.eval.kvpress_peer", description=__doc__.splitlines()[0]
    )
    add_peer_arguments(p, "results/bfcl_kvpress")
    p.add_argument("--presses", default="snapkv,streaming_llm,expected_attention,kvzip",
                   help=f"comma-separated, of: {', '.join(PRESSES)}")  # fmt: skip
    p.add_argument("--budgets", default="0.33", help="comma-separated B in (0, 1]")
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    args = p.parse_args(argv)

    def run() -> int:
        runs = plan_runs(names(args.presses), parse_budgets(args.budgets))
        peer_python(args.venv)  # before any case is read
        workload = peer_workload(KvpressWorkload, args)
        summaries = evaluate(
            workload, runs, args.out, venv=args.venv, model=args.model, restart=args.restart
        )
        print_summaries(summaries, args.out)
        return 0

    return exit_code(run)


if __name__ == "__main__":
    raise SystemExit(main())
