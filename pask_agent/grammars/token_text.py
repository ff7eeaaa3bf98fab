"""Each generated token's share of the decoded text, for parsers that read text (the taggers).

``tokenizer.decode([id])`` is wrong for this: a byte-level token can hold part of a multi-byte
character (it decodes to U+FFFD), and some tokenizers add or drop spaces when a token is decoded
alone. ``TokenTextStream`` decodes a short window of recent tokens and hands out only the new,
complete characters, so the pieces concatenate to exactly ``decode(all ids)`` and a token that
ends inside a character yields ``""`` (the next token carries that character). The window is
bounded by the longest incomplete character, so the work per token does not depend on how long
the output is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_REPLACEMENT = "\ufffd"


class TokenTextStream:
    """Incremental detokenizer for one output; ``push(id)`` returns that token's text."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._window: list[int] = []  # ids from the last emitted boundary (prefix) onwards
        self._read = 0  # ids in the window whose text was already handed out

    def push(self, token_id: int) -> str:
        """The new text that ``token_id`` completes (possibly ``""``)."""
        self._window.append(int(token_id))
        prefix_text = self._decode(self._window[: self._read])
        full_text = self._decode(self._window)
        if len(full_text) <= len(prefix_text) or full_text.endswith(_REPLACEMENT):
            return ""  # inside a multi-byte character: wait for the rest of it
        delta = full_text[len(prefix_text) :]
        # Keep the last emitted token as context so the next decode sees its neighbour.
        self._window = self._window[self._read :]
        self._read = len(self._window)
        return delta

    def _decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        return self._tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )


def token_texts(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Every token's text share; ``"".join(result) == tokenizer.decode(ids)``."""
    stream = TokenTextStream(tokenizer)
    return [stream.push(i) for i in ids]
