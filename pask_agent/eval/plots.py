"""Accuracy against *measured* KV budget, one line per policy (the paper's Fig. 3 style).

Why measured and not target ``B`` on the x axis: a policy that overshoots its budget must not
look better than it is. Full KV is drawn as a dashed reference line at its accuracy.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol


class BudgetPoint(Protocol):
    policy: str
    measured_b: float
    overall: float


def plot_accuracy_vs_budget(
    points: Sequence[BudgetPoint],
    path: Path,
    *,
    title: str,
    metadata: dict[str, str] | None = None,
) -> Path:
    """Write a PNG of overall accuracy (%) against measured ``B``, one line per configuration
    (``point.config`` where the point has one, else its policy); returns ``path``.
    ``metadata`` goes into the PNG's text chunks (where the figure came from)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    lines: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    for p in points:
        key = (getattr(p, "config", p.policy), p.policy == "full")
        lines.setdefault(key, []).append((p.measured_b, 100 * p.overall))
    for (name, full), xy in lines.items():
        xy.sort()
        if full:
            label = "full KV" if name == "full" else name
            ax.axhline(xy[-1][1], color="black", linestyle="--", linewidth=1, label=label)
            continue
        ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", label=name)
    ax.set_xlabel("measured KV budget B (prompt + generated, scales included)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata=metadata)
    plt.close(fig)
    return path


def plot_bench(rows: Sequence[dict], path: Path, *, title: str) -> Path:
    """Write a PNG of the serving benchmark: aggregate decode tok/s and peak KV MiB against
    concurrency, one line per policy and prompt size (``eval/bench.py`` rows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (speed, memory) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=120)
    lines: dict[tuple, list[dict]] = {}
    for r in rows:  # one line per run, policy and prompt size
        lines.setdefault((r.get("run", 0), r["policy"], r["prompt_tokens"]), []).append(r)
    for (run, policy, prompt), rs in lines.items():
        rs = sorted(rs, key=lambda r: r["concurrency"])
        xs = [r["concurrency"] for r in rs]
        label = f"run {run}: {policy}, {prompt} tok"
        speed.plot(xs, [r["decode_tok_s"] or 0 for r in rs], marker="o", label=label)
        memory.plot(xs, [r["peak_kv_bytes"] / 2**20 for r in rs], marker="o", label=label)
    speed.set_ylabel("aggregate decode tok/s")
    memory.set_ylabel("peak KV payload (MiB)")
    for ax in (speed, memory):
        ax.set_xlabel("requests queued at once (concurrency)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
