"""``pask-agent spans``: a rendered tool prompt, token by token, with its Table-6 span labels."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "spans", help="print a tool prompt's tokens with their prefill span labels (App. A.3)"
    )
    p.add_argument("--model", default="default", help="bundled name, HF folder or .gguf file")
    p.add_argument(
        "--tools", required=True, help="JSON file with a list of tools (any ToolSpec form)"
    )
    p.add_argument("--prompt", required=True, help="the user message")
    p.add_argument("--system", default=None, help="an optional system message")
    p.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pask_agent.grammars.prompt import render_tool_prompt
    from pask_agent.grammars.span_labels import label_prompt_tokens
    from pask_agent.grammars.tool_spec import load_tool_specs
    from pask_agent.runtime.models.loading import load_tokenizer

    tools = load_tool_specs(args.tools)
    tokenizer = load_tokenizer(args.model)
    messages = [{"role": "user", "content": args.prompt}]
    if args.system is not None:
        messages.insert(0, {"role": "system", "content": args.system})
    text = render_tool_prompt(tokenizer, messages, tools)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    labels = label_prompt_tokens(text, tokenizer, tools)
    pieces = [tokenizer.decode([i]) for i in ids]
    if args.json:
        for index, (token_id, piece, label) in enumerate(zip(ids, pieces, labels, strict=True)):
            print(json.dumps({"index": index, "id": token_id, "text": piece, "label": label}))
        return 0
    print(f"{'index':>5}  {'token':<28}  label")
    for index, (piece, label) in enumerate(zip(pieces, labels, strict=True)):
        print(f"{index:>5}  {repr(piece):<28}  {label}")
    counts = Counter(labels)
    print(f"\n{len(ids)} tokens: " + ", ".join(f"{k} {v}" for k, v in counts.most_common()))
    return 0
