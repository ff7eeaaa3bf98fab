"""One xgrammar compiler per tokenizer, and the token ids every grammar must know about.

Both languages (JSON tool calls and structured outputs, schema-bound SQL) compile against the
same ``TokenizerInfo``: the tokenizers we ship hide their control tokens from xgrammar, so the
ids that end a turn (``stop_token_ids``) and the ids that must never appear in generated text
(``special_token_ids``) are worked out here once and masked by ``make_compiler``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pask_agent.errors import SchemaError

if TYPE_CHECKING:  # imported by make_compiler: the token-id helpers run without xgrammar
    import xgrammar

# Tokens that end a turn, by their text; whichever of them the tokenizer has are stop tokens.
_STOP_TOKEN_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|end|>")
_PAD_TOKEN = re.compile(r"\[PAD\d+\]")
_CONTROL_TOKEN = re.compile(r"<\|?[^\s<>|]+\|?>|</[^\s<>]+>")  # <tool_call>, </tool_call>, <|x|>


def stop_token_ids(tokenizer: Any) -> list[int]:
    """Ids that end the assistant turn: the eos id plus any of the usual end-of-turn tokens."""
    return _stop_ids(tokenizer, tokenizer.get_vocab())


def special_token_ids(tokenizer: Any, vocab_size: int) -> list[int]:
    """Ids that must never appear inside generated text, stop ids included.

    These are the tokenizer's added tokens that are special or look like control tags
    (``<|im_start|>``, ``<tool_call>``, …; added plain words stay usable), the ``[PAD…]``
    entries that GGUF conversion leaves in the vocabulary, and the ids between the tokenizer's
    vocabulary and the model's ``vocab_size``. For Qwen2.5 that is 151643 and up.
    ``make_compiler`` masks them inside the grammar; stop ids stay allowed once the output is
    complete (xgrammar handles them apart).
    """
    vocab = tokenizer.get_vocab()
    return _special_ids(tokenizer, vocab, vocab_size, _stop_ids(tokenizer, vocab))


# ``get_vocab()`` copies the whole vocabulary (0.1-0.2 s of CPU for Qwen's 152k entries), and it
# was once called nine times while a server started: each public function reads it once and
# hands it down.
def _stop_ids(tokenizer: Any, vocab: Mapping[str, int]) -> list[int]:
    ids = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    ids.update(vocab[text] for text in _STOP_TOKEN_TEXTS if text in vocab)
    if not ids:
        raise SchemaError("the tokenizer has no eos token; cannot tell where an answer ends")
    return sorted(ids)


def _special_ids(
    tokenizer: Any, vocab: Mapping[str, int], vocab_size: int, stops: list[int]
) -> list[int]:
    ids = {
        int(i)
        for i, token in getattr(tokenizer, "added_tokens_decoder", {}).items()
        if getattr(token, "special", False) or _CONTROL_TOKEN.fullmatch(str(token))
    }
    ids.update(i for text, i in vocab.items() if _PAD_TOKEN.fullmatch(text))
    ids.update(range(max(vocab.values()) + 1, vocab_size))
    ids.update(stops)
    return sorted(i for i in ids if i < vocab_size)


def make_compiler(
    tokenizer: Any, vocab_size: int, *, max_threads: int = 1, allow: Sequence[str] = ()
) -> xgrammar.GrammarCompiler:
    """A grammar compiler for ``tokenizer`` whose masks are ``vocab_size`` wide.

    xgrammar detects no special tokens in the GGUF-derived tokenizers we ship, so it would let
    ``<|im_start|>`` or ``[PAD…]`` appear inside a JSON string. We blank those entries (xgrammar
    treats a token with empty text as special and never allows it) and pass the stop ids
    explicitly. ``allow`` keeps the named added tokens usable (``<tool_call>`` for a grammar
    that writes the template's own call tags). Build one compiler per tokenizer and keep it: it
    caches compiled grammars.
    """
    import xgrammar

    base = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    vocab = tokenizer.get_vocab()
    stops = _stop_ids(tokenizer, vocab)
    encoded: list[str] = [""] * vocab_size
    for text, i in vocab.items():
        if i < vocab_size:
            encoded[i] = text
    kept = {tokenizer.convert_tokens_to_ids(text) for text in allow}
    for i in _special_ids(tokenizer, vocab, vocab_size, stops):
        # Stop ids too: with their text kept, "<|im_end|>" would also match free text.
        if i not in kept:
            encoded[i] = ""
    info = xgrammar.TokenizerInfo(
        encoded,
        base.vocab_type,
        vocab_size=vocab_size,
        stop_token_ids=stops,
        add_prefix_space=base.add_prefix_space,
    )
    return xgrammar.GrammarCompiler(info, max_threads=max_threads)
