"""``pask-agent census``: count decode tag buckets over BFCL ground-truth calls (App. A.1)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pask_agent.errors import ConfigError
from pask_agent.eval.bfcl import NON_LIVE_CATEGORIES

if TYPE_CHECKING:
    from pask_agent.grammars.census import TagCensus


def add_parser(sub: Any) -> None:
    p = sub.add_parser("census", help="count tag buckets over the BFCL non-live ground-truth calls")
    p.add_argument("--model", default="default", help="bundled name or HF folder (tokenizer only)")
    p.add_argument(
        "--out", default="results/tag_census.json", help="JSON output; a .md is written beside it"
    )
    p.add_argument(
        "--categories",
        nargs="+",
        default=list(NON_LIVE_CATEGORIES),
        help="BFCL categories (default: the four non-live ones, 1000 cases)",
    )
    p.add_argument("--limit", type=int, default=None, help="first N cases per category")
    p.add_argument(
        "--tool-choice",
        default="auto",
        choices=["auto", "required", "any"],
        help="the grammar mode the tags assume (auto: the first token decides call vs text)",
    )
    p.add_argument(
        "--mixed",
        action="store_true",
        help="answer as a mixed turn, the way the default model does under auto in agent "
        "conversations: 'I will call <name>.' then the calls on their own line",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pask_agent.grammars.census import write_census

    census = bfcl_census(
        args.model, categories=args.categories, limit=args.limit, tool_choice=args.tool_choice,
        mixed=args.mixed,
    )  # fmt: skip
    json_path, md_path = write_census(census, args.out)
    print(
        f"{census.cases} cases, {census.tokens} tokens, {census.distinct_buckets} distinct "
        f"buckets ({len(census.rejected)} answers rejected by the grammar)"
    )
    print(f"wrote {json_path} and {md_path}")
    return 0


def bfcl_census(
    model: str,
    *,
    categories: Sequence[str] = NON_LIVE_CATEGORIES,
    limit: int | None = None,
    tool_choice: str = "auto",
    mixed: bool = False,
) -> TagCensus:
    """The census over BFCL categories for a bundled model (tokenizer and config only).

    ``mixed``: each answer is a mixed turn, prose before the calls (``I will call <name>.``
    then the reference calls on a line of their own; ``tool_choice`` must be auto), so the
    census covers the ``text`` class as well.

    Lives here, not in ``grammars``: it joins the BFCL loader (``eval``), the model files
    (``runtime``) and the layer grouping (``policy``), which the census itself must not import.
    """
    from pask_agent.eval.bfcl import ground_truth_text, load_bfcl
    from pask_agent.grammars.census import tag_census
    from pask_agent.policy.actions import LayerGroups
    from pask_agent.runtime.models.loading import load_tokenizer, resolve_model_dir

    config = json.loads((resolve_model_dir(model) / "config.json").read_text(encoding="utf-8"))
    groups = LayerGroups.for_layers(int(config["num_hidden_layers"]))
    cases = [case for category in categories for case in load_bfcl(category, limit=limit)]

    def answer(case: Any) -> str:
        calls = ground_truth_text(case)
        if not mixed:
            return calls
        names = " and ".join(dict.fromkeys(next(iter(g)) for g in case.ground_truth))
        return f"I will call {names}.\n{calls}"

    if mixed and tool_choice != "auto":
        raise ConfigError("--mixed answers mix prose and calls, which only tool_choice auto allows")
    return tag_census(
        load_tokenizer(model),
        cases,
        answer_text=answer,
        model=model,
        layer_ranges=[groups.layers_of(g) for g in range(groups.count)],
        tool_choice=tool_choice,
    )
