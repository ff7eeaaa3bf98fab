"""Chat-template text: what the template writes around the messages, apart from what they say.

A rendered tool prompt is mostly text nobody in the conversation wrote: role markers, the
template's default system line, the paragraph that introduces the tools and the one that
says how to format a call. Constrained decoding enforces the call's format whatever that
paragraph says, so its tokens carry the least of any prompt text, while the messages'
content (the user's request, whose values a call copies) carries the most. Labelled alike as
``protected_content`` the two can only be kept or dropped together; here the template's text
becomes ``template_text``, so a table can release it first.

Only characters the schema labels left as ``protected_content`` change, and the labels of
earlier calls and tool results override these (``runtime/turns/prompting.py``). Message
contents are found in the text in order; when one cannot be found verbatim (a template that
rewrites content) nothing is relabelled, since the text around it can no longer be told apart
from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pask_agent.grammars.span_labels import CharSpan, spans_of_char_labels

TEMPLATE_LABEL = "template_text"


def content_ranges(
    text: str, messages: Sequence[Mapping[str, Any]]
) -> list[tuple[int, int]] | None:
    """``(start, end)`` of each message's string content in ``text``, in order; None when one
    is missing (the template changed it). The calls an assistant message made are content too:
    everything from its content (or the content before it) to the next message's content,
    since templates write calls in their own ways and a later turn may need their values."""
    out: list[tuple[int, int]] = []
    cursor, calls_from = 0, None
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) and content:
            at = text.find(content, cursor)
            if at < 0:
                return None
            if calls_from is not None:
                out.append((calls_from, at))
                calls_from = None
            out.append((at, at + len(content)))
            cursor = at + len(content)
        if message.get("tool_calls") and calls_from is None:
            calls_from = cursor
    if calls_from is not None:
        out.append((calls_from, len(text)))
    return out


def template_spans(
    text: str, messages: Sequence[Mapping[str, Any]], schema_spans: Sequence[CharSpan]
) -> list[CharSpan]:
    """``template_text`` spans over the characters that lie outside every message's content and
    that ``schema_spans`` (``label_prompt_spans``) leave ``protected_content``. Put them after
    the schema spans and before the spans of earlier calls and tool results, which override
    them (a later span wins, as in ``token_label_candidates``)."""
    ranges = content_ranges(text, messages)
    if ranges is None:
        return []
    labels = ["protected_content"] * len(text)  # what no span covers is protected content
    for start, end, label in schema_spans:
        labels[start:end] = [label] * (end - start)
    for start, end in ranges:
        labels[start:end] = ["message"] * (end - start)
    return [
        (start, end, TEMPLATE_LABEL)
        for start, end, label in spans_of_char_labels(labels)
        if label == "protected_content"
    ]
