"""The GPU readiness check's outputs (``eval/gpu_check.py``): the one-line JSON summary it
prints, the Markdown file it writes beside ``gpu_check.json``, and a digest of the code that ran
(a copied tree may carry no git history, so the commit alone could read ``unknown``)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

INT4_COLUMNS = (
    ("rows", "rows"),
    ("code_mismatches", "code mismatches"),
    ("scale_mismatches", "scale mismatches"),
    ("dequantize_max_abs_err", "dequantize max abs err"),
    ("quantize_ms", "quantize ms"),
    ("quantize_ref_ms", "ref ms"),
    ("dequantize_ms", "dequantize ms"),
    ("dequantize_ref_ms", "ref ms"),
)
ATTENTION_COLUMNS = (
    ("tokens", "tokens"),
    ("layout", "rows"),
    ("high_rows", "BF16 rows"),
    ("low_rows", "INT4 rows"),
    ("max_abs_err", "max abs err"),
    ("rel_err", "rel err"),
    ("triton_ms", "Triton ms"),
    ("ref_ms", "ref ms"),
    ("ref_device", "ref on"),
    ("ref_error", "ref error"),
)
SERVING_COLUMNS = (
    ("policy", "policy"),
    ("concurrency", "c queued"),
    ("admitted_max", "admitted at once"),
    ("fits_at_once", "fits at once"),
    ("tpot_s", "TPOT s"),
    ("ttft_s", "TTFT s"),
    ("decode_tok_s", "decode tok/s"),
    ("e2e_tok_s", "end-to-end tok/s"),
    ("decode_rows_mean", "rows / decode step"),
    ("measured_b", "measured B"),
    ("peak_kv_bytes", "peak KV MiB"),
    ("allocated_kv_bytes", "allocated KV MiB"),
    ("gpu_peak_allocated_bytes", "GPU peak MiB"),
    ("host_ms_per_step", "host ms / step"),
    ("roofline_pct", "roofline %"),
    ("wall_s", "wall s"),
)
SUMMARY_SERVING = tuple(key for key, _ in SERVING_COLUMNS) + ("ok", "error")


def source_digest() -> str:
    """SHA-256 over the package's Python files and the script, by relative path and content."""
    h = hashlib.sha256()
    files = sorted((ROOT / "pask_agent").rglob("*.py")) + [ROOT / "scripts" / "gpu_check.py"]
    for path in files:
        if path.is_file():
            h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    """What the run printed last: every case's verdict and numbers, without tracebacks."""
    stages = doc.get("stages", {})
    kernels, serving = stages.get("kernels", {}), stages.get("serving", {})
    env = stages.get("environment", {})
    return {
        "ok": doc.get("ok"),
        "smoke": doc.get("smoke"),
        "git_commit": doc.get("git_commit"),
        "source_sha256": doc.get("source_sha256"),
        "device": env.get("gpu") or env.get("device"),
        "wall_s": doc.get("wall_s"),
        "stages": {
            name: {k: s.get(k) for k in ("ok", "seconds", "error") if k in s}
            for name, s in stages.items()
        },
        "kernels": {
            "mode": kernels.get("mode"),
            "int4": [_drop(r, "traceback") for r in kernels.get("int4", [])],
            "attention": [_drop(r, "traceback") for r in kernels.get("attention", [])],
        },
        "serving": {
            "model": serving.get("model"),
            "kv_capacity_bytes": serving.get("kv_capacity_bytes"),
            "rows": [{k: r[k] for k in SUMMARY_SERVING if k in r} for r in serving.get("rows", [])],
        },
    }


def _drop(row: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != key}


def _cell(key: str, value: Any) -> str:
    if value is None:
        return ""
    if key.endswith("_bytes") and isinstance(value, int):
        return f"{value / 2**20:.1f}"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value).replace("|", "/")


def _table(rows: list[dict[str, Any]], columns: tuple[tuple[str, str], ...]) -> list[str]:
    lines = [
        "| " + " | ".join(title for _, title in columns) + " | ok |",
        "|" + "---|" * (len(columns) + 1),
    ]
    for r in rows:
        cells = [_cell(key, r.get(key)) for key, _ in columns]
        verdict = "yes" if r.get("ok") else f"**no**: {r.get('error', '')}".replace("|", "/")
        lines.append("| " + " | ".join(cells) + f" | {verdict} |")
    return lines


def markdown(doc: dict[str, Any]) -> str:
    stages = doc.get("stages", {})
    env = stages.get("environment", {})
    lines = [
        "# GPU readiness check" + (" (smoke size)" if doc.get("smoke") else ""),
        "",
        f"- command: `{doc.get('command', '')}`",
        f"- git commit: `{doc.get('git_commit')}` (dirty: {doc.get('dirty')}); "
        f"source SHA-256 `{doc.get('source_sha256', '')[:16]}…`",
        f"- machine: {doc.get('machine')}; device: {env.get('gpu') or env.get('device')}",
        f"- torch {env.get('torch')}, triton {env.get('triton')}, transformers "
        f"{env.get('transformers')}, CUDA {env.get('cuda', '-')}",
        f"- wall time: {doc.get('wall_s')} s; all stages passed: {doc.get('ok')}",
        "",
        "| stage | ok | seconds | error |",
        "|---|---|---|---|",
    ]
    for name, s in stages.items():
        error = str(s.get("error", "")).replace("|", "/")
        lines.append(f"| {name} | {s.get('ok')} | {s.get('seconds', '')} | {error} |")
    kernels = stages.get("kernels")
    if kernels and "int4" in kernels:
        lines += [
            "",
            f"## Kernels ({kernels.get('mode')}; heads {kernels.get('heads')}; "
            f"{kernels.get('repeats')} timed calls each)",
            "",
            "INT4 quantize/dequantize of `rows` random BF16 rows: codes and scales must match "
            "the reference bit for bit.",
            "",
            *_table(kernels["int4"], INT4_COLUMNS),
            "",
            f"Mixed attention: 3 decoding sequences + 1 prefilling {kernels.get('chunk')} "
            "tokens, each over `tokens` stored keys; pass: max abs error / max |ref| <= 1e-3.",
            "",
            *_table(kernels["attention"], ATTENTION_COLUMNS),
        ]
    serving = stages.get("serving")
    if serving and "rows" in serving:
        lines += [
            "",
            f"## Serving: {serving.get('model')} ({serving.get('dtype')}), Full KV vs PASK at "
            f"{_cell('kv_capacity_bytes', serving.get('kv_capacity_bytes'))} MiB of KV",
            "",
            f"Capacity: exactly {serving.get('capacity_full_requests')} Full-KV requests of "
            f"{serving.get('prompt_tokens')} prompt + {serving.get('new_tokens')} new tokens. "
            "Each row queues `c` requests at once (random prompt ids, greedy, EOS ignored); "
            "the engine admits what fits. PASK at its table's default budget; prompt labels: "
            f"{serving.get('prompt_labels')}. Model built in {serving.get('build_s')} s, "
            f"warm-up (kernel compiles) {serving.get('warmup_s')} s.",
            "",
            *_table(serving["rows"], SERVING_COLUMNS),
        ]
    for name, s in stages.items():
        if s.get("traceback"):
            lines += ["", f"### {name}: traceback", "", "```", s["traceback"].rstrip(), "```"]
    return "\n".join(lines) + "\n"
