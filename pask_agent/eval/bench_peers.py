"""llama.cpp beside us, in one run: the same GGUF, prompt sizes, new tokens and threads.

A user who wants a small model on a CPU runs llama.cpp (directly, or through Ollama or
llama-cpp-python). ``pask-agent bench --peer llamacpp`` measures llama.cpp's own batched
benchmark (``llama-batched-bench``, built by ``make peer-llamacpp``) on the GGUF file we ship,
with f16, q8_0 and q4_0 KV caches, and then our Runtime's rows (``eval/bench.py``: Full KV and
PASK), and writes both into one table.

What each row says, for ``c`` sequences of ``prompt`` tokens that then decode ``new`` tokens
together (greedy for us; llama.cpp's tool feeds random tokens, which costs the same in a
dense model):

* ``prefill_tok_s``: prompt tokens over the time until the last sequence's prompt is done
  (llama.cpp: its ``S_PP``; ours: ``c · prompt / slowest TTFT`` under ``prefill_first``);
* ``decode_tok_s``: tokens over the decode time, all ``c`` sequences together (its ``S_TG``;
  ours: the decode steps that fed every sequence);
* ``ttft_s``: the c = 1 time to the first token (its ``T_PP``);
* ``kv_bytes_per_token``: llama.cpp's KV buffer over its cells (a cell holds one token of
  every layer; one stream of cells per sequence); ours: what a request's store kept per token
  at its end (measured, so PASK's row is its measured B of the BF16 cost);
* ``rss_peak_mib``: the process's peak resident memory (llama.cpp: ``wait4``; ours: sampled
  each step, one process per weight format). Ours holds the weights as ``--weights`` says
  (fp32 dequantized, int8 or int4 codes); llama.cpp reads the Q4_K_M blocks as stored.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from pask_agent.errors import ConfigError

PEER_DIR = Path(".peers")
LLAMACPP = PEER_DIR / "llamacpp" / "bin" / "llama-batched-bench"
KV_TYPES = ("f16", "q8_0", "q4_0")
# "size = 98.00 MiB (  4160 cells,  24 layers,  8/8 seqs)": cells per stream, one stream a sequence
_KV_LINE = re.compile(
    r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*\d+ layers,\s*\d+/(\d+) seqs"
)


def llamacpp_command(
    binary: Path,
    gguf: Path,
    prompt_tokens: int,
    new_tokens: int,
    parallel: list[int],
    threads: int,
    kv_type: str,
) -> list[str]:
    """One ``llama-batched-bench`` run: every ``parallel`` level at one prompt size, with a
    context just large enough for the widest level (each sequence its own prompt)."""
    ctx = max(parallel) * (prompt_tokens + new_tokens)
    return [
        str(binary), "-m", str(gguf), "-c", str(ctx), "-b", "2048", "-ub", "512",
        "-npp", str(prompt_tokens), "-ntg", str(new_tokens),
        "-npl", ",".join(str(p) for p in parallel), "-t", str(threads), "-tb", str(threads),
        "-ctk", kv_type, "-ctv", kv_type, "-fa", "on", "--output-format", "jsonl",
        "-lv", "4",  # info lines: the KV cache's size
    ]  # fmt: skip


def parse_llamacpp(stdout: str, stderr: str, kv_type: str) -> list[dict[str, Any]]:
    """Rows from the tool's JSON lines, with the KV bytes per cell from its log.

    Raises
    ------
    ConfigError
        The output has no result line or no KV size line (a different llama.cpp build).
    """
    kv = _KV_LINE.search(stderr) or _KV_LINE.search(stdout)
    results = [json.loads(x) for x in stdout.splitlines() if x.startswith('{"n_kv_max"')]
    if kv is None or not results:
        raise ConfigError(
            "llama-batched-bench printed no results or no 'llama_kv_cache: size' line; "
            "rebuild it with `make peer-llamacpp`"
        )
    per_token = float(kv.group(1)) * 2**20 / (int(kv.group(2)) * int(kv.group(3)))
    return [
        {
            "engine": "llama.cpp",
            "weights": "GGUF, read as stored",
            "cache": f"{kv_type} KV",
            "prompt_tokens": r["pp"],
            "concurrency": r["pl"],
            "new_tokens": r["tg"],
            "prefill_tok_s": round(r["speed_pp"], 2),
            "decode_tok_s": round(r["speed_tg"], 2),
            "ttft_s": round(r["t_pp"], 3) if r["pl"] == 1 else None,
            "kv_bytes_per_token": round(per_token, 1),
            "threads": r["n_threads"],
        }
        for r in results
    ]


def run_llamacpp(
    binary: Path,
    gguf: Path,
    sizes: list[int],
    new_tokens: int,
    parallel: list[int],
    threads: int,
    kv_types: tuple[str, ...] = KV_TYPES,
) -> list[dict[str, Any]]:
    """Every KV type × prompt size; each row carries its process's peak RSS.

    Raises
    ------
    ConfigError
        The tool is not built (the message names ``make peer-llamacpp``) or it failed.
    """
    if not binary.is_file():
        raise ConfigError(f"{binary} is not built; run `make peer-llamacpp` first")
    rows = []
    for kv_type in kv_types:
        for n in sizes:
            cmd = llamacpp_command(binary, gguf, n, new_tokens, parallel, threads, kv_type)
            code, out, err, rss = _run_measured(cmd)
            if code:
                raise ConfigError(f"{' '.join(cmd)} failed ({code}): {err[-800:]}")
            for row in parse_llamacpp(out, err, kv_type):
                rows.append({**row, "rss_peak_mib": round(rss / 2**20)})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def _run_measured(cmd: list[str]) -> tuple[int, str, str, int]:
    """Exit code, stdout, stderr and peak RSS in bytes of one child process (``wait4``: that
    child's own peak, not the largest of every child so far)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read(), err.read(), usage.ru_maxrss * 1024


def rows_in_own_process(
    args: argparse.Namespace, sizes: list[int], weights: str
) -> list[dict[str, Any]]:
    """``our_rows`` for one weight format in a fresh process, so its peak RSS is its own: a
    process that held another format's model keeps that memory (freed host memory is
    retained, ``runtime/memory/host_memory.py``)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_rows_of_format, args, sizes, weights).result()


def _rows_of_format(args: argparse.Namespace, sizes: list[int], weights: str) -> list[dict]:
    from pask_agent.runtime.models.loading import load_model

    torch.set_num_threads(args.threads or torch.get_num_threads())
    return our_rows(load_model(args.model, weights=weights), args, sizes)


def our_rows(loaded: Any, args: argparse.Namespace, sizes: list[int]) -> list[dict[str, Any]]:
    """``eval/bench.py`` rows for ``--policies`` at ``--concurrency``, in this table's terms."""
    from pask_agent.eval.bench import bench

    ours = argparse.Namespace(**{**vars(args), "schedule": "prefill_first", "repeat": 1,
                                 "prompt_tokens": ",".join(map(str, sizes))})  # fmt: skip
    rows, _ = bench(loaded, ours)
    out = []
    for r in rows:
        c, n = r["concurrency"], r["prompt_tokens"]
        held = n + r["new_tokens"] - 1  # the last sampled token is never fed back
        per_token = r["full_kv_bytes_per_request"] / held * r["measured_b"]
        out.append(
            {
                "engine": "pask-agent",
                "cache": r["policy"] if r["policy"] == "full" else f"{r['policy']} B={r['budget']}",
                "weights": r["weights"],
                "prompt_tokens": n,
                "concurrency": c,
                "new_tokens": r["new_tokens"],
                "prefill_tok_s": round(c * n / r["ttft_max_s"], 2),
                "decode_tok_s": r["full_batch_tok_s"] or r["decode_tok_s"],
                "ttft_s": r["ttft_s"] if c == 1 else None,
                "kv_bytes_per_token": round(per_token, 1),
                "measured_b": r["measured_b"],
                "threads": torch.get_num_threads(),
                "rss_peak_mib": round(r["rss_peak_bytes"] / 2**20),
            }
        )
    return out


COLUMNS = (
    ("engine", "engine"),
    ("weights", "weights"),
    ("cache", "KV cache / policy"),
    ("prompt_tokens", "prompt"),
    ("concurrency", "c"),
    ("prefill_tok_s", "prefill tok/s"),
    ("decode_tok_s", "decode tok/s (all c)"),
    ("ttft_s", "TTFT s"),
    ("kv_bytes_per_token", "KV bytes / token"),
    ("rss_peak_mib", "peak RSS MiB"),
)


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table: one row per engine × cache × prompt size × concurrency."""
    lines = ["| " + " | ".join(h for _, h in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in sorted(rows, key=lambda r: (r["prompt_tokens"], r["concurrency"])):
        cells = ["–" if r.get(k) is None else str(r[k]) for k, _ in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    """Decode tok/s against concurrency, one line per engine × cache and prompt size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=120)
    lines: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        lines.setdefault((r["engine"], r["cache"], r["prompt_tokens"]), []).append(r)
    for (engine, cache, n), rs in sorted(lines.items()):
        rs = sorted(rs, key=lambda r: r["concurrency"])
        style = "-" if engine == "pask-agent" else "--"
        ax.plot([r["concurrency"] for r in rs], [r["decode_tok_s"] for r in rs], style,
                marker="o", label=f"{engine}, {cache}, {n} tok")  # fmt: skip
    ax.set_xlabel("sequences decoding together (c)")
    ax.set_ylabel("decode tok/s, all sequences")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def write(rows: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> None:
    """``out``.json (rows + provenance), ``out``.md (the table) and ``out``.png."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    png = plot(rows, out.with_suffix(".png"))
    md = [
        f"# pask-agent and llama.cpp on the same GGUF ({meta['model']})",
        "",
        f"`{meta['command']}` at `{meta['git_commit']}` on {meta['machine']}; "
        f"{meta['threads']} threads each, {meta['new_tokens']} new tokens per sequence; "
        f"llama.cpp: `llama-batched-bench` from {meta['llamacpp_source']}, flash attention "
        "on, its own random prompt tokens. Definitions: `pask_agent/eval/bench_peers.py`.",
        "",
        table(rows),
        "",
        f"![decode tok/s]({png.name})",
        "",
    ]
    out.with_suffix(".md").write_text("\n".join(md))


def main_from_args(args: argparse.Namespace, command: str) -> int:
    """``pask-agent bench --peer llamacpp``: llama.cpp's rows, then ours, in one file set."""
    from pask_agent.record.provenance import provenance
    from pask_agent.runtime.models.loading import bundled_gguf
    from pask_agent.runtime.models.weight_formats import weight_formats

    if args.peer != "llamacpp":
        raise ConfigError(f"--peer {args.peer!r}: the one peer is 'llamacpp'")
    binary = Path(args.peer_binary)
    if not binary.is_file():
        raise ConfigError(f"{binary} is not built; run `make peer-llamacpp` first")
    sizes = [int(x) for x in str(args.prompt_tokens).split(",")]
    parallel = sorted({int(x) for x in str(args.concurrency).split(",")})
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    gguf = bundled_gguf(args.model, PEER_DIR / "models" / f"{args.model}.gguf")
    rows = run_llamacpp(binary, gguf, sizes, args.new_tokens, parallel, threads)
    for weights in weight_formats(args.weights):
        rows += rows_in_own_process(args, sizes, weights)
    source = binary.parent.parent / "SOURCE"
    meta = {
        **provenance(),
        "command": command,
        "model": args.model,
        "gguf": gguf.name,
        "threads": threads,
        "new_tokens": args.new_tokens,
        "llamacpp_source": source.read_text().strip() if source.is_file() else str(binary),
    }
    out = Path(args.out or "results/bench_peers")
    write(rows, meta, out)
    print(out.with_suffix(".md").read_text())
    return 0
