"""Tools + tool_choice → one xgrammar grammar for the whole assistant output (issue 3 item 2).

The output language has no ``<tool_call>`` wrapper:

* one call: ``{"name": "<tool name>", "arguments": {<exactly that tool's schema>}}``;
* ``parallel=True``: a JSON array of one or more calls, ``[{...}, {...}]``;
* ``tool_choice="auto"``: a call, or free text; free text must not start with ``{`` or ``[``, so
  the first token already tells the two apart;
* ``"none"``: free text only; ``"required"``/``"any"``: calls only; a tool's name: calls of that
  tool only.

The layout is ``json.dumps``'s default (``", "``, ``": "``), keys in schema order; see
``json_ebnf`` for the bounds on literals. Compile once per (tools, choice, parallel) and share
the ``CompiledGrammar``; make a fresh ``xgrammar.GrammarMatcher`` per request.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import xgrammar

from pask_agent.errors import SchemaError, ToolChoiceError
from pask_agent.grammars.json_ebnf import EbnfBuilder, ebnf_literal, json_literal
from pask_agent.grammars.json_nodes import FREE_TEXT_FORBIDDEN_FIRST
from pask_agent.grammars.tool_spec import ToolSpec, tool_specs

ToolChoice = Literal["auto", "required", "any", "none"] | str
TOOL_CHOICE_MODES: tuple[str, ...] = ("auto", "required", "any", "none")

# Tokens that end a turn, by their text; whichever of them the tokenizer has are stop tokens.
_STOP_TOKEN_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|end|>")
_CLASS_ESCAPES = {
    "[": "\\[",
    "]": "\\]",
    "\\": "\\\\",
    "^": "\\^",
    "-": "\\-",
    "\t": "\\t",
    "\r": "\\r",
    "\n": "\\n",
}
_PAD_TOKEN = re.compile(r"\[PAD\d+\]")
_CONTROL_TOKEN = re.compile(r"<\|?[^\s<>|]+\|?>|</[^\s<>]+>")  # <tool_call>, </tool_call>, <|x|>


@dataclass(frozen=True, slots=True)
class ToolCallGrammar:
    """A compiled tool-call grammar: immutable, shareable across requests and threads."""

    tools: tuple[ToolSpec, ...]
    tool_choice: str
    parallel: bool
    ebnf: str
    compiled: xgrammar.CompiledGrammar

    @property
    def ebnf_or_schema(self) -> str:
        """The grammar source (EBNF text); kept under the name other modules first used."""
        return self.ebnf

    def matcher(self) -> xgrammar.GrammarMatcher:
        """A fresh per-request matcher over this grammar (rollback is unlimited in xgrammar)."""
        return xgrammar.GrammarMatcher(self.compiled)


def tool_call_ebnf(
    tools: Sequence[Any], *, tool_choice: ToolChoice = "auto", parallel: bool = False
) -> str:
    """The EBNF text of the tool-call grammar (root rule ``root``), without compiling it.

    Raises
    ------
    SchemaError
        Bad tool list or schema (see ``tool_specs``).
    ToolChoiceError
        ``tool_choice`` is not auto/required/any/none and names no tool.
    """
    specs = tool_specs(tools)
    choice = _check_choice(tool_choice, specs)
    builder = EbnfBuilder()
    # any text that cannot be mistaken for a call (see FREE_TEXT_FORBIDDEN_FIRST)
    first = "".join(_CLASS_ESCAPES.get(c, c) for c in FREE_TEXT_FORBIDDEN_FIRST)
    free_text = f"[^{first}] [^]*"
    if choice == "none":
        builder.named("root", builder.named("free_text", free_text))
        return _root_first(builder)
    chosen = (
        specs if choice in ("auto", "required", "any") else [s for s in specs if s.name == choice]
    )
    calls = []
    for i, spec in enumerate(chosen):
        try:
            args = builder.schema(spec.parameters, "$.parameters")
        except SchemaError as exc:
            raise SchemaError(exc.reason, path=f"$[{i}]" + exc.path[1:]) from exc
        head = ebnf_literal('{"name": ' + json_literal(spec.name) + ', "arguments": ')
        calls.append(builder.named(f"call_{i}", f'{head} {args} "}}"'))
    call = builder.named("call", " | ".join(calls))
    # parallel: an array of calls. Under auto a single bare call is accepted too: a small model
    # opens a lone call with `{`, and forbidding that pushes it into prose instead of a call.
    array = f'"[" {call} (", " {call})* "]"'
    output = call
    if parallel:
        output = builder.named("calls", f"{array} | {call}" if choice == "auto" else array)
    if choice == "auto":
        builder.named("root", f"{output} | {builder.named('free_text', free_text)}")
    else:
        builder.named("root", output)
    return _root_first(builder)


def compile_tool_grammar(
    compiler: xgrammar.GrammarCompiler,
    tools: Sequence[Any],
    *,
    tool_choice: ToolChoice = "auto",
    parallel: bool = False,
) -> ToolCallGrammar:
    """Compile the tool-call grammar for ``tools`` with ``compiler`` (which caches by text).

    Raises
    ------
    SchemaError, ToolChoiceError
        As ``tool_call_ebnf``.
    """
    if not isinstance(compiler, xgrammar.GrammarCompiler):
        raise TypeError(
            "compiler must be an xgrammar.GrammarCompiler; build one with make_compiler"
        )
    specs = tool_specs(tools)
    choice = _check_choice(tool_choice, specs)
    ebnf = tool_call_ebnf(specs, tool_choice=choice, parallel=parallel)
    compiled = compiler.compile_grammar(ebnf, root_rule_name="root")
    return ToolCallGrammar(
        tools=specs, tool_choice=choice, parallel=bool(parallel), ebnf=ebnf, compiled=compiled
    )


def stop_token_ids(tokenizer: Any) -> list[int]:
    """Ids that end the assistant turn: the eos id plus any of the usual end-of-turn tokens."""
    ids = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    ids.update(vocab[text] for text in _STOP_TOKEN_TEXTS if text in vocab)
    if not ids:
        raise SchemaError("the tokenizer has no eos token; cannot tell where an answer ends")
    return sorted(ids)


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
    ids = {
        int(i)
        for i, token in getattr(tokenizer, "added_tokens_decoder", {}).items()
        if getattr(token, "special", False) or _CONTROL_TOKEN.fullmatch(str(token))
    }
    ids.update(i for text, i in vocab.items() if _PAD_TOKEN.fullmatch(text))
    ids.update(range(max(vocab.values()) + 1, vocab_size))
    ids.update(stop_token_ids(tokenizer))
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
    base = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    stops = stop_token_ids(tokenizer)
    encoded: list[str] = [""] * vocab_size
    for text, i in tokenizer.get_vocab().items():
        if i < vocab_size:
            encoded[i] = text
    kept = {tokenizer.convert_tokens_to_ids(text) for text in allow}
    for i in special_token_ids(tokenizer, vocab_size):
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


def _check_choice(tool_choice: Any, specs: Sequence[ToolSpec]) -> str:
    if not isinstance(tool_choice, str):
        raise ToolChoiceError(
            f"tool_choice must be a string (one of {', '.join(TOOL_CHOICE_MODES)} or a tool "
            f"name), got {type(tool_choice).__name__}"
        )
    names = [s.name for s in specs]
    if tool_choice in TOOL_CHOICE_MODES or tool_choice in names:
        return tool_choice  # a mode wins over a tool that happens to be called "auto"
    raise ToolChoiceError(
        f"tool_choice {tool_choice!r} is neither one of {', '.join(TOOL_CHOICE_MODES)} nor a "
        f"tool name; tools are: {', '.join(names)}"
    )


def _root_first(builder: EbnfBuilder) -> str:
    # Readers expect the start rule on top; xgrammar does not care about order.
    lines = builder.text().splitlines()
    root = [line for line in lines if line.startswith("root ::= ")]
    return "\n".join(root + [line for line in lines if not line.startswith("root ::= ")]) + "\n"
