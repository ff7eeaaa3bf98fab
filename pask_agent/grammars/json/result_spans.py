"""Tool results in a conversation's history, labelled by their JSON structure.

An agent's KV cache grows with tool results: lists of flights, files or orders of hundreds of
tokens each, turn after turn. A later call needs the ids, prices and names inside them, not
their braces, quotes and commas. Labelled as plain ``protected_content`` a result can only be
kept or dropped by position; parsed, its characters say what they are, in the labels the
prefill planner already knows: object keys are ``parameter_key``, values (strings, numbers,
``true``/``false``/``null``) stay ``protected_content`` (a later call may copy them), and the
structure between them is ``schema_scaffold``, which the table releases first.

A result is found by its own text (the tool message's content) in the rendered prompt, so any
chat template's wrapping works. A result that is not one valid JSON value is prose and keeps
its ordinary label, never an error.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pask_agent.grammars.json.history_spans import label_runs
from pask_agent.grammars.span_labels import CharSpan

_KEY, _VALUE, _SCAFFOLD = "parameter_key", "protected_content", "schema_scaffold"
_PUNCT = frozenset("{}[],: \t\r\n")


def tool_result_spans(text: str, results: Sequence[str]) -> list[CharSpan]:
    """Span labels for each tool result of ``results`` (message contents, in conversation
    order) where it appears in ``text``, the rendered prompt; see the module doc."""
    spans: list[CharSpan] = []
    end = len(text)
    for body in reversed(results):  # from the end: a result is rendered after all it answers
        if not body.strip():
            continue
        start = text.rfind(body, 0, end)
        if start < 0:
            continue  # the template rewrote it: leave it to the ordinary labels
        end = start
        spans.extend(json_structure_spans(body, start))
    return spans


def json_structure_spans(body: str, offset: int = 0) -> list[CharSpan]:
    """``(start, end, label)`` runs over ``body`` (shifted by ``offset``) if it is one JSON
    value: keys, values and the scaffold between them; ``[]`` for anything else."""
    try:
        json.loads(body)
    except (ValueError, RecursionError):
        return []
    labels: list[str] = []
    i, n = 0, len(body)
    while i < n:
        ch = body[i]
        if ch in _PUNCT:
            labels.append(_SCAFFOLD)
            i += 1
        elif ch == '"':
            end = _string_end(body, i)
            after = end
            while after < n and body[after] in " \t\r\n":
                after += 1
            inner = _KEY if after < n and body[after] == ":" else _VALUE
            labels += [_SCAFFOLD] + [inner] * (end - i - 2) + [_SCAFFOLD]
            i = end
        else:  # a number or a literal: runs to the next scaffold character
            end = i
            while end < n and body[end] not in _PUNCT:
                end += 1
            labels += [_VALUE] * (end - i)
            i = end
    return label_runs(offset, labels)


def _string_end(body: str, start: int) -> int:
    """Index just past the string literal opening at ``start`` (the body parsed as JSON)."""
    i = start + 1
    while body[i] != '"':
        i += 2 if body[i] == "\\" else 1
    return i + 1
