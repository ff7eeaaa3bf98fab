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


def plot_accuracy_vs_budget(points: Sequence[BudgetPoint], path: Path, *, title: str) -> Path:
    """Write a PNG of overall accuracy (%) against measured ``B``; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    by_policy: dict[str, list[tuple[float, float]]] = {}
    for p in points:
        by_policy.setdefault(p.policy, []).append((p.measured_b, 100 * p.overall))
    for policy, xy in by_policy.items():
        xy.sort()
        if policy == "full":
            ax.axhline(xy[-1][1], color="black", linestyle="--", linewidth=1, label="full KV")
            continue
        ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", label=policy)
    ax.set_xlabel("measured KV budget B (prompt + generated, scales included)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
