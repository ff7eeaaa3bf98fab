"""How generated tokens spread over structural buckets (``Usage.tag_counts``), per configuration.

A tagged answer should land in several buckets (keys, enum values, free values, scaffold); an
answer whose tokens all fall into one bucket is what an untagged output looks like to PASK. A
token the tagger could not place is counted as ``tagger_fallback`` and must never occur.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Usage.tag_counts keys that are not structural buckets.
NOT_BUCKETS = frozenset({"tagger_fallback", "untagged"})


def buckets_of(tag_counts: Mapping[str, int]) -> int:
    """Structural buckets one answer's generated tokens spread over."""
    return sum(1 for k, n in tag_counts.items() if n and k not in NOT_BUCKETS)


@dataclass(frozen=True, slots=True)
class BucketSummary:
    """How one configuration's generated tokens spread over structural buckets."""

    policy: str
    budget: float
    answered: int  # cases with a usage record (the request returned)
    errors: int  # cases whose request raised (cut answer, refused request)
    mean_buckets: float  # per answered case
    min_buckets: int
    max_buckets: int
    cases_with_4_or_more: int
    tagger_fallbacks: int  # over all answered cases; must be 0
    untagged: int  # generated tokens outside any structural bucket
    tokens_per_bucket: dict[str, int]  # summed over answered cases, largest first


def bucket_summary(
    policy: str, budget: float, tag_counts: Sequence[Mapping[str, int] | None]
) -> BucketSummary:
    """Aggregate one configuration's per-case ``tag_counts`` (``None``: the case raised)."""
    answered = [t for t in tag_counts if t is not None]
    counts = [buckets_of(t) for t in answered]
    total: Counter[str] = Counter()
    for t in answered:
        total.update(t)
    return BucketSummary(
        policy=policy,
        budget=budget,
        answered=len(answered),
        errors=len(tag_counts) - len(answered),
        mean_buckets=sum(counts) / len(counts) if counts else 0.0,
        min_buckets=min(counts, default=0),
        max_buckets=max(counts, default=0),
        cases_with_4_or_more=sum(1 for n in counts if n >= 4),
        tagger_fallbacks=total.get("tagger_fallback", 0),
        untagged=total.get("untagged", 0),
        tokens_per_bucket={k: n for k, n in total.most_common() if n and k not in NOT_BUCKETS},
    )


def bucket_table(buckets: Sequence[BucketSummary]) -> str:
    """Markdown: buckets per case, tagger fallbacks and errors per configuration."""
    lines = [
        "| policy | target B | answered | errors | buckets per case (mean, min–max) | "
        "cases with ≥ 4 buckets | distinct buckets | tagger fallbacks | untagged tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for b in buckets:
        lines.append(
            f"| {b.policy} | {b.budget:.2f} | {b.answered} | {b.errors} | "
            f"{b.mean_buckets:.2f} ({b.min_buckets}–{b.max_buckets}) | "
            f"{b.cases_with_4_or_more} | {len(b.tokens_per_bucket)} | {b.tagger_fallbacks} | "
            f"{b.untagged} |"
        )
    return "\n".join(lines) + "\n"
