"""Where a decode step's time goes: ``Engine.step`` at concurrency c under ``torch.profiler``.

``c`` requests with prompts of ``prompt_tokens`` tokens are prefilled, then ``steps`` decode
steps (every request adds one token) are timed plain and profiled. Each phase of the step is
labelled with ``record_function`` by wrapping the engine's own parts on this instance only
(store bookkeeping, the model forward and within it attention and the store write, logit
masking, sampling/tagging/policy), so the table names the code to change. Writes JSON and
Markdown with the command, commit and machine (``provenance.py``).

Run: ``python -m pask_agent.eval.step_profile --concurrency 1,8 --out results/step_profile``
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from pask_agent.kernels.attention import ATTENTION_BACKENDS
from pask_agent.policy import pask  # noqa: F401 - registers the policies
from pask_agent.policy.base import PolicyEnv
from pask_agent.policy.registry import get_policy
from pask_agent.record.provenance import provenance
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.engine import Engine
from pask_agent.runtime.models.loading import load_model
from pask_agent.runtime.models.weight_formats import DEFAULT_WEIGHTS, WEIGHT_FORMATS
from pask_agent.runtime.requests import Request, SamplingParams
from pask_agent.runtime.turns.outputs import TEXT

PHASES = {
    "store.begin_step": "store bookkeeping: place new tokens, build slot views",
    "store.end_step": "store bookkeeping: settle tokens that left the window",
    "model.forward": "model forward (all layers, lm_head)",
    "store.attend": "attention over the store (inside the forward)",
    "store.write": "K/V write into the pools (inside the forward)",
    "masks.apply": "logit masks",
    "engine.advance": "sample, tag, policy on_token, schedule (per request)",
}


def _label(obj: Any, attr: str, name: str) -> None:
    fn: Callable[..., Any] = getattr(obj, attr)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with record_function(name):
            return fn(*args, **kwargs)

    setattr(obj, attr, wrapped)


def _engine(
    loaded: Any,
    c: int,
    prompt_tokens: int,
    policy: str,
    budget: float,
    new_tokens: int,
    backend: str = "auto",
) -> Engine:
    """An engine whose ``c`` requests have all been admitted and prefilled, each with room for
    ``new_tokens`` more (asking for more than the steps use would reserve KV the default
    capacity may not have for all ``c`` at once, and the last ones would wait)."""
    config = RuntimeConfig(
        prefill_chunk_tokens=c * prompt_tokens,
        max_batch=c,
        attention_backend=backend,
        weights=loaded.weights,
    )
    engine = Engine(loaded, config)
    pol = get_policy(policy)()
    cfg = engine.config
    for i in range(c):
        ids = [(7 * i + 13 * j) % 5000 + 200 for j in range(prompt_tokens)]
        session = pol.start(PolicyEnv(engine.costs, cfg.sinks, cfg.window, budget))
        params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
        engine.inbox.append(Request(ids, None, TEXT, params, engine.new_sequence(session), pol))
    engine.step()  # admits and prefills every request in one chunk
    if engine.inbox or len(engine.live) != c:
        raise RuntimeError(f"only {len(engine.live)} of {c} requests were admitted at once")
    while any(r.prefill_pos < len(r.prompt_ids) for r in engine.live):
        engine.step()
    return engine


def measure(
    loaded: Any,
    c: int,
    prompt_tokens: int,
    steps: int,
    policy: str,
    budget: float,
    backend: str = "auto",
) -> dict[str, Any]:
    engine = _engine(loaded, c, prompt_tokens, policy, budget, 2 * steps + 8, backend)
    for _ in range(2):  # warm
        engine.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    plain = (time.perf_counter() - t0) / steps
    store = engine.store
    _label(store, "begin_step", "store.begin_step")
    _label(store, "end_step", "store.end_step")
    _label(store, "attend", "store.attend")
    _label(store, "write", "store.write")
    _label(engine, "forward", "model.forward")
    _label(engine.masks, "apply", "masks.apply")
    _label(engine, "_advance", "engine.advance")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("engine.step"):
            for _ in range(steps):
                engine.step()
    events = prof.key_averages()
    by_name = {e.key: e for e in events}
    total_us = by_name["engine.step"].cpu_time_total / steps
    phases = {
        name: round(by_name[name].cpu_time_total / steps / 1000, 3) if name in by_name else 0.0
        for name in PHASES
    }
    ops = sorted(
        (e for e in events if not e.key.startswith(("engine.", "store.", "model.", "masks."))),
        key=lambda e: e.self_cpu_time_total,
        reverse=True,
    )[:12]
    return {
        "concurrency": c,
        "prompt_tokens": prompt_tokens,
        "policy": policy,
        "attention_backend": backend,
        "steps": steps,
        "history_tokens": store.length(engine.live[0].state.seq_id),
        "step_ms_plain": round(plain * 1000, 2),
        "step_ms_profiled": round(total_us / 1000, 2),
        "decode_tok_s": round(c / plain, 2),
        "phases_ms": phases,
        "top_ops_self_ms": {e.key: round(e.self_cpu_time_total / steps / 1000, 3) for e in ops},
    }


def write(rows: list[dict[str, Any]], out: Path, meta: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [
        "# Decode step profile (torch.profiler, CPU)",
        "",
        f"Command: `{meta['command']}`  ",
        f"Commit: `{meta['git_commit']}`  ",
        f"Machine: {meta['machine']}, torch threads {meta['threads']}  ",
        meta["note"],
        "",
    ]
    base = next((r for r in rows if r["concurrency"] == 1), None)
    for r in rows:
        lines += [
            f"## c = {r['concurrency']}, {r['prompt_tokens']}-token prompts, policy "
            f"{r['policy']} ({r['history_tokens']} tokens of history at the end)",
            "",
            f"Step {r['step_ms_plain']} ms plain ({r['decode_tok_s']} tok/s aggregate"
            + (
                f", {r['decode_tok_s'] / base['decode_tok_s']:.2f}x c = 1"
                if base and r is not base
                else ""
            )
            + f"); {r['step_ms_profiled']} ms under the profiler.",
            "",
            "| phase | ms / step | % of step |",
            "|---|---|---|",
        ]
        for name, ms in r["phases_ms"].items():
            pct = 100 * ms / r["step_ms_profiled"]
            lines.append(f"| {PHASES[name]} (`{name}`) | {ms} | {pct:.1f} |")
        lines += ["", "| top torch ops (self CPU) | ms / step |", "|---|---|"]
        lines += [f"| `{k}` | {v} |" for k, v in r["top_ops_self_ms"].items()]
        lines.append("")
    out.with_suffix(".md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--policy", default="full")
    p.add_argument("--budget", type=float, default=0.33)
    p.add_argument("--out", default="results/step_profile")
    p.add_argument("--note", default="", help="a line for the report (what code this measures)")
    p.add_argument("--attention-backend", default="auto", choices=ATTENTION_BACKENDS)
    p.add_argument("--weights", default=DEFAULT_WEIGHTS, choices=WEIGHT_FORMATS)
    args = p.parse_args(argv)
    loaded = load_model(args.model, weights=args.weights)
    rows = [
        measure(
            loaded,
            int(c),
            args.prompt_tokens,
            args.steps,
            args.policy,
            args.budget,
            args.attention_backend,
        )  # fmt: skip
        for c in args.concurrency.split(",")
    ]
    meta = {**provenance(), "threads": torch.get_num_threads(), "note": args.note}
    write(rows, Path(args.out), meta)
    print(Path(args.out).with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
