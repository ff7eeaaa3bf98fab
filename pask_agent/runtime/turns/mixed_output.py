"""An assistant output under a tool grammar → its message text and its calls, whole or streamed.

Under ``tool_choice="auto"`` the grammar (``grammars/json/tool_grammar.py``) lets an output be

* calls only: one bare call ``{"name": ..., "arguments": {...}}``, or an array of calls;
* text only: its first character is not one of ``{[`< \\t\\r\\n``;
* mixed: text whose lines never start with ``{`` or ``[``, then ``"\\n"`` and the calls, which
  end the output.

So a call begins at the very start of the output or right after a ``"\\n"``, at a line that
starts with ``{`` or ``[``; what comes before is the message's ``content`` (OpenAI allows
``content`` next to ``tool_calls``), its trailing newlines dropped. ``"required"`` and a named
tool give calls only, ``"none"`` text only.

Kept apart from ``outputs.py`` (which builds the grammars and parses the calls) because
``results.py`` needs the split for ``ChatResult.message`` and ``outputs.py`` imports
``results.py``; the streamed form lives next to the whole one so both read one rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from pask_agent.grammars.json.nodes import CALL_OPENERS as _OPENERS

# A line starting with one of these is a call (the grammar's own ``CALL_OPENERS``).
CALL_OPENERS = tuple(_OPENERS)


def call_start(text: str, *, since: int = 0) -> int | None:
    """Index where the calls begin in ``text``, or None while it holds none.

    ``since``: only a call opener at or after this index is looked for (the text before it
    was searched already).
    """
    if since == 0 and text.startswith(CALL_OPENERS):
        return 0
    frm = max(since - 1, 0)  # the newline before the opener may be an old character
    hits = [i + 1 for c in CALL_OPENERS if (i := text.find("\n" + c, frm)) >= 0]
    return min(hits) if hits else None


def split_output(text: str) -> tuple[str | None, str | None]:
    """``(content, calls)`` of an output: the text before the calls and the calls' JSON text.

    ``content`` is None when there is no text before the calls; an output without calls is all
    content (unchanged, trailing newlines kept), ``None`` only when empty. ``calls`` is None
    when no call begins (it may still be unfinished or invalid JSON: parsing is the caller's).
    """
    start = call_start(text)
    if start is None:
        return text or None, None
    return text[:start].rstrip("\n") or None, text[start:]


@dataclass
class OutputSplitter:
    """Splits an output fed piece by piece, handing out each part once it is certain.

    Content is handed out as it arrives, except a trailing run of newlines: those are dropped
    if a call follows them and are content otherwise, so they wait for the next character (or
    :meth:`finish`). The concatenated content equals ``split_output(text)[0]`` (or ``""``), and
    the concatenated calls text equals ``split_output(text)[1]``.

    ``calls_allowed=False`` (no tools, or ``tool_choice="none"``): everything is content.
    """

    calls_allowed: bool = True
    text: str = ""  # everything fed so far
    calls_at: int | None = None  # where the calls begin, once one has
    content_sent: int = 0  # characters of ``text`` handed out as content

    def feed(self, piece: str) -> tuple[str, str]:
        """``(new content, new calls text)`` after ``piece``; either may be empty."""
        seen = len(self.text)
        self.text += piece
        if self.calls_at is not None:
            return "", piece
        if not self.calls_allowed:
            return self._content(len(self.text)), ""
        start = call_start(self.text, since=seen)
        if start is None:
            return self._content(len(self.text.rstrip("\n"))), ""
        self.calls_at = start
        content = self._content(len(self.text[: self.calls_at].rstrip("\n")))
        return content, self.text[self.calls_at :]

    def finish(self) -> str:
        """The content still held back when the output has ended (its trailing newlines)."""
        return "" if self.calls_at is not None else self._content(len(self.text))

    @property
    def in_calls(self) -> bool:
        return self.calls_at is not None

    def _content(self, upto: int) -> str:
        piece = self.text[self.content_sent : upto] if upto > self.content_sent else ""
        self.content_sent = max(self.content_sent, upto)
        return piece
