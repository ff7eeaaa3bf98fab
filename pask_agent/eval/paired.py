"""Paired comparisons of two policies on the same cases: bootstrap interval and McNemar test.

With one case worth several points of accuracy, two policies' accuracies differ by chance more
often than not. Both runs answer the same cases, so the honest comparison is paired: resample
cases (not answers) for an interval on the accuracy difference, and test the discordant pairs
(one right, the other wrong) with McNemar's exact binomial test.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pask_agent.errors import ConfigError


@dataclass(frozen=True, slots=True)
class PairedComparison:
    """``a`` against ``b`` on ``n`` shared cases: accuracy difference ``a - b`` with its
    bootstrap interval, the discordant counts and McNemar's two-sided exact p-value."""

    n: int
    accuracy_a: float
    accuracy_b: float
    difference: float
    ci_low: float
    ci_high: float
    only_a: int  # cases a gets right and b wrong
    only_b: int
    p_value: float


def compare_paired(
    a: Mapping[str, bool],
    b: Mapping[str, bool],
    *,
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedComparison:
    """Compare per-case correctness of two runs keyed by case id (only shared ids count).

    Raises
    ------
    ConfigError
        No case is shared, or ``confidence`` is outside (0, 1).
    """
    if not 0 < confidence < 1:
        raise ConfigError(f"confidence must lie in (0, 1), got {confidence}")
    ids = sorted(set(a) & set(b))
    if not ids:
        raise ConfigError("the two runs share no case ids; compare runs over the same cases")
    pairs = [(bool(a[i]), bool(b[i])) for i in ids]
    n = len(pairs)
    diffs = [int(x) - int(y) for x, y in pairs]
    rng = random.Random(seed)
    stats = sorted(sum(rng.choices(diffs, k=n)) / n for _ in range(resamples))
    tail = (1 - confidence) / 2
    low = stats[int(math.floor(tail * (resamples - 1)))]
    high = stats[int(math.ceil((1 - tail) * (resamples - 1)))]
    only_a = sum(1 for x, y in pairs if x and not y)
    only_b = sum(1 for x, y in pairs if y and not x)
    return PairedComparison(
        n=n,
        accuracy_a=sum(x for x, _ in pairs) / n,
        accuracy_b=sum(y for _, y in pairs) / n,
        difference=sum(diffs) / n,
        ci_low=low,
        ci_high=high,
        only_a=only_a,
        only_b=only_b,
        p_value=mcnemar_exact(only_a, only_b),
    )


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value: a binomial test of the discordant pairs at 1/2."""
    k, m = min(only_a, only_b), only_a + only_b
    if m == 0:
        return 1.0
    tail = sum(math.comb(m, i) for i in range(k + 1)) / 2**m
    return min(1.0, 2 * tail)


def paired_table(
    rows: Sequence[tuple[str, PairedComparison]], *, reference: str = "Full KV"
) -> str:
    """Markdown: one row per configuration against ``reference``."""
    head = (
        f"| configuration | n | accuracy | {reference} | difference | 95 % CI | "
        f"only this right | only {reference} right | McNemar p |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for name, c in rows:
        lines.append(
            f"| {name} | {c.n} | {100 * c.accuracy_a:.1f} | {100 * c.accuracy_b:.1f} | "
            f"{100 * c.difference:+.1f} | [{100 * c.ci_low:+.1f}, {100 * c.ci_high:+.1f}] | "
            f"{c.only_a} | {c.only_b} | {c.p_value:.3g} |"
        )
    return "\n".join(lines) + "\n"
