"""An answer's growing text → OpenAI ``delta`` pieces: ``content``, then ``tool_calls``.

Under ``tool_choice="auto"`` an answer is text, calls, or text followed by calls on a new line
(``runtime/turns/mixed_output.py``). The text streams as ``delta.content`` (held back while it could
still be the start of a stop sequence, or while a trailing newline could be the one before a
call); from the line where a call begins, the answer streams as ``delta.tool_calls``
(``tool_deltas.py``). Stop sequences cut the text only: the calls follow a grammar, and a stop
inside a call's JSON would break it.

Kept apart from ``chat.py`` (which runs the request) so the state machine can be fed strings.
"""

from __future__ import annotations

from typing import Any

from pask_agent.runtime.turns.mixed_output import OutputSplitter
from pask_agent.runtime.turns.stops import stop_holdback
from pask_agent.server.tool_deltas import ToolCallDeltas


class AnswerPieces:
    """Feeds the answer's text pieces; returns the ``delta`` dicts to send.

    ``calls_allowed``: the request has tools and a ``tool_choice`` other than ``"none"``.
    """

    def __init__(self, *, stop: tuple[str, ...] = (), calls_allowed: bool) -> None:
        self.stop = stop
        self.split = OutputSplitter(calls_allowed=calls_allowed)
        self.text = ""  # content so far (a stop sequence cuts it)
        self.sent = 0  # characters of ``text`` handed out
        self.calls = ToolCallDeltas()
        self.stopped = False  # a stop sequence ended the answer

    def feed(self, piece: str) -> list[dict[str, Any]]:
        content, calls = self.split.feed(piece)
        out = self._content(content, whole=self.split.in_calls)
        if self.stopped or not calls:
            return out
        deltas = self.calls.feed(calls)
        return [*out, {"tool_calls": deltas}] if deltas else out

    def finish(self) -> list[dict[str, Any]]:
        """What was held back, once the answer has ended."""
        return [] if self.stopped else self._content(self.split.finish(), whole=True)

    def content(self, *, parsed_calls: bool) -> str | None:
        """The whole response's ``message.content``: the text (None when empty) next to parsed
        calls; without them, a call cut before it closed stays visible as text."""
        if parsed_calls:
            return self.text or None
        if self.split.in_calls and not self.stopped:
            return self.split.text
        return self.text

    def _content(self, new: str, *, whole: bool) -> list[dict[str, Any]]:
        """``whole``: no more text will come (the answer ended, or its calls began), so what
        was held back as a possible stop sequence's start goes out."""
        self.text += new
        hits = [i for s in self.stop if (i := self.text.find(s)) >= 0]
        if hits:
            self.text, self.stopped = self.text[: min(hits)], True
        held = 0 if whole or self.stopped else stop_holdback(self.text, self.stop)
        piece = self._take(len(self.text) - held)
        return [{"content": piece}] if piece else []

    def _take(self, upto: int) -> str:
        piece = self.text[self.sent : upto] if upto > self.sent else ""
        self.sent = max(self.sent, upto)
        return piece
