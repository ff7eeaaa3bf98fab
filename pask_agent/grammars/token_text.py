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

import codecs
from collections.abc import Sequence
from functools import cache
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
        if len(full_text) <= len(prefix_text) or (
            full_text.endswith(_REPLACEMENT) and self._ends_inside_a_character()
        ):
            return ""  # inside a multi-byte character: wait for the rest of it
        delta = full_text[len(prefix_text) :]
        # Keep the last emitted token as context so the next decode sees its neighbour.
        self._window = self._window[self._read :]
        self._read = len(self._window)
        return delta

    def _ends_inside_a_character(self) -> bool:
        """Whether the window's bytes stop inside a UTF-8 sequence. A decoded U+FFFD at the end
        is either that or a real U+FFFD the model wrote (a complete character the grammar may
        end on); the text cannot tell them apart, the bytes of a byte-level vocabulary can.
        Another vocabulary (or a special token) keeps the text's reading: wait."""
        byte_of = _byte_level_alphabet()
        try:
            raw = bytes(
                byte_of[c] for t in self._tokenizer.convert_ids_to_tokens(self._window) for c in t
            )
        except (KeyError, TypeError):
            return True
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        decoder.decode(raw, final=False)
        return bool(decoder.getstate()[0])  # bytes held back: a character still open

    def _decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        return self._tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )


@cache
def _byte_level_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet (one printable character per byte), character to byte."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {char: byte for byte, char in bytes_to_unicode().items()}


def token_texts(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Every token's text share; ``"".join(result) == tokenizer.decode(ids)``."""
    stream = TokenTextStream(tokenizer)
    return [stream.push(i) for i in ids]
