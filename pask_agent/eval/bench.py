"""Serving benchmark: policies side by side, speed and memory, at several concurrencies.

For each prompt size, policy and concurrency ``c``, ``c`` requests with rendered chat prompts
of exactly ``prompt_tokens`` tokens (labelled as the runtime labels them) are queued at once
and forced to generate ``new_tokens`` tokens each (stop tokens masked). The bench drives
``Engine.step``, the one loop the async ``Runtime`` runs in its worker, and times each step.

What a row measures (one row per policy × prompt size × concurrency):

* ``decode_tok_s``: tokens sampled in *decode steps* (every row feeds one token) over those
  steps' wall time, so prefill does not dilute it; ``e2e_tok_s``: all generated tokens over the
  whole wall time, prefill included. ``ttft_s``/``tpot_s``: request means (``Finished``).
* ``decode_rows_mean``: requests per decode step. Prefill interleaves with decoding, so with
  long prompts the first requests can finish before the last ones are prefilled and decode
  steps run fewer rows than ``c``; ``full_batch_tok_s`` counts only the ``full_batch_steps``
  in which all ``c`` requests decoded together: what a server holding ``c`` conversations in
  its memory decodes per second (``--schedule prefill_first`` prefills every queued prompt
  before decoding starts, so every decode step is full until the requests end).
* ``admitted_max``: the most requests running at once: under ``kv_capacity_bytes`` the
  engine admits what the policies' demands fit (``runtime/memory/admission.py``); ``fits_at_once``:
  how many requests of this demand the capacity admits at once, however many are queued.
* ``peak_kv_bytes``: the store's high-water mark of live payload inside the steps;
  ``allocated_kv_bytes``: the preallocated pools; ``rss_peak_bytes``: the process's resident
  memory, sampled after every step (the largest sample).
* ``host_overhead_pct``: in decode steps, the step's wall time outside the model forward
  (admission, store bookkeeping, masks, sampling, tagger, policy hooks) over the step's time;
  ``host_ms_per_step``: the same time in milliseconds per decode step (flat in history when
  the bookkeeping does not grow with it).
* ``roofline_pct``: in decode steps, the time the step's unavoidable memory traffic takes, the
  model's weights plus the retained KV payload at the bandwidth the bench measures itself
  (``measure_bandwidth``), over the step's time: 100 % is a step that only streams memory.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from pask_agent.errors import ConfigError
from pask_agent.kernels.attention import ATTENTION_BACKENDS
from pask_agent.policy import pask  # noqa: F401 - registers the policies
from pask_agent.policy.base import PolicyEnv
from pask_agent.policy.registry import get_policy
from pask_agent.record.provenance import provenance
from pask_agent.runtime.config import SCHEDULES, RuntimeConfig
from pask_agent.runtime.engine import Engine
from pask_agent.runtime.memory.admission import requests_that_fit
from pask_agent.runtime.models.cpu_linear import step_weight_bytes
from pask_agent.runtime.models.loading import LoadedModel, load_model
from pask_agent.runtime.models.weight_formats import (
    DEFAULT_WEIGHTS,
    WEIGHT_FORMATS,
    weight_formats,
)
from pask_agent.runtime.requests import Failed, Request, SamplingParams
from pask_agent.runtime.turns.results import Delta, Finished

if TYPE_CHECKING:  # imported by bench(): run_level drives an Engine without the async Runtime
    from pask_agent.runtime.runtime import Runtime

FILLER = (
    "The agent reads a long tool catalogue before it answers. Each tool has a name, a "
    "description and typed parameters with enums and defaults. "
)


@dataclass(frozen=True, slots=True)
class Prompt:
    ids: list[int]
    labels: list[str] | None
    spec: Any


def make_prompts(rt: Runtime, n_tokens: int, count: int) -> list[Prompt]:
    """``count`` distinct user turns whose rendered chat prompts are exactly ``n_tokens``."""
    out = []
    for salt in range(count):
        body = f"Request {salt}. " + FILLER * (n_tokens // 10 + 4)
        words = rt.tokenizer(body, add_special_tokens=False)["input_ids"]
        keep = n_tokens
        for _ in range(8):  # the template's wrapper: trim the body until the total is exact
            text = rt.tokenizer.decode(words[: max(1, keep)])
            ids, labels, spec = rt.prepare(
                [{"role": "user", "content": text}], None, "auto", True, labels=True
            )
            if len(ids) == n_tokens:
                break
            keep -= len(ids) - n_tokens
        if len(ids) != n_tokens:
            raise ValueError(f"could not render a prompt of exactly {n_tokens} tokens")
        out.append(Prompt(ids, labels, spec))
    return out


def measure_bandwidth(mib: int = 512, repeats: int = 5, device: str = "cpu") -> float:
    """Bytes/s this process reads from memory on ``device``: the best of ``repeats`` sums over
    a fp32 tensor far larger than the caches (on a CPU with the threads torch is set to use;
    on a GPU each sum is waited for)."""
    x = torch.ones(mib << 18, device=device)
    wait = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    x.sum()  # a GPU's first launch pays for its context and kernel loading
    best = float("inf")
    for _ in range(repeats):
        wait()
        t = time.perf_counter()
        x.sum()
        wait()
        best = min(best, time.perf_counter() - t)
    return x.numel() * x.element_size() / best


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _ForwardClock:
    """Wall time of the engine's model forward and its token count: ``engine.forward`` is
    wrapped on this engine instance until ``close``."""

    def __init__(self, engine: Engine) -> None:
        self.seconds, self.tokens = 0.0, 0
        self._engine, self._forward = engine, engine.forward
        engine.forward = self._timed

    def _timed(self, step: Any, input_ids: torch.Tensor) -> torch.Tensor:
        self.tokens = int(input_ids.numel())
        t = time.perf_counter()
        logits = self._forward(step, input_ids)
        if logits.is_cuda:  # the forward returns before a GPU has run it
            torch.cuda.synchronize(logits.device)
        self.seconds += time.perf_counter() - t
        return logits

    def close(self) -> None:
        self._engine.forward = self._forward


def run_level(
    engine: Engine,
    prompts: Sequence[Prompt],
    policy: str,
    budget: float | None,
    new_tokens: int,
    *,
    weights: int,
    bandwidth: float,
) -> dict[str, Any]:
    """Serve ``len(prompts)`` requests queued at once; one row of measurements."""
    pol, cfg, store = get_policy(policy)(), engine.config, engine.store
    env = PolicyEnv(engine.costs, cfg.sinks, cfg.window, budget)
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    store.peak_bytes, sheds = 0, engine.shed_events
    requests = [
        Request(p.ids, p.labels, p.spec, params, engine.new_sequence(pol.start(env)), pol)
        for p in prompts
    ]
    clock = _ForwardClock(engine)
    ends: list[Finished] = []
    admitted = rss = steps = full_steps = 0
    decode_s = decode_tokens = host_s = roof_s = full_s = 0.0
    start = time.perf_counter()
    engine.inbox.extend(requests)
    try:
        while engine.has_work():
            clock.seconds = 0.0
            t = time.perf_counter()
            events = engine.step()
            dt = time.perf_counter() - t
            sampled = sum(len(e.token_ids) for _, e in events if isinstance(e, Delta))
            done = [e for _, e in events if isinstance(e, Finished)]
            for _, e in events:
                if isinstance(e, Failed):
                    raise e.error
            ends += done
            admitted = max(admitted, len(engine.live) + len(done))
            rss = max(rss, _rss_bytes())
            if sampled and clock.tokens == sampled:  # every row fed one token: a decode step
                steps += 1
                decode_s, decode_tokens = decode_s + dt, decode_tokens + sampled
                host_s += dt - clock.seconds
                roof_s += (weights + store.live_bytes()) / bandwidth
                if sampled == len(prompts):  # every request of the level in one step
                    full_steps, full_s = full_steps + 1, full_s + dt
    finally:
        clock.close()
    wall = time.perf_counter() - start
    c = len(prompts)
    fits = requests_that_fit(engine.capacity_bytes, engine.layout, requests[0].demand_rows)
    return {
        "policy": policy,
        "budget": budget,
        "concurrency": c,
        "prompt_tokens": len(prompts[0].ids),
        "new_tokens": new_tokens,
        "kv_capacity_bytes": engine.capacity_bytes,
        "admitted_max": admitted,
        "fits_at_once": fits,
        "decode_tok_s": round(decode_tokens / decode_s, 3) if decode_s else None,
        "decode_rows_mean": round(decode_tokens / steps, 2) if steps else None,
        "full_batch_steps": full_steps,
        "full_batch_tok_s": round(full_steps * len(prompts) / full_s, 3) if full_s else None,
        "e2e_tok_s": round(sum(len(f.token_ids) for f in ends) / wall, 3),
        "tpot_s": round(sum(f.tpot_s for f in ends) / c, 4),
        "ttft_s": round(sum(f.ttft_s for f in ends) / c, 3),
        "ttft_max_s": round(max(f.ttft_s for f in ends), 3),
        "wall_s": round(wall, 2),
        "decode_steps": steps,
        "peak_kv_bytes": store.peak_bytes,
        "allocated_kv_bytes": store.allocated_bytes(),
        "full_kv_bytes_per_request": ends[0].kv.full_bytes,
        "measured_b": round(
            sum(f.kv.live_bytes for f in ends) / sum(f.kv.full_bytes for f in ends), 4
        ),
        "rss_peak_bytes": rss,
        "host_overhead_pct": round(100 * host_s / decode_s, 2) if decode_s else None,
        "host_ms_per_step": round(1000 * host_s / steps, 3) if steps else None,
        "roofline_pct": round(100 * roof_s / decode_s, 2) if decode_s else None,
        "shed_events": engine.shed_events - sheds,
    }


def capacity_for(args: argparse.Namespace, costs: Any, prompt_tokens: int) -> int | None:
    """``--kv-capacity-bytes``, or ``--capacity-full-requests`` K: exactly K Full-KV requests
    of this prompt size (prompt + new tokens at BF16), or None (the runtime's default)."""
    if args.kv_capacity_bytes:
        return args.kv_capacity_bytes
    if args.capacity_full_requests:
        per = (prompt_tokens + args.new_tokens) * costs.full_bytes_per_token
        return args.capacity_full_requests * per
    return None


def concurrency_levels(text: str, policies: Sequence[str]) -> dict[str, list[int]]:
    """``--concurrency``: ``"1,4,8"`` for every policy, or ``"full=4,pask=11"`` for each
    (the number of conversations each serves at a fixed capacity)."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    try:
        if not any("=" in x for x in items):
            levels = [int(x) for x in items]
            return {p: levels for p in policies} if levels else {}
        pairs = [x.split("=", 1) for x in items]
        named = {name.strip(): [] for name, _ in pairs}
        for name, c in pairs:
            named[name.strip()].append(int(c))
    except ValueError as exc:
        raise ConfigError(f"--concurrency: {text!r} is not '1,4,8' or 'full=4,pask=11'") from exc
    if set(named) != set(policies):
        raise ConfigError(
            f"--concurrency names {sorted(named)}; name each of --policies {list(policies)} once"
        )
    return {p: named[p] for p in policies}


def bench(loaded: LoadedModel, args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict]:
    """Every row of the grid, ``--repeat`` times, and what every row was measured against.

    Rounds run the whole grid in turn (round 0, then round 1, ...), so a paired ratio of two
    policies within a round compares runs minutes apart, not a run at the start with one at
    the end, on a machine whose speed drifts."""
    from pask_agent.runtime.runtime import Runtime

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    levels = concurrency_levels(args.concurrency, policies)
    if not levels or args.repeat < 1:
        raise ConfigError("name at least one concurrency level, and --repeat >= 1")
    widest = max(c for cs in levels.values() for c in cs)
    sizes = [int(x) for x in str(args.prompt_tokens).split(",")]
    rt = Runtime(loaded, config=RuntimeConfig(max_batch=widest, weights=loaded.weights))
    bandwidth, weights = measure_bandwidth(), step_weight_bytes(loaded.model)
    warm = make_prompts(rt, 32, 1)
    rows = []
    for n in sizes:
        prompts = make_prompts(rt, n, widest)
        config = RuntimeConfig(
            prefill_chunk_tokens=args.prefill_chunk_tokens,
            max_batch=widest,
            kv_capacity_bytes=capacity_for(args, rt.engine.costs, n),
            attention_backend=args.attention_backend,
            schedule=args.schedule,
            weights=loaded.weights,
        )
        engine = Engine(loaded, config)
        run_level(engine, warm, "full", None, 2, weights=weights, bandwidth=bandwidth)
        for round_ in range(args.repeat):
            for policy in policies:
                for c in levels[policy]:
                    row = run_level(engine, prompts[:c], policy, args.budget, args.new_tokens,
                                    weights=weights, bandwidth=bandwidth)  # fmt: skip
                    row = {**row, "round": round_, "weights": loaded.weights}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    meta = {
        "model": args.model,
        "weights": loaded.weights,
        "weights_bytes": weights,
        "bandwidth_bytes_per_s": round(bandwidth),
        "threads": torch.get_num_threads(),
        "prefill_chunk_tokens": args.prefill_chunk_tokens,
        "attention_backend": args.attention_backend,
        "schedule": args.schedule,
        "repeat": args.repeat,
    }
    return rows, meta


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default")
    p.add_argument("--policies", default="full,pask,snapkv", help="comma-separated names")
    p.add_argument(
        "--weights",
        default=DEFAULT_WEIGHTS,
        help=f"how the linear layers hold their weights: {', '.join(WEIGHT_FORMATS)} (with "
        "--peer, a comma-separated list: our rows for each)",
    )
    p.add_argument("--budget", type=float, default=0.33, help="KV budget B for every policy")
    p.add_argument(
        "--concurrency",
        default="1,4,8",
        help="levels for every policy (1,4,8) or one per policy (full=4,pask=11)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the grid N times in rounds; the report pairs policies within each round",
    )
    p.add_argument("--prompt-tokens", default="512", help="comma-separated prompt sizes")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--kv-capacity-bytes", type=int, default=None)
    p.add_argument(
        "--capacity-full-requests",
        type=int,
        default=None,
        help="capacity that holds exactly K Full-KV requests of each prompt size",
    )
    p.add_argument("--prefill-chunk-tokens", type=int, default=512)
    p.add_argument(
        "--attention-backend",
        default="auto",
        choices=ATTENTION_BACKENDS,
        help="the store's attention kernel (native: the compiled C decode kernel)",
    )
    p.add_argument(
        "--schedule",
        default="interleave",
        choices=SCHEDULES,
        help="prefill_first: every queued prompt is prefilled before decoding starts, so the "
        "c requests decode together (RuntimeConfig.schedule)",
    )
    p.add_argument(
        "--peer",
        choices=["llamacpp"],
        default=None,
        help="also run llama.cpp's llama-batched-bench on the same GGUF (make peer-llamacpp) "
        "and write both into --out (eval/bench_peers.py)",
    )
    p.add_argument("--peer-binary", default=".peers/llamacpp/bin/llama-batched-bench")
    p.add_argument("--threads", type=int, default=0, help="threads for both engines (0: torch's)")
    p.add_argument("--note", default="", help="a line for the Markdown report")
    p.add_argument("--out", default=None, help="results/bench (results/bench_peers with --peer)")
    p.add_argument(
        "--append", action="store_true", help="add this run's rows to the files at --out"
    )


def main_from_args(args: argparse.Namespace, command: str) -> int:
    from pask_agent.eval.bench_report import write

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    concurrency_levels(args.concurrency, policies)  # a malformed grid fails before the model
    formats = weight_formats(args.weights)
    if args.peer:
        from pask_agent.eval.bench_peers import main_from_args as with_peer

        return with_peer(args, command)
    if len(formats) > 1:
        raise ConfigError("--weights: one format at a time without --peer")
    loaded = load_model(args.model, weights=formats[0])
    rows, meta = bench(loaded, args)
    meta = {**provenance(), **meta, "command": command, "note": args.note}
    out = Path(args.out or "results/bench")
    write(rows, out, meta, append=args.append)
    print(out.with_suffix(".md").read_text())
    return 0
