"""The tag census: how many generated tokens fall in each decode bucket (§3.3, App. A.1–A.2).

Calibration measures task-error sensitivity and distortion per bucket ``(cls, role, state,
next)`` × layer group, so before calibrating we want to know which buckets real tool calls
populate and how often. The census tags reference answers (the CLI feeds BFCL's ground truth)
token by token with ``FunctionCallTagger`` on a model's tokenizer and counts buckets. Every token
yields one lookup key per layer group (``q = (z, c)``), so each token counts once in every group;
the per-group tables carry the layer ranges the keys apply to.

The census knows nothing of where cases come from or how layers are grouped: a case is anything
with an id, a category, tool functions and a parallel flag (``CensusCase``), its answer text
comes from the caller's ``answer_text``, and the layer groups arrive as plain ranges. That keeps
``grammars`` below ``policy``, ``runtime`` and ``eval``. Answers the grammar rejects (BFCL lists a
few that contradict their own schema) are listed, not counted.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pask_agent.errors import ConfigError, GrammarRejectedError, ToolChoiceError
from pask_agent.grammars.json.tagger import FunctionCallTagger
from pask_agent.grammars.tags import VOCABULARIES
from pask_agent.grammars.token_text import token_texts

GROUP_NAMES: tuple[str, ...] = ("lower", "middle", "upper")
_CHOICES = ("auto", "required", "any")


class CensusCase(Protocol):
    """What the census reads from a case (``eval.bfcl.BfclCase`` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def category(self) -> str: ...

    @property
    def functions(self) -> Sequence[Mapping[str, Any]]: ...

    @property
    def parallel(self) -> bool: ...


C = TypeVar("C", bound=CensusCase)


@dataclass(frozen=True, slots=True)
class TagCensus:
    """Bucket counts over a set of ground-truth calls (one model's tokenizer).

    ``buckets`` pairs a tag key ``cls/role/state/next`` with its token count, most frequent
    first; ``categories`` gives ``(category, cases tagged, tokens)``; ``rejected`` holds
    ``(case id, reason)`` for answers the grammar rejects. ``layer_ranges`` holds the layers of
    the lower, middle and upper group, in order.
    """

    model: str
    tool_choice: str
    layer_ranges: tuple[range, ...]
    cases: int
    tokens: int
    buckets: tuple[tuple[str, int], ...]
    categories: tuple[tuple[str, int, int], ...]
    rejected: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        ranges = self.layer_ranges
        contiguous = all(a.stop == b.start for a, b in zip(ranges, ranges[1:], strict=False))
        if len(ranges) != len(GROUP_NAMES) or not contiguous or ranges[0].start != 0:
            raise ConfigError(
                f"layer_ranges must be {len(GROUP_NAMES)} contiguous ranges from layer 0 "
                f"({', '.join(GROUP_NAMES)}), got {list(ranges)}"
            )

    @property
    def num_layers(self) -> int:
        return self.layer_ranges[-1].stop

    @property
    def distinct_buckets(self) -> int:
        return len(self.buckets)

    def group_rows(self) -> list[dict[str, Any]]:
        """One row per layer group: its layers and its (bucket, group) counts."""
        rows = []
        for group, (name, layers) in enumerate(zip(GROUP_NAMES, self.layer_ranges, strict=True)):
            rows.append(
                {
                    "group": group,
                    "name": name,
                    "layers": [layers.start, layers.stop - 1],
                    "tokens": self.tokens,
                    "distinct_buckets": self.distinct_buckets,
                    "buckets": dict(self.buckets),
                }
            )
        return rows

    def marginals(self) -> dict[str, dict[str, int]]:
        """Token counts per value of each tag component (all vocabulary values listed)."""
        vocab = VOCABULARIES["function_calling"]
        out = {field: dict.fromkeys(vocab[field], 0) for field in ("cls", "role", "state", "next")}
        for key, count in self.buckets:
            for field, value in zip(("cls", "role", "state", "next"), key.split("/"), strict=True):
                out[field][value] += count
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "family": "function_calling",
            "tool_choice": self.tool_choice,
            "num_layers": self.num_layers,
            "cases": self.cases,
            "tokens": self.tokens,
            "distinct_buckets": self.distinct_buckets,
            "distinct_bucket_group_keys": self.distinct_buckets * len(self.layer_ranges),
            "buckets": dict(self.buckets),
            "marginals": self.marginals(),
            "layer_groups": self.group_rows(),
            "categories": [{"category": c, "cases": n, "tokens": t} for c, n, t in self.categories],
            "rejected": [{"id": i, "reason": r} for i, r in self.rejected],
        }

    def to_markdown(self) -> str:
        lines = [
            f"# Tag census: {self.model} (function calling)",
            "",
            f"{self.cases} BFCL ground-truth answers, {self.tokens} tokens, tool_choice "
            f"`{self.tool_choice}`: **{self.distinct_buckets} distinct buckets** "
            f"(× {len(self.layer_ranges)} layer groups = "
            f"{self.distinct_buckets * len(self.layer_ranges)} decode lookup keys).",
            "",
            "| category | cases | tokens |",
            "| --- | ---: | ---: |",
            *(f"| {c} | {n} | {t} |" for c, n, t in self.categories),
            "",
            "| bucket (cls / role / state / next) | tokens | share |",
            "| --- | ---: | ---: |",
            *(
                f"| {key.replace('/', ' / ')} | {count} | {count / max(self.tokens, 1):.1%} |"
                for key, count in self.buckets
            ),
            "",
            "Each token counts once in every layer group:",
            "",
            "| group | layers | tokens | distinct buckets |",
            "| --- | --- | ---: | ---: |",
            *(
                f"| {r['name']} | {r['layers'][0]}–{r['layers'][1]} | {r['tokens']} | "
                f"{r['distinct_buckets']} |"
                for r in self.group_rows()
            ),
            "",
            "| component | value | tokens |",
            "| --- | --- | ---: |",
        ]
        for field, counts in self.marginals().items():
            lines.extend(f"| {field} | {value} | {n} |" for value, n in counts.items())
        if self.rejected:
            lines += ["", "Answers the grammar rejects (not counted):", ""]
            lines += [f"- `{case_id}`: {reason}" for case_id, reason in self.rejected]
        return "\n".join(lines) + "\n"


def tag_census(
    tokenizer: Any,
    cases: Iterable[C],
    *,
    answer_text: Callable[[C], str],
    model: str,
    layer_ranges: Sequence[range],
    tool_choice: str = "auto",
) -> TagCensus:
    """Tag every case's answer (``answer_text(case)``) with ``tokenizer``'s tokens and count
    buckets. ``answer_text`` may raise ``ConfigError`` or ``GrammarRejectedError`` for a case
    with no usable answer; that case is listed under ``rejected``.

    Raises
    ------
    ToolChoiceError
        ``tool_choice`` is not auto/required/any (ground truth always calls a tool).
    """
    if tool_choice not in _CHOICES:
        raise ToolChoiceError(
            f"the census tags calls, so tool_choice must be one of {', '.join(_CHOICES)}; "
            f"got {tool_choice!r}"
        )
    buckets: Counter[str] = Counter()
    per_category: dict[str, list[int]] = {}
    rejected: list[tuple[str, str]] = []
    for case in cases:
        row = per_category.setdefault(case.category, [0, 0])
        try:
            text = answer_text(case)
            tagger = FunctionCallTagger(
                case.functions, parallel=case.parallel, tool_choice=tool_choice
            )
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            keys = [tagger.feed(piece).key() for piece in token_texts(tokenizer, ids)]
        except (GrammarRejectedError, ConfigError) as exc:
            rejected.append((case.id, str(exc)))
            continue
        if not tagger.is_complete:
            rejected.append((case.id, "the answer ends before the call is complete"))
            continue
        buckets.update(keys)
        row[0] += 1
        row[1] += len(keys)
    return TagCensus(
        model=model,
        tool_choice=tool_choice,
        layer_ranges=tuple(layer_ranges),
        cases=sum(r[0] for r in per_category.values()),
        tokens=sum(buckets.values()),
        buckets=tuple(sorted(buckets.items(), key=lambda kv: (-kv[1], kv[0]))),
        categories=tuple((c, n, t) for c, (n, t) in per_category.items()),
        rejected=tuple(rejected),
    )


def write_census(census: TagCensus, out: str | Path) -> tuple[Path, Path]:
    """Write ``out`` (JSON) and the same path with ``.md``, each saying which command, commit
    and machine made it; returns both paths."""
    from pask_agent.record.provenance import provenance

    run = provenance()
    json_path = Path(out)
    md_path = json_path.with_suffix(".md")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    body = {**census.to_dict(), **run}
    json_path.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    source = f"Command: `{run['command']}` at commit `{run['git_commit']}` on {run['machine']}."
    md_path.write_text(census.to_markdown() + f"\n{source}\n", encoding="utf-8")
    return json_path, md_path
