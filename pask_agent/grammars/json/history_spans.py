"""Earlier calls in a conversation's history, labelled by structure for the prefill planner.

An assistant turn's calls come back in every later prompt (the chat template renders them,
wrapped in the template's own markup). Labelled as plain ``protected_content`` they can only
be kept or dropped by position. Re-reading each rendered call with the tagger's own scanner
(``lexer`` over the same ``nodes``) recovers what every character was when it was generated
(tool name, argument key, enum value, free value, scaffold), and the prompt's span labels say
the same thing to the planner: the tool name is a ``function_name``, keys are
``parameter_key``, enum and literal values ``enum_constraint``, free argument values stay
``protected_content`` (a later turn may need them), and braces, quotes and separators are
``schema_scaffold``. The planner then demotes old calls by structure, scaffold first.

A call is recognised only where the whole of ``{"name": <one of the tools>, "arguments":
{...}}`` in the grammar's layout (``json.dumps``'s separators, keys in schema order, which is
what Qwen2.5's template writes) parses; anything else keeps its ordinary label.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pask_agent.grammars.json.frames import Stack
from pask_agent.grammars.json.layout import JsonLayout
from pask_agent.grammars.json.lexer import Reject, initial, step
from pask_agent.grammars.json.nodes import Kind, Node, output_node
from pask_agent.grammars.span_labels import LABEL_PRIORITY, CharSpan
from pask_agent.grammars.tool_spec import ToolSpec

_KIND_LABEL: dict[Kind, str] = {
    Kind.TOOL_NAME: "function_name",
    Kind.ARG_KEY: "parameter_key",
    Kind.LITERAL: "enum_constraint",
    Kind.VALUE_FIRST: "protected_content",
    Kind.VALUE_REST: "protected_content",
    Kind.SPACE: "schema_scaffold",
    Kind.PUNCT: "schema_scaffold",
    Kind.QUOTE: "schema_scaffold",
    Kind.FIXED_KEY: "schema_scaffold",
}
_RANK = {label: i for i, label in enumerate(LABEL_PRIORITY)}
_CALL_OPENING = re.compile(r'\{"name": "')
# Markup a chat template wraps a rendered call in (Qwen2.5's): scaffold like the call's braces.
_WRAPPERS = (("<tool_call>\n", "\n</tool_call>"),)


def history_call_spans(text: str, tools: Sequence[ToolSpec]) -> list[CharSpan]:
    """Span labels for every complete call of ``tools`` written in ``text`` (see the module
    doc); spans are ``(start, end, label)`` character ranges, as ``label_prompt_spans``'s."""
    if not tools:
        return []
    node = output_node(tools, parallel=False, calls=True, text=False, layout=JsonLayout())
    spans: list[CharSpan] = []
    done = 0
    for match in _CALL_OPENING.finditer(text):
        start = match.start()
        if start < done:
            continue  # inside a call already labelled (a nested argument object)
        labels = _scan_call(node, text, start)
        if labels is None:
            continue
        done = start + len(labels)
        spans.extend(label_runs(start, labels))
        for opening, closing in _WRAPPERS:
            if text.endswith(opening, 0, start) and text.startswith(closing, done):
                spans.append((start - len(opening), start, "schema_scaffold"))
                spans.append((done, done + len(closing), "schema_scaffold"))
    return spans


def _scan_call(node: Node, text: str, start: int) -> list[str] | None:
    """The label of each character of the call starting at ``start``; None if none does."""
    configs: tuple[Stack, ...] = (initial(node),)
    labels: list[str] = []
    for ch in text[start:]:
        survivors: list[Stack] = []
        best: str | None = None
        for config in configs:
            try:
                results = step(config, ch)
            except Reject:
                continue
            for new, kind, _ in results:
                survivors.append(new)
                label = _KIND_LABEL.get(kind, "protected_content")
                if best is None or _RANK[label] < _RANK[best]:
                    best = label  # where parses disagree, the more protective label wins
        if best is None:
            return None
        labels.append(best)
        if any(s is None for s in survivors):  # the call's closing brace
            return labels
        configs = tuple(dict.fromkeys(survivors))
    return None  # the text ended inside the call


def label_runs(start: int, labels: list[str]) -> list[CharSpan]:
    """``(start, end, label)`` for each run of equal labels, the first at ``start``."""
    out: list[CharSpan] = []
    run_start = 0
    for i in range(1, len(labels) + 1):
        if i == len(labels) or labels[i] != labels[run_start]:
            out.append((start + run_start, start + i, labels[run_start]))
            run_start = i
    return out
