"""The tag census: how many generated tokens fall in each decode bucket (§3.3, App. A.1–A.2).

Calibration measures task-error sensitivity and distortion per bucket ``(cls, role, state,
next)`` × layer group, so before calibrating we want to know which buckets real tool calls
populate and how often. The census tags the ground-truth answers of the BFCL non-live cases
(``bfcl.ground_truth_text``) token by token with ``FunctionCallTagger`` on a model's tokenizer
and counts buckets. Every token yields one lookup key per layer group (``q = (z, c)``), so each
token counts once in every group; the per-group tables carry the layer ranges the keys apply to.

Answers the grammar rejects (BFCL lists a few that contradict their own schema) are listed, not
counted.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pask_agent.errors import ConfigError, GrammarRejectedError, ToolChoiceError
from pask_agent.grammars.bfcl import NON_LIVE_CATEGORIES, BfclCase, ground_truth_text, load_bfcl
from pask_agent.grammars.fc_tagger import FunctionCallTagger
from pask_agent.grammars.tags import VOCABULARIES
from pask_agent.grammars.token_text import token_texts
from pask_agent.policy.actions import LayerGroups

GROUP_NAMES: tuple[str, ...] = ("lower", "middle", "upper")
_CHOICES = ("auto", "required", "any")


@dataclass(frozen=True, slots=True)
class TagCensus:
    """Bucket counts over a set of ground-truth calls (one model's tokenizer).

    ``buckets`` pairs a tag key ``cls/role/state/next`` with its token count, most frequent
    first; ``categories`` gives ``(category, cases tagged, tokens)``; ``rejected`` holds
    ``(case id, reason)`` for answers the grammar rejects.
    """

    model: str
    tool_choice: str
    layer_groups: LayerGroups
    cases: int
    tokens: int
    buckets: tuple[tuple[str, int], ...]
    categories: tuple[tuple[str, int, int], ...]
    rejected: tuple[tuple[str, str], ...]

    @property
    def distinct_buckets(self) -> int:
        return len(self.buckets)

    def group_rows(self) -> list[dict[str, Any]]:
        """One row per layer group: its layers and its (bucket, group) counts."""
        rows = []
        for group, name in enumerate(GROUP_NAMES):
            layers = self.layer_groups.layers_of(group)
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
            "num_layers": self.layer_groups.num_layers,
            "cases": self.cases,
            "tokens": self.tokens,
            "distinct_buckets": self.distinct_buckets,
            "distinct_bucket_group_keys": self.distinct_buckets * self.layer_groups.count,
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
            f"(× {self.layer_groups.count} layer groups = "
            f"{self.distinct_buckets * self.layer_groups.count} decode lookup keys).",
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
    cases: Iterable[BfclCase],
    *,
    model: str,
    layer_groups: LayerGroups,
    tool_choice: str = "auto",
) -> TagCensus:
    """Tag every case's ground-truth answer with ``tokenizer``'s tokens and count buckets.

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
            text = ground_truth_text(case)
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
        layer_groups=layer_groups,
        cases=sum(r[0] for r in per_category.values()),
        tokens=sum(buckets.values()),
        buckets=tuple(sorted(buckets.items(), key=lambda kv: (-kv[1], kv[0]))),
        categories=tuple((c, n, t) for c, (n, t) in per_category.items()),
        rejected=tuple(rejected),
    )


def bfcl_census(
    model: str,
    *,
    categories: Sequence[str] = NON_LIVE_CATEGORIES,
    limit: int | None = None,
    tool_choice: str = "auto",
) -> TagCensus:
    """The census over BFCL categories for a bundled model (tokenizer and config only)."""
    from pask_agent.runtime.models import load_tokenizer, resolve_model_dir

    config = json.loads((resolve_model_dir(model) / "config.json").read_text(encoding="utf-8"))
    layers = LayerGroups.for_layers(int(config["num_hidden_layers"]))
    cases = [case for category in categories for case in load_bfcl(category, limit=limit)]
    return tag_census(
        load_tokenizer(model), cases, model=model, layer_groups=layers, tool_choice=tool_choice
    )


def write_census(census: TagCensus, out: str | Path) -> tuple[Path, Path]:
    """Write ``out`` (JSON) and the same path with ``.md``; returns both paths."""
    json_path = Path(out)
    md_path = json_path.with_suffix(".md")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(census.to_dict(), indent=2) + "\n", encoding="utf-8")
    md_path.write_text(census.to_markdown(), encoding="utf-8")
    return json_path, md_path
