"""Prompt span labels for the prefill companion (paper §3.6, App. A.3, Table 6).

All prompt text starts as ``protected_content``. A span becomes schema text only after it is
validated: it must parse as a JSON tool (OpenAI ``{"type": "function", "function": {...}}`` or a
bare ``{"name", "description", "parameters"}`` function doc) whose name is one of the given tools
and whose schema ``ToolSpec.from_any`` accepts. Inside a validated span:

* function names → ``function_name``; property names and entries of ``required`` →
  ``parameter_key``; ``type`` values (and ``format``) → ``type_constraint``; ``enum``/``const``
  values → ``enum_constraint``; ``description``/``title`` text → ``schema_description``;
* everything else (braces, quotes, keys such as ``"type"`` or ``"properties"``, defaults,
  whitespace) → ``schema_scaffold``.

String labels cover the characters between the quotes; the quotes are scaffold. Labels reach
tokens through the tokenizer's offset mapping (``labels_for_tokens``), which the SQL DDL
labeller reuses.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pask_agent.errors import SchemaError
from pask_agent.grammars.tags import SPAN_LABELS
from pask_agent.grammars.tool_spec import ToolSpec, tool_specs

CharSpan = tuple[int, int, str]

# Most protective first. A token whose characters carry several labels gets the first of them
# in this order: user-visible content first, then the identifiers a call must copy verbatim
# (names, keys, enum values), then type constraints, descriptions, and plain JSON scaffold.
LABEL_PRIORITY: tuple[str, ...] = (
    "protected_content",
    "function_name",
    "parameter_key",
    "enum_constraint",
    "type_constraint",
    "schema_description",
    "schema_scaffold",
    "template_text",
    "unlinked_schema",
)

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_SCALAR = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")
_WS = re.compile(r"\s*")
_DECODER = json.JSONDecoder()

# Schema keyword → how its value is labelled.
_SCHEMA_KEYS = {
    "type": "types",
    "format": "types",
    "description": "description",
    "title": "description",
    "properties": "props",
    "required": "required",
    "enum": "enum",
    "const": "enum",
    "items": "schema",
    "additionalProperties": "schema",
    "not": "schema",
    "anyOf": "schemas",
    "oneOf": "schemas",
    "allOf": "schemas",
    "prefixItems": "schemas",
    "$defs": "defs",
    "definitions": "defs",
}
_FUNCTION_KEYS = {"name": "name", "description": "description", "parameters": "schema"}
_STRING_LABELS = {
    "name": "function_name",
    "description": "schema_description",
    "types": "type_constraint",
    "required": "parameter_key",
    "enum": "enum_constraint",
}


def find_tool_spans(text: str, tools: Sequence[ToolSpec]) -> list[tuple[int, int, ToolSpec]]:
    """Character spans of validated tool JSON in ``text``, in order, non-overlapping."""
    by_name = {tool.name: tool for tool in tool_specs(tools)} if tools else {}
    found = []
    i = text.find("{")
    while i != -1:
        match = _validated_tool(text, i, by_name)
        if match is None:
            i = text.find("{", i + 1)
            continue
        end, tool = match
        found.append((i, end, tool))
        i = text.find("{", end)
    return found


def spans_of_char_labels(labels: Sequence[str]) -> list[CharSpan]:
    """One label per character → the sorted partition into maximal same-label spans."""
    spans: list[CharSpan] = []
    for i, label in enumerate(labels):
        if spans and spans[-1][2] == label and spans[-1][1] == i:
            spans[-1] = (spans[-1][0], i + 1, label)
        else:
            spans.append((i, i + 1, label))
    return spans


def label_prompt_spans(text: str, tools: Sequence[ToolSpec]) -> list[CharSpan]:
    """Table-6 labels as a sorted partition of ``text`` into ``(start, end, label)`` spans.

    Characters outside validated tool spans are ``protected_content``; adjacent spans with the
    same label are merged.
    """
    labels = ["protected_content"] * len(text)
    for start, end, _tool in find_tool_spans(text, tools):
        labels[start:end] = ["schema_scaffold"] * (end - start)
        for s, e, label in _label_tool_json(text, start, end):
            labels[s:e] = [label] * (e - s)
    return spans_of_char_labels(labels)


def token_label_candidates(
    text: str, char_spans: Sequence[CharSpan], tokenizer: Any, *, add_special_tokens: bool = False
) -> list[tuple[str, ...]]:
    """For each token of ``tokenizer(text)``, every label its characters carry (in text order).

    ``char_spans`` may be partial and may overlap: characters no span covers are
    ``protected_content``, and a later span overrides an earlier one. A token with no
    characters (an added BOS) is ``protected_content``. Tokenize the prompt the same way here
    and in the runtime (``add_special_tokens``), or the labels will not line up.

    Raises
    ------
    SchemaError
        A span uses a label outside Table 6, or lies outside the text.
    """
    per_char = ["protected_content"] * len(text)
    for start, end, label in char_spans:
        if label not in SPAN_LABELS:
            raise SchemaError(f"unknown span label {label!r}; use one of {SPAN_LABELS}")
        if not 0 <= start <= end <= len(text):
            raise SchemaError(f"span ({start}, {end}) lies outside a text of {len(text)} chars")
        per_char[start:end] = [label] * (end - start)
    encoded = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    out = []
    for start, end in encoded["offset_mapping"]:
        seen = dict.fromkeys(per_char[start:end]) or {"protected_content": None}
        out.append(tuple(seen))
    return out


def labels_for_tokens(
    text: str, char_spans: Sequence[CharSpan], tokenizer: Any, *, add_special_tokens: bool = False
) -> list[str]:
    """One label per token: of the labels a token's characters carry, the first in
    ``LABEL_PRIORITY`` (App. A.3: cross-boundary tokens combine conservatively). Callers that
    combine actions and floors per label themselves can use ``token_label_candidates``.
    """
    rank = {label: i for i, label in enumerate(LABEL_PRIORITY)}
    return [
        min(candidates, key=rank.__getitem__)
        for candidates in token_label_candidates(
            text, char_spans, tokenizer, add_special_tokens=add_special_tokens
        )
    ]


def label_prompt_tokens(
    text: str, tokenizer: Any, tools: Sequence[ToolSpec], *, add_special_tokens: bool = False
) -> list[str]:
    """Table-6 label of every prompt token (see ``labels_for_tokens`` for the combination)."""
    return labels_for_tokens(
        text, label_prompt_spans(text, tools), tokenizer, add_special_tokens=add_special_tokens
    )


# -- validation ------------------------------------------------------------------------------
def _tool_name(obj: Any) -> str | None:
    if not isinstance(obj, dict):
        return None
    fn = obj.get("function") if obj.get("type") == "function" else obj
    name = fn.get("name") if isinstance(fn, dict) else None
    return name if isinstance(name, str) else None


def _validated_tool(
    text: str, start: int, by_name: Mapping[str, ToolSpec]
) -> tuple[int, ToolSpec] | None:
    try:
        obj, end = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError:
        return None
    name = _tool_name(obj)
    if name not in by_name:
        return None
    fn = obj["function"] if obj.get("type") == "function" else obj
    if "parameters" not in fn:
        return None
    try:
        ToolSpec.from_any(obj)
    except SchemaError:
        return None
    return end, by_name[name]


# -- labelling inside one validated span ---------------------------------------------------
def _label_tool_json(text: str, start: int, end: int) -> list[CharSpan]:
    obj = _DECODER.raw_decode(text, start)[0]
    context = "wrapper" if obj.get("type") == "function" else "function"
    out: list[CharSpan] = []
    stop = _walk(text, start, context, out)
    if stop != end:  # raw_decode and the walker must agree on the extent
        raise AssertionError(f"tool JSON walk ended at {stop}, expected {end}")
    return out


def _walk(text: str, i: int, context: str, out: list[CharSpan]) -> int:
    """Label the JSON value starting at ``text[i]`` under ``context``; return its end."""
    i = _WS.match(text, i).end()
    ch = text[i]
    if ch == "{":
        return _walk_object(text, i, context, out)
    if ch == "[":
        element = "schema" if context == "schemas" else context
        i = _WS.match(text, i + 1).end()
        if text[i] == "]":
            return i + 1
        while True:
            i = _WS.match(text, _walk(text, i, element, out)).end()
            if text[i] == "]":
                return i + 1
            i += 1  # the comma
    if ch == '"':
        stop = _STRING.match(text, i).end()
        label = _STRING_LABELS.get(context)
        if label is not None and stop - i > 2:
            out.append((i + 1, stop - 1, label))
        return stop
    match = _SCALAR.match(text, i)
    if match is None:
        raise AssertionError(f"unexpected JSON at {i}: {text[i : i + 20]!r}")
    if context == "enum":
        out.append((i, match.end(), "enum_constraint"))
    return match.end()


def _walk_object(text: str, i: int, context: str, out: list[CharSpan]) -> int:
    i = _WS.match(text, i + 1).end()
    if text[i] == "}":
        return i + 1
    while True:
        key_end = _STRING.match(text, i).end()
        key = json.loads(text[i:key_end])
        if context == "props" and key_end - i > 2:
            out.append((i + 1, key_end - 1, "parameter_key"))
        value_context = _value_context(context, key)
        i = _WS.match(text, key_end).end() + 1  # the colon
        i = _WS.match(text, _walk(text, i, value_context, out)).end()
        if text[i] == "}":
            return i + 1
        i = _WS.match(text, i + 1).end()  # the comma


def _value_context(context: str, key: str) -> str:
    if context == "wrapper":
        return "function" if key == "function" else "other"
    if context == "function":
        return _FUNCTION_KEYS.get(key, "other")
    if context in ("schema", "schemas"):
        return _SCHEMA_KEYS.get(key, "other")
    if context in ("props", "defs"):
        return "schema"
    return "other"
