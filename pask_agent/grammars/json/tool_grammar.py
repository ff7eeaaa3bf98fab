"""Tools + tool_choice → one xgrammar grammar for the whole assistant output (issue 3 item 2).

The output language has no ``<tool_call>`` wrapper:

* one call: ``{"name": "<tool name>", "arguments": {<exactly that tool's schema>}}``;
* ``parallel=True``: a JSON array of one or more calls, ``[{...}, {...}]``;
* ``tool_choice="auto"``: a call, or free text, or free text followed by calls (a mixed turn:
  the model says what it will do, then calls). Free text must not start with ``{`` or ``[``,
  so the first token already tells a call from text; after text, calls begin at a line start
  with ``{`` or ``[`` (so no line of the text starts with those) and end the output;
* ``"none"``: free text only; ``"required"``/``"any"``: calls only; a tool's name: calls of that
  tool only.

The layout is ``json.dumps``'s default (``", "``, ``": "``), keys in schema order; see
``layout`` for the bounds on literals. Compile once per (tools, choice, parallel) and share
the ``CompiledGrammar``; make a fresh ``xgrammar.GrammarMatcher`` per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import xgrammar

from pask_agent.errors import SchemaError, ToolChoiceError
from pask_agent.grammars.json.ebnf import EbnfBuilder, ebnf_literal
from pask_agent.grammars.json.layout import json_literal
from pask_agent.grammars.json.nodes import CALL_OPENERS, FREE_TEXT_FORBIDDEN_FIRST
from pask_agent.grammars.tool_spec import ToolSpec, tool_specs

ToolChoice = Literal["auto", "required", "any", "none"] | str
TOOL_CHOICE_MODES: tuple[str, ...] = ("auto", "required", "any", "none")

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
        # text lines, then maybe calls on a line of their own (nodes.TextNode.then)
        openers = "".join(_CLASS_ESCAPES.get(c, c) for c in CALL_OPENERS)
        line = f'[^{first}] [^\\n]* ("\\n" ([^{openers}\\n] [^\\n]*)?)*'
        text = builder.named("text_then_calls", f'{line} ("\\n" {output})?')
        builder.named("root", f"{output} | {text}")
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
