"""The fixed BFCL calibration / dev / test split (paper App. C.1), written once, read everywhere.

Tuning on the same cases one reports on is how a 40-case dev table came to show PASK above Full
KV and then fell to 0.88 of it on unseen cases. So the split is a file
(``calibration_data/splits/bfcl.json``) that every command reads, never a rule recomputed by
each caller.

How it is made: cases that share a normalized tool schema (a function's name and parameters,
descriptions ignored) are joined into one group, transitively and across categories, so no
schema a policy was calibrated or tuned on reappears in the test split. Groups are shuffled
with a fixed seed and placed, largest first, into the partition whose per-category shortfall
against the 1:1:3 target is largest. ``python -m pask_agent.eval.splits`` rewrites the file;
it is deterministic, so rewriting changes nothing unless the data or the rule changed.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pask_agent.errors import ConfigError
from pask_agent.eval.bfcl import NON_LIVE_CATEGORIES, BfclCase, load_bfcl
from pask_agent.package_data import calibration_data_dir

PARTITIONS: tuple[str, ...] = ("calibration", "dev", "test")
RATIOS: tuple[int, ...] = (1, 1, 3)
DEFAULT_SEED = 20261201


@dataclass(frozen=True, slots=True)
class BfclSplit:
    """Case ids per (category, partition), in BFCL file order."""

    seed: int
    ids: Mapping[str, Mapping[str, tuple[str, ...]]]

    def partition_of(self, case_id: str) -> str:
        for parts in self.ids.values():
            for name, ids in parts.items():
                if case_id in ids:
                    return name
        raise ConfigError(f"case {case_id!r} is in no partition of the BFCL split file")

    def to_json(self) -> dict[str, Any]:
        counts = {c: {p: len(ids) for p, ids in parts.items()} for c, parts in self.ids.items()}
        return {
            "version": 1,
            "seed": self.seed,
            "ratios": dict(zip(PARTITIONS, RATIOS, strict=True)),
            "grouping": "cases sharing a normalized tool schema (name + parameters) are joined, "
            "transitively and across categories; each group lies in one partition",
            "counts": counts,
            "ids": {c: {p: list(ids) for p, ids in parts.items()} for c, parts in self.ids.items()},
        }


def schema_key(function: Mapping[str, Any]) -> str:
    """A function's identity for the split: name and parameters, descriptions dropped."""
    return json.dumps(
        {"name": function.get("name"), "parameters": _strip(function.get("parameters"))},
        sort_keys=True,
    )


def _strip(node: Any) -> Any:
    if isinstance(node, Mapping):
        return {k: _strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def make_split(cases: Sequence[BfclCase], seed: int = DEFAULT_SEED) -> BfclSplit:
    """Partition ``cases`` 1:1:3 per category, keeping every schema group in one partition."""
    parent = list(range(len(cases)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[str, int] = {}
    for i, case in enumerate(cases):
        for function in case.functions:
            key = schema_key(function)
            if key in first:
                parent[root(i)] = root(first[key])
            else:
                first[key] = i
    groups: dict[int, list[int]] = {}
    for i in range(len(cases)):
        groups.setdefault(root(i), []).append(i)
    ordered = list(groups.values())
    random.Random(seed).shuffle(ordered)
    ordered.sort(key=len, reverse=True)  # stable: equal sizes keep the seeded order

    totals = Counter(c.category for c in cases)
    target = {
        (p, cat): totals[cat] * r / sum(RATIOS)
        for p, r in zip(PARTITIONS, RATIOS, strict=True)
        for cat in totals
    }
    filled: Counter[tuple[str, str]] = Counter()
    chosen: dict[int, str] = {}
    for members in ordered:
        need = Counter(cases[i].category for i in members)

        def shortfall(p: str, need: Counter[str] = need) -> float:
            return sum((target[p, cat] - filled[p, cat]) * n for cat, n in need.items())

        best = max(PARTITIONS, key=shortfall)
        for i in members:
            chosen[i] = best
            filled[best, cases[i].category] += 1
    ids: dict[str, dict[str, tuple[str, ...]]] = {}
    for category in dict.fromkeys(c.category for c in cases):
        ids[category] = {
            p: tuple(c.id for i, c in enumerate(cases) if c.category == category and chosen[i] == p)
            for p in PARTITIONS
        }
    return BfclSplit(seed, ids)


def split_file() -> Path:
    """``calibration_data/splits/bfcl.json`` (in a checkout or an installed wheel)."""
    return calibration_data_dir() / "splits" / "bfcl.json"


def existing_split(path: Path, what: str, module: str) -> Path:
    """``path`` if the split file is there; else a ``ConfigError`` naming the command that
    writes it (splits are fixed files, never drawn afresh by an eval)."""
    if not path.is_file():
        raise ConfigError(f"no {what} at {path}; write it with: python -m {module}")
    return path


def load_split_file(path: Path | None = None) -> BfclSplit:
    """Read the split file.

    Raises
    ------
    ConfigError
        The file is missing or malformed (the message names the command that writes it).
    """
    path = existing_split(path or split_file(), "BFCL split file", "pask_agent.eval.splits")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        ids = {cat: {p: tuple(parts[p]) for p in PARTITIONS} for cat, parts in data["ids"].items()}
        return BfclSplit(int(data["seed"]), ids)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"malformed BFCL split file {path}: {exc}") from exc


def cases_in(
    partition: str,
    *,
    per_category: int | None = None,
    categories: Sequence[str] = NON_LIVE_CATEGORIES,
    split: BfclSplit | None = None,
    skip_per_category: int = 0,
) -> tuple[BfclCase, ...]:
    """The cases of one partition, category by category in BFCL file order.

    ``per_category`` keeps the first n of each category (a fixed prefix, so a smaller run is a
    subset of a larger one); ``skip_per_category`` starts after the first n instead (cases that
    earlier runs never scored: the test split's first 50 per category have been scored often).

    Raises
    ------
    ConfigError
        Unknown partition or category, or ``per_category`` below 1.
    """
    if partition not in PARTITIONS:
        raise ConfigError(f"unknown split {partition!r}; use one of {', '.join(PARTITIONS)}")
    if per_category is not None and per_category < 1:
        raise ConfigError(f"cases per category must be >= 1, got {per_category}")
    if skip_per_category < 0:
        raise ConfigError(f"cases to skip per category must be >= 0, got {skip_per_category}")
    split = split or load_split_file()
    out: list[BfclCase] = []
    for category in categories:
        if category not in split.ids:
            raise ConfigError(f"category {category!r} is not in the split file")
        wanted = set(split.ids[category][partition])
        picked = [c for c in load_bfcl(category) if c.id in wanted]
        picked = picked[skip_per_category:]
        out.extend(picked[:per_category] if per_category else picked)
    return tuple(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pask_agent.eval.splits")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    cases = [c for cat in NON_LIVE_CATEGORIES for c in load_bfcl(cat)]
    split = make_split(cases, args.seed)
    out = args.out or split_file()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(split.to_json(), indent=1) + "\n", encoding="utf-8")
    for cat, parts in split.ids.items():
        print(cat, {p: len(ids) for p, ids in parts.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
