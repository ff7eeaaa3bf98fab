"""Where the CPU decode path's speed comes from: three side-by-side timings.

1. **Linear layers**: ``nn.Linear`` (MKL sgemm) against ``runtime/cpu_linear.OneDNNLinear``
   and the int8 / int4 weights of ``runtime/models/quantized_linear.py``, on the model's own
   layer shapes (read from its config; random weights), at 1 and 8 rows.
2. **Decode attention**: the per-sequence loop of ``kernels/attention.py`` against the padded
   batch of ``kernels/decode_attention.py`` and the compiled C kernel (``kernels/
   cpu_attention.py``, what a CPU server runs), on random pools shaped like the bench's decode
   steps (one query per sequence; BF16 and INT4 rows as Full KV and PASK hold them).
3. **Step scratch**: splitting INT4 rows into fp32 nibbles, as a decode layer does, in a fresh
   interpreter with and without ``runtime/host_memory.retain_freed_host_memory`` (the glibc
   setting is process-wide, so each side gets its own process).

``python -m pask_agent.eval.cpu_paths --out results/cpu_paths`` writes JSON and Markdown with
the command, commit and machine. Times are the median of ``--repeats`` calls after a warm one;
parts 1 and 2 run with freed memory retained, as the runtime runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pask_agent.kernels import cpu_attention, decode_attention
from pask_agent.kernels.attention import mixed_attention_cpu, mixed_attention_ref
from pask_agent.kernels.attention_inputs import MixedKV, PoolView, QueryChunk
from pask_agent.kernels.int4 import quantize_int4_ref
from pask_agent.record.provenance import provenance
from pask_agent.runtime.memory.host_memory import retain_freed_host_memory
from pask_agent.runtime.models.cpu_linear import OneDNNLinear
from pask_agent.runtime.models.quantized_linear import Int4Linear, Int8Linear

# (name, sequences, BF16 rows each, INT4 rows each): the bench's decode steps
ATTENTION_CASES = (
    ("full, c = 8, 512 tokens", 8, 576, 0),
    ("pask, c = 8, 512 tokens", 8, 60, 516),
    ("full, c = 4, 4,096 tokens", 4, 4160, 0),
    ("pask, c = 11, 4,096 tokens", 11, 420, 3740),
)

SCRATCH_PROBE = """
import sys, time, torch
from pask_agent.runtime.memory.host_memory import retain_freed_host_memory
if sys.argv[1] == "retain":
    retain_freed_host_memory()
codes = torch.randint(0, 256, (2, 11, 3740, 32), dtype=torch.uint8).view(torch.int8)
def split():
    return ((codes << 4) >> 4).float(), (codes >> 4).float()
split()
times = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    split()
    times.append(time.perf_counter() - t)
times.sort()
print(times[len(times) // 2] * 1000)
"""


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return round(statistics.median(times) * 1000, 3)


def linear_shapes(config: Any) -> list[tuple[str, int, int]]:
    """(name, in, out) of a decoder layer's projections and the output head."""
    hidden, inter = config.hidden_size, config.intermediate_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = config.num_key_value_heads * head_dim
    return [
        ("q / o projection", hidden, heads * head_dim),
        ("k / v projection", hidden, kv),
        ("gate / up projection", hidden, inter),
        ("down projection", inter, hidden),
        ("output head", hidden, config.vocab_size),
    ]


def time_linears(config: Any, repeats: int, stream_bytes: int = 256 << 20) -> list[dict[str, Any]]:
    """Each layer shape as fp32 ``nn.Linear``, oneDNN, int8 and int4 weights. Calls go round
    robin over enough copies of the layer to hold ``stream_bytes`` of fp32 weights, so each
    call reads its weights from memory as a decode step does, not from a warm cache."""
    rows = []
    for name, n_in, n_out in linear_shapes(config):
        copies = max(1, -(-stream_bytes // (4 * n_in * n_out)))
        dense = [nn.Linear(n_in, n_out, bias=False).requires_grad_(False) for _ in range(copies)]
        layers = {
            "nn_linear_ms": dense,
            "onednn_ms": [OneDNNLinear(d) for d in dense],
            "int8_ms": [Int8Linear(d) for d in dense],
            "int4_ms": [Int4Linear(d) for d in dense],
        }
        for m in (1, 8):
            x = torch.randn(m, n_in)
            row: dict[str, Any] = {"layer": name, "in": n_in, "out": n_out, "rows": m}
            for key, group in layers.items():
                turn = iter(range(1 << 62))
                call = lambda g=group, t=turn, x=x: g[next(t) % len(g)](x)  # noqa: E731
                with torch.inference_mode():
                    row[key] = _median_ms(call, max(repeats, copies))
            row["speedup"] = round(row["nn_linear_ms"] / row["onednn_ms"], 2)
            rows.append(row)
        del dense, layers
    return rows


def _pools(seqs: int, high: int, low: int, n_qh: int, n_kvh: int, dim: int) -> dict[str, Any]:
    """Random pools with shuffled slots; sequence b's keys at positions below its query."""
    gen = torch.Generator().manual_seed(0)
    kv = (n_kvh, dim)
    high_k = torch.randn(seqs * high + 1, *kv, generator=gen).to(torch.bfloat16)
    high_v = torch.randn(high_k.shape, generator=gen).to(torch.bfloat16)
    low_k, low_ks = quantize_int4_ref(torch.randn(seqs * low + 1, *kv, generator=gen))
    low_v, low_vs = quantize_int4_ref(torch.randn(seqs * low + 1, *kv, generator=gen))

    def view(rows: int) -> PoolView:
        slots = torch.randperm(seqs * rows + 1, generator=gen)[: seqs * rows]
        offsets = torch.arange(seqs + 1, dtype=torch.int64) * rows
        return PoolView(slots, offsets, torch.arange(rows).repeat(seqs))

    q = torch.randn(seqs, n_qh, dim, generator=gen)
    q_offsets = torch.arange(seqs + 1, dtype=torch.int64)
    q_pos = torch.full((seqs,), high + low, dtype=torch.int64)
    cur_k, cur_v = (torch.randn(seqs, *kv, generator=gen) for _ in range(2))
    return {
        "chunk": QueryChunk(q, q_offsets, q_pos, cur_k, cur_v),
        "kv": MixedKV(high_k, high_v, view(high), low_k, low_v, low_ks, low_vs, view(low)),
    }


def time_attention(config: Any, repeats: int) -> list[dict[str, Any]]:
    n_qh, n_kvh = config.num_attention_heads, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // n_qh
    rows = []
    small = decode_attention.SMALL_QUERIES
    try:
        for name, seqs, high, low in ATTENTION_CASES:
            inputs = _pools(seqs, high, low, n_qh, n_kvh, dim)
            run = lambda inputs=inputs: mixed_attention_ref(**inputs, scale=dim**-0.5)  # noqa: E731
            decode_attention.SMALL_QUERIES = 0
            looped = _median_ms(run, repeats)
            decode_attention.SMALL_QUERIES = small
            batched = _median_ms(run, repeats)
            native = None
            if cpu_attention.native_kernel() is not None:
                compiled = lambda inputs=inputs: mixed_attention_cpu(**inputs, scale=dim**-0.5)  # noqa: E731
                native = _median_ms(compiled, repeats)
            rows.append({"case": name, "sequences": seqs, "bf16_rows": high, "int4_rows": low,
                         "loop_ms_per_layer": looped, "batched_ms_per_layer": batched,
                         "speedup": round(looped / batched, 2),
                         "native_ms_per_layer": native})  # fmt: skip
    finally:
        decode_attention.SMALL_QUERIES = small
    return rows


def time_scratch(repeats: int) -> dict[str, float]:
    out = {}
    for mode in ("plain", "retain"):
        done = subprocess.run(
            [sys.executable, "-c", SCRATCH_PROBE, mode, str(repeats)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        out[f"{mode}_ms"] = round(float(done.stdout.split()[-1]), 3)
    out["speedup"] = round(out["plain_ms"] / out["retain_ms"], 2)
    return out


def write(report: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    meta = report["meta"]
    lines = [
        "# The CPU decode path, piece by piece",
        "",
        f"Command: `{meta['command']}`  ",
        f"Commit: `{meta['git_commit']}`  ",
        f"Machine: {meta['machine']}, torch threads {meta['threads']}  ",
        f"Median of {meta['repeats']} calls after a warm one. Model shapes: {meta['model']}.",
        "",
        "## Linear layers: fp32 through MKL and oneDNN, int8 and int4 weights",
        "",
        "Weights read from memory, not a warm cache (calls rotate over copies of the layer "
        "holding 256 MB of fp32 weights). int8 and int4: `runtime/models/quantized_linear.py`.",
        "",
        "| layer | in | out | rows | nn.Linear ms | oneDNN ms | oneDNN speedup | int8 ms "
        "| int4 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['layer']} | {r['in']} | {r['out']} | {r['rows']} | {r['nn_linear_ms']} | "
        f"{r['onednn_ms']} | {r['speedup']}x | {r['int8_ms']} | {r['int4_ms']} |"
        for r in report["linears"]
    ]
    lines += [
        "",
        "## Decode attention, one layer: per-sequence loop, one padded batch, the C kernel",
        "",
        f"C kernel: {report['meta']['native_kernel']}.",
        "",
        "| case | sequences | BF16 rows each | INT4 rows each | loop ms | batched ms | speedup "
        "| C kernel ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['case']} | {r['sequences']} | {r['bf16_rows']} | {r['int4_rows']} | "
        f"{r['loop_ms_per_layer']} | {r['batched_ms_per_layer']} | {r['speedup']}x | "
        f"{'-' if r.get('native_ms_per_layer') is None else r['native_ms_per_layer']} |"
        for r in report["attention"]
    ]
    s = report["scratch"]
    lines += [
        "",
        "## Step scratch: 11 x 3,740 INT4 rows split into fp32 nibbles",
        "",
        f"Fresh pages every call (glibc defaults): {s['plain_ms']} ms; freed memory kept in the "
        f"process (`retain_freed_host_memory`): {s['retain_ms']} ms ({s['speedup']}x).",
        "",
    ]
    out.with_suffix(".md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default", help="whose config gives the shapes")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="results/cpu_paths")
    args = parser.parse_args(argv)
    from transformers import AutoConfig

    from pask_agent.runtime.models.loading import resolve_model_dir

    config = AutoConfig.from_pretrained(resolve_model_dir(args.model))
    retain_freed_host_memory()  # as the runtime does before it serves
    report = {
        "meta": {
            **provenance(),
            "threads": torch.get_num_threads(),
            "repeats": args.repeats,
            "model": args.model,
            "native_kernel": cpu_attention.native_status(),
        },  # fmt: skip
        "linears": time_linears(config, args.repeats),
        "attention": time_attention(config, args.repeats),
        "scratch": time_scratch(args.repeats),
    }
    write(report, Path(args.out))
    print(Path(args.out).with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
