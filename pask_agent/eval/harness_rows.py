"""The harness's rows: one case under one configuration, and the JSON Lines file that holds them.

A row is flat JSON: the harness's fields (identity, verdict, measured KV, latency, commit)
followed by the workload's own (``detail``: calls, SQL candidates, tag counts...). The
workload names the key its group is stored under (``category``, ``difficulty``), so files
written before the harness read as rows today (``Workload.upgrade_row`` maps what else
changed). The file is appended to as rows finish and rewritten in case order after each
configuration; a line cut short by a killed process is dropped when the run resumes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pask_agent.errors import ConfigError

if TYPE_CHECKING:
    from pask_agent.eval.harness import Config, Workload


@dataclass(frozen=True, slots=True)
class Measured:
    """What a case's requests cost, as the runtime measured them (``Usage``), App. B.3.

    ``measured_b`` is the worst request's live KV bytes over its Full-KV bytes (a budget holds
    per request); ``pooled_b`` is the case's sum over the sum. The prompt's part of the bytes
    gives the realized ``B_P`` and ``B_D`` (0: not recorded). ``fallbacks`` holds the usage
    counters whose name says fallback (tokens the tagger could not place, bytes a fallback
    moved); each is stored under its own key. ``plan_budget`` is the calibrated budget whose
    prompt plan served the case's strictest request (0: no table, or not recorded)."""

    prompt_tokens: int
    completion_tokens: int
    kv_bytes: int
    full_kv_bytes: int
    measured_b: float
    pooled_b: float
    prompt_kv_bytes: int
    prompt_full_kv_bytes: int
    plan_budget: float = 0.0
    fallbacks: Mapping[str, int] = field(default_factory=dict)
    tag_counts: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def values(cls, **given: Any) -> Measured:
        """The fields given; every other count and ratio 0 (nothing measured, or not recorded
        by the version of the eval that wrote a row)."""
        zero = {f.name: 0 for f in fields(cls) if f.name not in ("fallbacks", "tag_counts")}
        return cls(**{**zero, **given})

    @classmethod
    def of(cls, usages: Sequence[Any]) -> Measured:
        """Sum a case's ``Usage`` records (one per request it made)."""
        if not usages:
            return cls.values()
        full = sum(u.full_kv_bytes for u in usages)
        kv = sum(u.kv_bytes for u in usages)
        fallbacks: dict[str, int] = {}
        tags: dict[str, int] = {}
        for u in usages:
            for name, value in fallback_counters(u).items():
                fallbacks[name] = fallbacks.get(name, 0) + value
            for k, n in u.tag_counts.items():
                tags[k] = tags.get(k, 0) + n
        return cls(
            prompt_tokens=sum(u.prompt_tokens for u in usages),
            completion_tokens=sum(u.completion_tokens for u in usages),
            kv_bytes=kv,
            full_kv_bytes=full,
            measured_b=max(u.measured_b for u in usages),
            pooled_b=kv / full if full else 0.0,
            prompt_kv_bytes=sum(u.prompt_kv_bytes for u in usages),
            prompt_full_kv_bytes=sum(u.prompt_full_kv_bytes for u in usages),
            plan_budget=min(plans) if (plans := _plan_budgets(usages)) else 0.0,
            fallbacks=fallbacks,
            tag_counts=tags,
        )


def _plan_budgets(usages: Sequence[Any]) -> list[float]:
    return [b for u in usages if (b := getattr(u, "plan_budget", None)) is not None]


def fallback_counters(usage: Any) -> dict[str, int]:
    """The usage's fallback counters: ``tagger_fallbacks`` and any field named ``*fallback*``
    (a counter added to ``Usage`` later is recorded without touching the harness)."""
    names = [f.name for f in fields(usage)] if hasattr(usage, "__dataclass_fields__") else []
    out = {"tagger_fallbacks": int(getattr(usage, "tagger_fallbacks", 0))}
    for name in names:
        value = getattr(usage, name)
        if "fallback" in name and isinstance(value, int) and not isinstance(value, bool):
            out[name] = value
    return out


@dataclass(frozen=True, slots=True)
class Scored:
    """The scorer's verdict on one answer: right or not, a well-formed answer or not, why it
    failed, what it cost, and the workload's own fields for the row."""

    correct: bool
    valid_call: bool
    error: str
    measured: Measured
    detail: Mapping[str, Any] = field(default_factory=dict)


_MEASURED = tuple(f.name for f in fields(Measured) if f.name != "fallbacks")


@dataclass(frozen=True, slots=True)
class Row:
    """One case under one configuration, with the commit it ran at."""

    id: str
    group: str
    config: str  # the configuration's name without its budget (``Workload.config_name``)
    policy: str
    budget: float
    correct: bool
    valid_call: bool
    error: str
    measured: Measured
    seconds: float  # from submission to score: latency, not cost, when cases share batches
    git_commit: str
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, float, str]:
        return (self.config, self.budget, self.id)

    @property
    def label(self) -> str:
        """The configuration with its budget, as tables and paired comparisons name it."""
        return self.config if self.policy == "full" else f"{self.config} @ {self.budget:.2f}"

    @classmethod
    def of(
        cls,
        workload: Workload,
        case: Any,
        config_name: str,
        config: Config,
        scored: Scored,
        seconds: float,
        run: Mapping[str, Any],
    ) -> Row:
        return cls(
            workload.case_id(case), workload.group(case), config_name, config.policy_name,
            config.budget, scored.correct, scored.valid_call, scored.error, scored.measured,
            round(seconds, 3), str(run.get("git_commit", "")), dict(scored.detail),
        )  # fmt: skip

    def to_json(self, group_key: str) -> dict[str, Any]:
        m = self.measured
        out: dict[str, Any] = {
            "id": self.id, group_key: self.group, "config": self.config, "policy": self.policy,
            "budget": self.budget, "correct": self.correct, "valid_call": self.valid_call,
            "error": self.error, **{name: getattr(m, name) for name in _MEASURED},
            **m.fallbacks, "seconds": self.seconds, "git_commit": self.git_commit,
        }  # fmt: skip
        clash = set(out) & set(self.detail)
        if clash:
            raise ConfigError(f"a workload's row detail reuses the harness's keys {clash}")
        return {**out, **self.detail}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], workload: Workload) -> Row:
        """A row as written by ``to_json`` or by the eval before the harness (upgraded)."""
        d = workload.upgrade_row(dict(data))
        fallbacks = {k: d.pop(k) for k in list(d) if "fallback" in k and isinstance(d[k], int)}
        measured = {name: d.pop(name) for name in _MEASURED if name in d}
        measured.setdefault("pooled_b", measured.get("measured_b", 0.0))
        policy = d.pop("policy")
        return cls(
            id=str(d.pop("id")),
            group=str(d.pop(workload.group_key, "")),
            config=d.pop("config", policy),
            policy=policy,
            budget=float(d.pop("budget")),
            correct=bool(d.pop("correct")),
            valid_call=bool(d.pop("valid_call", True)),
            error=d.pop("error", "") or "",
            measured=Measured.values(**measured, fallbacks=fallbacks),
            seconds=float(d.pop("seconds", 0.0)),
            git_commit=d.pop("git_commit", ""),
            detail=d,
        )


class RowFile:
    """``<out>.jsonl``: appended to as rows finish, rewritten in case order, resumed."""

    def __init__(self, path: Path, workload: Workload) -> None:
        self.path = path
        self.workload = workload

    def resume(
        self, settings: Mapping[str, Any], planned: set[tuple[str, float, str]]
    ) -> dict[tuple[str, float, str], Row]:
        """The rows an earlier, stopped run of the same plan wrote (none without a file).

        Raises
        ------
        ConfigError
            The file was written with other settings, or holds a line that is not a row.
        """
        if not self.path.is_file():
            return {}
        rows = read_rows(self.path, self.workload, tolerate_cut=True)
        meta = self.path.with_suffix(".json")
        if rows and meta.is_file():
            before = json.loads(meta.read_text(encoding="utf-8")).get("settings")
            now = json.loads(json.dumps(dict(settings), default=str))
            if before != now:
                changed = sorted(k for k in {**now, **(before or {})}
                                 if (before or {}).get(k) != now.get(k))  # fmt: skip
                raise ConfigError(
                    f"{self.path} holds rows of a run with other settings ({', '.join(changed)}"
                    "); resume it with the same ones, pass --restart, or choose another --out"
                )
        return {r.key: r for r in rows if r.key in planned}

    def append(self, row: Row) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row.to_json(self.workload.group_key), ensure_ascii=False) + "\n")

    def rewrite(self, rows: Sequence[Row]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        key = self.workload.group_key
        text = "".join(json.dumps(r.to_json(key), ensure_ascii=False) + "\n" for r in rows)
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(self.path)  # a kill mid-write leaves the old file, never half of one


def read_rows(path: Path, workload: Workload, *, tolerate_cut: bool = False) -> list[Row]:
    """Every row of a JSONL file; with ``tolerate_cut`` a last line without its newline (a
    process killed while writing it) is dropped.

    Raises
    ------
    ConfigError
        The file is missing, or a line is not a row of this workload.
    """
    if not path.is_file():
        raise ConfigError(f"no results at {path}")
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    if tolerate_cut and lines and lines[-1].strip():
        lines = lines[:-1]  # written without its newline: cut short
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(Row.from_json(json.loads(line), workload))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"{path}:{n}: not a {workload.name} result row ({type(exc).__name__}: {exc})"
            ) from exc
    return rows
