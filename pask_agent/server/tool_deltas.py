"""Streamed tool calls: the model's growing call text → OpenAI ``delta.tool_calls`` pieces.

The grammar makes the model write ``{"name": "f", "arguments": {...}}`` or an array of such
objects. As the text grows, a call is announced (index, id, name) once its name is complete,
and then its ``arguments`` JSON is sent piece by piece as the model writes it, so the pieces
of one call concatenate to exactly the arguments' JSON text, as OpenAI's stream does.

Why rescan the whole text on every piece: answers are short (a few hundred characters), and
a rescan has no state to get wrong across pieces that split a string or an escape.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CallSpan:
    """One call in the text so far: its name once complete, and where its arguments lie."""

    name: str | None = None
    args_start: int | None = None
    args_end: int | None = None  # exclusive; None while the arguments are still open


@dataclass
class _Container:
    kind: str  # "{" or "["
    call: int | None = None  # index of the call this object is, if it is a call object
    key: str | None = None
    expecting: str = "key"  # "key" | "value" (objects only)


def scan_calls(text: str) -> list[CallSpan]:
    """The calls in a (possibly unfinished) JSON call object or array of call objects."""
    calls: list[CallSpan] = []
    stack: list[_Container] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            end = _string_end(text, i)
            if end is None:
                return calls  # the string is still being written
            _on_string(text[i:end], stack, calls)
            i = end
            continue
        if c in "{[":
            top = stack[-1] if stack else None
            if top is not None and top.call is not None and top.expecting == "value":
                if top.key == "arguments":
                    calls[top.call].args_start = i
            is_call = c == "{" and (not stack or (len(stack) == 1 and stack[0].kind == "["))
            stack.append(_Container(c, len(calls) if is_call else None))
            if is_call:
                calls.append(CallSpan())
        elif c in "}]":
            if not stack:
                return calls
            stack.pop()
            top = stack[-1] if stack else None
            if top is not None and top.call is not None and top.key == "arguments":
                if top.expecting == "value" and calls[top.call].args_end is None:
                    calls[top.call].args_end = i + 1
        elif c == ":" and stack and stack[-1].kind == "{":
            stack[-1].expecting = "value"
        elif c == "," and stack and stack[-1].kind == "{":
            stack[-1].expecting, stack[-1].key = "key", None
        i += 1
    return calls


def _string_end(text: str, start: int) -> int | None:
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i + 1
        i += 1
    return None


def _on_string(token: str, stack: list[_Container], calls: list[CallSpan]) -> None:
    if not stack or stack[-1].kind != "{":
        return
    top = stack[-1]
    if top.expecting == "key":
        top.key = json.loads(token)
    elif top.call is not None and top.key == "name" and calls[top.call].name is None:
        calls[top.call].name = json.loads(token)


@dataclass
class ToolCallDeltas:
    """Feeds the answer's text pieces; returns the ``delta.tool_calls`` entries to send."""

    text: str = ""
    ids: list[str] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)  # argument characters sent, per call

    def feed(self, piece: str) -> list[dict[str, Any]]:
        self.text += piece
        out: list[dict[str, Any]] = []
        for k, call in enumerate(scan_calls(self.text)):
            if call.name is None:
                break  # calls are written in order: nothing after an unnamed one is complete
            if k == len(self.ids):
                self.ids.append(f"call_{uuid.uuid4().hex[:24]}")
                self.sent.append(0)
                out.append(
                    {
                        "index": k,
                        "id": self.ids[k],
                        "type": "function",
                        "function": {"name": call.name, "arguments": ""},
                    }
                )
            if call.args_start is None:
                continue
            end = call.args_end if call.args_end is not None else len(self.text)
            args = self.text[call.args_start : end]
            if len(args) > self.sent[k]:
                out.append({"index": k, "function": {"arguments": args[self.sent[k] :]}})
                self.sent[k] = len(args)
        return out
