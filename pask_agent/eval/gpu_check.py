"""GPU readiness check (issue 32, item 4): kernel parity at serving lengths, then the serving
bench on a random-weight Qwen3-4B-shaped model, Full KV against PASK at one KV capacity.

Run from a checkout with ``python3 scripts/gpu_check.py --out DIR`` (``--smoke`` for the tiny
CPU version CI runs). No weights, tokenizer files or grammar packages travel: the model is built
from a config (``random_model.py``) and the engine is driven at token level (random prompt ids,
plain greedy decoding, ``Engine.step`` as ``eval/bench.py`` drives it), so neither xgrammar nor
jsonschema is imported.

Stages run one after the other and each records its own result or its error; every case
inside a stage does too, and the files are rewritten after each stage, so a serving failure
(or a kill) never loses the kernel numbers. A deadline skips what would not finish in time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from pask_agent.eval.gpu_check_report import markdown, source_digest, summary
from pask_agent.eval.kernel_parity import LAYOUTS, HeadLayout, attention_parity, int4_parity
from pask_agent.eval.random_model import QWEN3_4B, SMOKE, ModelShape
from pask_agent.record.provenance import provenance

SCHEMA = 1


@dataclass(frozen=True, slots=True)
class CheckSize:
    """How much a run does: kernel lengths and the serving grid."""

    shape: ModelShape
    kernel_tokens: tuple[int, ...]
    chunk: int  # prefill queries in each attention case (> 8: the reference's looped path)
    repeats: int  # timed calls per kernel
    prompt_tokens: int
    new_tokens: int
    capacity_full_requests: int  # the KV capacity: exactly this many Full-KV requests
    max_concurrency: int  # the most requests a level queues (a policy's fit, capped)


GPU_SIZE = CheckSize(QWEN3_4B, (1024, 4096, 16384, 32768), 64, 10, 2048, 128, 4, 16)
SMOKE_SIZE = CheckSize(SMOKE, (256,), 9, 1, 160, 8, 2, 4)
POLICIES = ("full", "pask")


class Deadline:
    """Seconds left of the run's allowance; work that starts after it is skipped."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def passed(self) -> bool:
        return time.monotonic() >= self.end


def _error(exc: BaseException) -> dict[str, Any]:
    return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": _tail()}


def _tail() -> str:
    return traceback.format_exc()[-3000:]


def _case(
    run: Callable[[], dict[str, Any]], label: dict[str, Any], deadline: Deadline
) -> dict[str, Any]:
    """One case: its row, its error next to what it was, or that the deadline skipped it."""
    if deadline.passed():
        return {**label, "ok": False, "error": "skipped: past the deadline (--max-seconds)"}
    try:
        return run()
    except Exception as exc:  # noqa: BLE001 - recorded in the row; the next case still runs
        return {**label, **_error(exc)}


def environment(device: torch.device) -> dict[str, Any]:
    """Versions and the accelerator: what a number in this file was measured with."""
    import transformers
    import triton

    env: dict[str, Any] = {
        "ok": True,
        "device": str(device),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
        "cuda_available": torch.cuda.is_available(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env |= {
            "gpu": props.name,
            "gpu_memory_bytes": props.total_memory,
            "compute_capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        }
    return env


def kernel_stage(size: CheckSize, device: torch.device, deadline: Deadline) -> dict[str, Any]:
    """INT4 quantize/dequantize and mixed attention, Triton against the torch reference."""
    shape = size.shape
    heads = HeadLayout(shape.num_attention_heads, shape.num_key_value_heads, shape.head_dim)
    int4_rows, attention_rows = [], []
    for tokens in size.kernel_tokens:
        int4_rows.append(_case(
            partial(int4_parity, tokens, heads, device, repeats=size.repeats),
            {"rows": tokens}, deadline,
        ))  # fmt: skip
        for layout in LAYOUTS:
            attention_rows.append(_case(
                partial(attention_parity, tokens, layout, heads, device, chunk=size.chunk,
                        repeats=size.repeats),
                {"tokens": tokens, "layout": layout}, deadline,
            ))  # fmt: skip
        if device.type == "cuda":
            torch.cuda.empty_cache()
    rows = int4_rows + attention_rows
    return {
        "ok": all(r["ok"] for r in rows),
        "mode": "compiled" if device.type == "cuda" else "interpreted",
        "heads": {"n_qh": heads.n_qh, "n_kvh": heads.n_kvh, "dim": heads.dim},
        "chunk": size.chunk,
        "repeats": size.repeats,
        "int4": int4_rows,
        "attention": attention_rows,
    }


def serving_stage(size: CheckSize, device: torch.device, deadline: Deadline) -> dict[str, Any]:
    """Full KV and PASK (its table's default budget) at one KV capacity, through the engine:
    the same requests queued for both, so the capacity decides how many run at once."""
    from pask_agent.eval.bench import Prompt, measure_bandwidth, run_level
    from pask_agent.eval.random_model import random_model
    from pask_agent.policy.costs import PayloadCosts
    from pask_agent.runtime.config import RuntimeConfig
    from pask_agent.runtime.engine import Engine
    from pask_agent.runtime.models.cpu_linear import step_weight_bytes
    from pask_agent.runtime.turns.constraint import OutputSpec

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    loaded = random_model(size.shape, device=str(device), dtype=dtype)
    build_s = time.perf_counter() - t0
    shape = size.shape
    costs = PayloadCosts.from_dims(
        shape.num_hidden_layers, shape.num_key_value_heads, shape.head_dim
    )
    capacity = (
        size.capacity_full_requests
        * (size.prompt_tokens + size.new_tokens)
        * costs.full_bytes_per_token
    )
    widest = size.max_concurrency
    # oneDNN linear layers are a CPU speed-up that costs tiny smoke layers more than it saves
    config = RuntimeConfig(
        max_batch=widest, kv_capacity_bytes=capacity, onednn_linear=False, device=str(device)
    )
    engine = Engine(loaded, config)
    weights = step_weight_bytes(loaded.model)
    bandwidth = measure_bandwidth(2048 if device.type == "cuda" else 64, device=str(device))
    common = {"weights": weights, "bandwidth": bandwidth}
    gen = torch.Generator().manual_seed(0)
    text = OutputSpec("text", None)  # free text: no grammar, no tagger

    def prompts(n_tokens: int, count: int) -> list[Prompt]:
        ids = torch.randint(0, 256, (count, n_tokens), generator=gen).tolist()
        return [Prompt(row, None, text) for row in ids]

    t0 = time.perf_counter()
    for policy in POLICIES:  # compiles the Triton kernels each policy's steps launch
        run_level(engine, prompts(32, 2), policy, None, 2, **common)
    warm_s = time.perf_counter() - t0
    queued = prompts(size.prompt_tokens, widest)
    # first each policy with as many conversations as the capacity holds at once (the
    # fixed-capacity comparison), then each alone (single-stream TPOT)
    fits = {p: min(widest, _fits(engine, p, size)) for p in POLICIES}
    levels = [(p, fits[p]) for p in POLICIES] + [(p, 1) for p in POLICIES]
    rows = [
        _case(partial(_level, engine, queued[:c], policy, size.new_tokens, common),
              {"policy": policy, "concurrency": c}, deadline)
        for policy, c in levels
    ]  # fmt: skip
    return {
        "ok": all(r["ok"] for r in rows),
        "model": shape.name,
        "model_config": shape.config_kwargs(),
        "dtype": str(dtype).removeprefix("torch."),
        "build_s": round(build_s, 2),
        "warmup_s": round(warm_s, 2),
        "attention_backend": engine.config.attention_backend,
        "kv_capacity_bytes": capacity,
        "capacity_full_requests": size.capacity_full_requests,
        "full_kv_bytes_per_token": costs.full_bytes_per_token,
        "prompt_tokens": size.prompt_tokens,
        "new_tokens": size.new_tokens,
        "prompt_labels": "all protected_content (plain prompts, as in results/bench.md)",
        "weights_bytes": weights,
        "bandwidth_bytes_per_s": round(bandwidth),
        "rows": rows,
    }


def _fits(engine: Any, policy: str, size: CheckSize) -> int:
    """How many requests of this size the engine's capacity admits at once under ``policy``
    (what admission reserves for them: ``runtime/admission.py``)."""
    from pask_agent.policy.base import PolicyEnv
    from pask_agent.policy.registry import get_policy
    from pask_agent.runtime.memory.admission import plan_rows, requests_that_fit

    cfg = engine.config
    session = get_policy(policy)().start(PolicyEnv(engine.costs, cfg.sinks, cfg.window, None))
    labels = ["protected_content"] * size.prompt_tokens
    rows, _ = plan_rows(session, labels, size.new_tokens, engine.costs, cfg.sinks, cfg.window)
    return requests_that_fit(engine.capacity_bytes, engine.layout, rows)


def _level(
    engine: Any, prompts: list[Any], policy: str, new_tokens: int, common: dict[str, Any]
) -> dict[str, Any]:
    """One bench row (``eval/bench.run_level``) plus the GPU's peak memory during it."""
    from pask_agent.eval.bench import run_level

    cuda = engine.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(engine.device)
        torch.cuda.reset_peak_memory_stats(engine.device)
    row = run_level(engine, prompts, policy, None, new_tokens, **common)
    engine.store.audit()  # every slot free again or held once: the run left the pools sound
    peak = torch.cuda.max_memory_allocated(engine.device) if cuda else None
    reserved = torch.cuda.max_memory_reserved(engine.device) if cuda else None
    return {
        **row,
        "ok": True,
        "gpu_peak_allocated_bytes": peak,
        "gpu_peak_reserved_bytes": reserved,
    }


def run_check(args: argparse.Namespace, argv: list[str] | None = None) -> dict[str, Any]:
    """Every stage in turn; the document (also written to ``args.out`` after each stage)."""
    start = time.perf_counter()
    device = torch.device(args.device)
    size = SMOKE_SIZE if args.smoke else GPU_SIZE
    deadline = Deadline(args.max_seconds)
    prov = provenance(argv)
    commit = prov["git_commit"]
    # None: no git history here (a copied tree); source_sha256 still names the code
    dirty = None if commit.startswith("unknown") else commit.endswith("+dirty")
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "smoke": bool(args.smoke),
        **prov,
        "dirty": dirty,
        "source_sha256": source_digest(),
        "stages": {},
    }
    stages: dict[str, Callable[[], dict[str, Any]]] = {
        "environment": lambda: environment(device),
        "kernels": lambda: kernel_stage(size, device, deadline),
        "serving": lambda: serving_stage(size, device, deadline),
    }
    try:
        for name in ["environment", *args.stages]:
            t0 = time.perf_counter()
            try:
                result = stages[name]()
            except Exception as exc:  # noqa: BLE001 - recorded; the next stage still runs
                result = _error(exc)
            result["seconds"] = round(time.perf_counter() - t0, 2)
            doc["stages"][name] = result
            doc["wall_s"] = round(time.perf_counter() - start, 2)
            write(doc, args.out)
    finally:  # a SIGTERM (timeout) or ^C: what finished is still written
        doc["wall_s"] = round(time.perf_counter() - start, 2)
        doc["ok"] = all(s.get("ok") for s in doc["stages"].values()) and all(
            name in doc["stages"] for name in args.stages
        )
        write(doc, args.out)
    return doc


def write(doc: dict[str, Any], out: str | None) -> None:
    if not out:
        return
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpu_check.json").write_text(json.dumps(doc, indent=1) + "\n")
    (folder / "gpu_check.md").write_text(markdown(doc))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny model and lengths (CPU, CI)")
    p.add_argument("--out", default=None, help="folder for gpu_check.json and gpu_check.md")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--stages", default="kernels,serving", help="comma-separated: kernels, serving")
    p.add_argument(
        "--max-seconds",
        type=float,
        default=420.0,
        help="cases and bench levels that would start later are skipped (recorded as such)",
    )
    args = p.parse_args(argv)
    args.stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = set(args.stages) - {"kernels", "serving"}
    if unknown:
        p.error(f"unknown stages {sorted(unknown)}; valid: kernels, serving")
    if torch.device(args.device).type == "cpu" and not args.smoke:
        p.error("on a CPU the Triton kernels run interpreted: use --smoke (sizes for a GPU)")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch sees no CUDA device; use --smoke --device cpu")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the check, print the one JSON summary; exit 0 when every stage passed."""
    import sys

    args = parse_args(argv)
    if torch.device(args.device).type == "cpu":
        # before any kernel module is imported: Triton decorates kernels for the interpreter
        os.environ.setdefault("TRITON_INTERPRET", "1")
    doc = run_check(args, None if argv is None else [sys.argv[0], *argv])
    print(json.dumps(summary(doc)))
    return 0 if doc["ok"] else 1
