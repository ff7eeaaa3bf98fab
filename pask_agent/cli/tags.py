"""``pask-agent tags``: an output's tokens with their structural tags, to check them by eye."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "tags", help="print an output's tokens with their decode tags (cls, role, state, next)"
    )
    p.add_argument("--model", default="default", help="bundled name or HF folder (tokenizer only)")
    p.add_argument(
        "--tools", required=True, help="JSON file with a list of tools (any ToolSpec form)"
    )
    p.add_argument("--output", required=True, help="the assistant output text to tag")
    p.add_argument(
        "--tool-choice", default="auto", help="auto, required, any, none or a tool's name"
    )
    parallel = p.add_mutually_exclusive_group()
    parallel.add_argument(
        "--parallel",
        action="store_true",
        default=None,
        help="the output's calls are an array (default: inferred, calls starting with '[')",
    )
    parallel.add_argument("--no-parallel", dest="parallel", action="store_false")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pask_agent.errors import GrammarRejectedError
    from pask_agent.grammars.json.tagger import FunctionCallTagger
    from pask_agent.grammars.token_text import token_texts
    from pask_agent.grammars.tool_spec import load_tool_specs
    from pask_agent.runtime.models.loading import load_tokenizer
    from pask_agent.runtime.turns.mixed_output import split_output

    tools = load_tool_specs(args.tools)
    parallel = args.parallel
    if parallel is None:  # the calls may follow text (tool_choice="auto")
        parallel = (split_output(args.output)[1] or "").startswith("[")
    tagger = FunctionCallTagger(tools, parallel=parallel, tool_choice=args.tool_choice)
    tokenizer = load_tokenizer(args.model)
    ids = tokenizer(args.output, add_special_tokens=False)["input_ids"]
    if not args.json:
        print(f"{'index':>5}  {'token':<24}  {'cls':<15}  {'role':<18}  {'state':<8}  next")
    for index, (token_id, piece) in enumerate(zip(ids, token_texts(tokenizer, ids), strict=True)):
        try:
            tag = tagger.feed(piece)
        except GrammarRejectedError as exc:
            print(f"pask-agent tags: rejected: {exc}", file=sys.stderr)
            return 1
        if args.json:
            row = {"index": index, "id": token_id, "text": piece, **_fields(tag)}
            print(json.dumps(row, ensure_ascii=False))
        else:
            print(
                f"{index:>5}  {piece!r:<24}  {tag.cls:<15}  {tag.role:<18}  {tag.state:<8}  "
                f"{tag.next}"
            )
    if not tagger.is_complete:
        print(
            f"incomplete: the output stops before the grammar allows it to end ({len(ids)} "
            "tokens read)",
            file=sys.stderr,
        )
        return 1
    if not args.json:
        print(f"\n{len(ids)} tokens; the output is complete")
    return 0


def _fields(tag: Any) -> dict[str, str]:
    return {"cls": tag.cls, "role": tag.role, "state": tag.state, "next": tag.next}
