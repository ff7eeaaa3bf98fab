"""The serving benchmark's files: JSON rows, a Markdown table and a PNG (``eval/bench.py``).

Several runs (different capacities, prompt sizes) can share one set of files (``--append``):
the JSON keeps every run's provenance under ``runs`` and tags each row with its ``run``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pask_agent.eval.plots import plot_bench

COLUMNS = (
    ("run", "run"),
    ("round", "round"),
    ("policy", "policy"),
    ("prompt_tokens", "prompt"),
    ("concurrency", "c"),
    ("kv_capacity_mib", "capacity MiB"),
    ("admitted_max", "admitted at once"),
    ("fits_at_once", "fits at once"),
    ("decode_tok_s", "decode tok/s"),
    ("decode_rows_mean", "rows / decode step"),
    ("full_batch_tok_s", "all-c decode tok/s"),
    ("full_batch_steps", "all-c steps"),
    ("e2e_tok_s", "end-to-end tok/s"),
    ("tpot_s", "TPOT s"),
    ("ttft_s", "TTFT s"),
    ("measured_b", "measured B"),
    ("peak_kv_mib", "peak KV MiB"),
    ("allocated_kv_mib", "allocated KV MiB"),
    ("rss_peak_mib", "peak RSS MiB"),
    ("host_overhead_pct", "host overhead %"),
    ("host_ms_per_step", "host ms / step"),
    ("roofline_pct", "roofline %"),
)


def _mib(n: int | None) -> str:
    return "" if n is None else f"{n / 2**20:.1f}"


def paired_rounds(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Within each run, prompt size and round: every policy's all-c decode tok/s over the
    first policy's (a run's first row names it), at each policy's first concurrency level.
    Pairing within a round keeps a drifting machine's speed out of the ratio."""
    groups: dict[tuple[Any, Any, Any], dict[str, dict[str, Any]]] = {}
    for r in rows:
        if "round" in r:
            key = (r.get("run", 0), r["prompt_tokens"], r["round"])
            groups.setdefault(key, {}).setdefault(r["policy"], r)
    out = []
    for (run, prompt, round_), by_policy in groups.items():
        ref_name, ref = next(iter(by_policy.items()))
        for name, r in list(by_policy.items())[1:]:
            a, b = r.get("full_batch_tok_s"), ref.get("full_batch_tok_s")
            out.append({
                "run": run, "prompt_tokens": prompt, "round": round_, "policy": name,
                "concurrency": r["concurrency"], "reference": ref_name,
                "reference_concurrency": ref["concurrency"], "tok_s": a, "reference_tok_s": b,
                "ratio": round(a / b, 3) if a and b else None,
            })  # fmt: skip
    return out


def _rounds_section(rows: list[dict[str, Any]]) -> list[str]:
    pairs = [p for p in paired_rounds(rows) if p["ratio"] is not None]
    runs = {p["run"] for p in pairs if p["round"] > 0}  # runs of more than one round
    pairs = [p for p in pairs if p["run"] in runs]
    if not pairs:
        return []
    lines = [
        "",
        "## Paired rounds (all-c decode tok/s, each policy over the run's first, same round)",
        "",
        "| run | prompt | round | policy (c) | reference (c) | tok/s | reference tok/s | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in pairs:
        lines.append(
            f"| {p['run']} | {p['prompt_tokens']} | {p['round']} | {p['policy']} "
            f"({p['concurrency']}) | {p['reference']} ({p['reference_concurrency']}) | "
            f"{p['tok_s']} | {p['reference_tok_s']} | {p['ratio']}x |"
        )
    lines.append("")
    for run in sorted(runs):
        for name in dict.fromkeys(p["policy"] for p in pairs if p["run"] == run):
            ratios = sorted(p["ratio"] for p in pairs if p["run"] == run and p["policy"] == name)
            mid = len(ratios) // 2
            median = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
            lines.append(
                f"- run {run}, {name}: {len(ratios)} rounds, ratio median {median:.3f}x, "
                f"min {ratios[0]:.3f}x, max {ratios[-1]:.3f}x"
            )
    return lines


def markdown(rows: list[dict[str, Any]], runs: list[dict[str, Any]]) -> str:
    lines = [f"# Serving benchmark ({runs[0].get('model', '?')})", ""]
    for i, meta in enumerate(runs):
        lines += [
            f"Run {i}: `{meta['command']}`",
            "",
            f"- commit `{meta['git_commit']}`; machine: {meta['machine']}; torch threads "
            f"{meta['threads']}; prefill chunk {meta['prefill_chunk_tokens']} tokens; attention "
            f"kernel {meta.get('attention_backend', 'auto')}; schedule "
            f"{meta.get('schedule', 'interleave')}",
            f"- measured memory bandwidth {meta['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s; model "
            f"weights {meta['weights_bytes'] / 1e9:.3f} GB (read by every decode step)",
        ]
        if meta.get("note"):
            lines.append(f"- {meta['note']}")
        lines.append("")
    lines += [
        "| " + " | ".join(title for _, title in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for r in rows:
        cells = {
            **r,
            "kv_capacity_mib": _mib(r["kv_capacity_bytes"]),
            "peak_kv_mib": _mib(r["peak_kv_bytes"]),
            "allocated_kv_mib": _mib(r["allocated_kv_bytes"]),
            "rss_peak_mib": _mib(r["rss_peak_bytes"]),
        }
        lines.append("| " + " | ".join(str(cells.get(k, "–")) for k, _ in COLUMNS) + " |")
    lines += [
        "",
        "Decode tok/s: tokens sampled in decode steps (every running request feeds one token) "
        "over those steps' time, summed over requests; rows / decode step: requests decoding in "
        "those steps (fewer than c when the first finish before the last are prefilled); all-c: "
        "only the steps in which every request decoded. End-to-end: all generated tokens over "
        "the wall time, prefill included. Admitted at once: the most requests running "
        "together; fits at once: how many of these requests the capacity admits at once. "
        "Host overhead: a decode step's time outside the model forward. Roofline: (weights + "
        "retained KV payload) / measured bandwidth, over the decode step's time. Peak KV: the "
        "store's live payload high-water mark inside the steps; allocated: the preallocated "
        "pools; RSS: the process, sampled after each step.",
        *_rounds_section(rows),
    ]
    return "\n".join(lines) + "\n"


def write(
    rows: list[dict[str, Any]], out: Path, meta: dict[str, Any], *, append: bool = False
) -> None:
    """``out``.json (runs + rows), ``out``.md and ``out``.png; with ``append``, after the
    runs already in ``out``.json."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.with_suffix(".json")
    old = json.loads(path.read_text()) if append and path.exists() else {"runs": [], "rows": []}
    runs = [*old["runs"], meta]
    rows = [*old["rows"], *({**r, "run": len(runs) - 1} for r in rows)]
    path.write_text(json.dumps({"runs": runs, "rows": rows}, indent=1))
    out.with_suffix(".md").write_text(markdown(rows, runs))
    plot_bench(rows, out.with_suffix(".png"), title=f"pask-agent bench ({meta.get('model')})")
