"""The function-calling structural tagger: one ``Tag`` per accepted token (§3.3, App. A.1, B.1).

PASK's decode signal is the parser's view of each generated token. xgrammar computes the masks
but keeps its parser private, so ``FunctionCallTagger`` runs our own incremental parser
(``lexer`` over ``nodes``, looking ahead with ``lookahead``) on the same output language as
``tool_grammar``: a call ``{"name": "<tool>", "arguments": {...}}``, a JSON array of calls when
``parallel``, or free text (first character not ``{``/``[``) under ``tool_choice`` auto/none,
which under auto may end in calls that start on a new line. A test walks both parsers on random
outputs so they agree on legality and completion.

Character tags (Table 5 vocabularies)::

    character                                     cls              role            state
    { } [ ] , : space, quotes around keys/strings pure_scaffold    scaffold_sep.   boundary
    the call's own keys  "name" / "arguments"     pure_scaffold    dispatch_key /  boundary
                                                                   scaffold_sep.
    tool-name value                               schema_bearing   dispatch_key    critical
    argument key (any depth)                      schema_bearing   required|opt.   critical
    enum / const / true / false / null value      schema_bearing   required|opt.   critical
    first character of a free string or number    free_generation  required|opt.   critical
    later characters of a free string or number   free_generation  required|opt.   boundary
    free text: a sentence's body                  text             text_body       boundary
    free text: . ! ? ; : and newline              text             text_boundary   boundary
    `{`/`[` opening calls after text (auto)       pure_scaffold    scaffold_sep.   critical

``required``/``optional`` is the schema's own split for the innermost property a key or value
belongs to (array items and any-values inherit it). Under ``tool_choice="auto"`` the first
character commits to "call or text", so it is ``critical`` whatever it is; so is the character
that turns text into calls, and a newline after which calls may start is ``lookahead_critical``.

A token's tag is the conservative combination of its characters' tags (App. B.1): per component
the maximum under ``cls`` pure_scaffold < text < free_generation < schema_bearing, ``role``
text_body < text_boundary < scaffold_separator < optional < required < dispatch_key, ``state``
boundary < critical. Where
``anyOf`` leaves several parses alive, their tags combine the same way (App. A.1).

``next`` describes the state after the token, not its characters: ``lookahead_critical`` when the
next meaningful character (skipping the forced space of ``", "``/``": "`` and an opening quote)
may be a critical one: after ``"name": `` or inside a tool name, after ``{``/``, `` where an
argument key follows, inside a key, after ``": "`` before a scalar value, after a string's
opening quote. Otherwise ``no_lookahead``.

Work and memory per token are independent of the output length: the parser state is a stack
bounded by the schema's nesting, snapshots share structure, and the undo log for ``rollback``
keeps at most ``max_rollback`` snapshots (B.7).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pask_agent.errors import GrammarRejectedError, ToolChoiceError
from pask_agent.grammars.json.frames import AFTER, ArrFrame, Stack
from pask_agent.grammars.json.layout import JsonLayout
from pask_agent.grammars.json.lexer import Reject, can_end, initial, step
from pask_agent.grammars.json.lookahead import pending, upcoming
from pask_agent.grammars.json.nodes import (
    ArrayNode,
    Kind,
    Node,
    UnionNode,
    compile_schema,
    output_node,
)
from pask_agent.grammars.json.tool_grammar import TOOL_CHOICE_MODES, ToolCallGrammar
from pask_agent.grammars.tags import Tag
from pask_agent.grammars.tool_spec import ToolSpec, tool_specs

# Component orders for the conservative combination (index = rank; max wins).
CLS_ORDER: tuple[str, ...] = ("pure_scaffold", "text", "free_generation", "schema_bearing")
ROLE_ORDER: tuple[str, ...] = (
    "text_body",
    "text_boundary",
    "scaffold_separator",
    "optional",
    "required",
    "dispatch_key",
)  # index = nodes.Role
STATE_ORDER: tuple[str, ...] = ("boundary", "critical")
NEXT_ORDER: tuple[str, ...] = ("no_lookahead", "lookahead_critical")

_PURE, _TEXT, _FREE, _SCHEMA = 0, 1, 2, 3
_BOUNDARY, _CRITICAL = 0, 1
# Kind → (cls rank, state rank); the role comes from the parser.
_KIND_TAG: dict[Kind, tuple[int, int]] = {
    Kind.SPACE: (_PURE, _BOUNDARY),
    Kind.PUNCT: (_PURE, _BOUNDARY),
    Kind.QUOTE: (_PURE, _BOUNDARY),
    Kind.FIXED_KEY: (_PURE, _BOUNDARY),
    Kind.TOOL_NAME: (_SCHEMA, _CRITICAL),
    Kind.ARG_KEY: (_SCHEMA, _CRITICAL),
    Kind.LITERAL: (_SCHEMA, _CRITICAL),
    Kind.VALUE_FIRST: (_FREE, _CRITICAL),
    Kind.VALUE_REST: (_FREE, _BOUNDARY),
    Kind.TEXT: (_TEXT, _BOUNDARY),
    Kind.TEXT_BOUNDARY: (_TEXT, _BOUNDARY),
    Kind.CALL_AFTER_TEXT: (_PURE, _CRITICAL),  # text becomes a call here: the turn's decision
}
_CRITICAL_KINDS = frozenset(k for k, (_, s) in _KIND_TAG.items() if s == _CRITICAL)
_TAGS: dict[tuple[int, int, int, int], Tag] = {
    (c, r, s, n): Tag(CLS_ORDER[c], ROLE_ORDER[r], STATE_ORDER[s], NEXT_ORDER[n])
    for c in range(len(CLS_ORDER))
    for r in range(len(ROLE_ORDER))
    for s in range(len(STATE_ORDER))
    for n in range(len(NEXT_ORDER))
}


class FunctionCallTagger:
    """Incremental tagger for one assistant output; make a fresh one (``fresh()``) per request.

    Parameters
    ----------
    tools
        Anything ``tool_specs`` accepts (``ToolSpec``, BFCL docs, OpenAI dicts, …).
    parallel
        Whether the output is a JSON array of calls (as in ``compile_tool_grammar``).
    tool_choice
        ``auto`` (call or free text), ``required``/``any``, ``none`` or one tool's name.
    layout
        Literal bounds; must equal the grammar's (``JsonLayout()`` by default, as there).
    max_rollback
        How many of the latest tokens ``rollback`` can undo.

    Raises
    ------
    SchemaError, ToolChoiceError
        Bad tools or an unknown ``tool_choice``.
    """

    family = "function_calling"

    def __init__(
        self,
        tools: Sequence[Any],
        *,
        parallel: bool,
        tool_choice: str = "auto",
        layout: JsonLayout | None = None,
        max_rollback: int = 64,
    ) -> None:
        specs = tool_specs(tools)
        _check_choice(tool_choice, specs)
        if max_rollback < 0:
            raise ValueError(f"max_rollback must be >= 0, got {max_rollback}")
        self.tools = specs
        self.parallel = bool(parallel)
        self.tool_choice = tool_choice
        self.layout = layout or JsonLayout()
        self.max_rollback = max_rollback
        modes = tool_choice in TOOL_CHOICE_MODES
        self._root = output_node(
            [t for t in specs if modes or t.name == tool_choice],
            parallel=self.parallel,
            calls=tool_choice != "none",
            text=tool_choice in ("auto", "none"),
            layout=self.layout,
        )
        self._calls = _calls_array(self._root)
        self._reset()

    @classmethod
    def from_grammar(
        cls, grammar: ToolCallGrammar, *, max_rollback: int = 64
    ) -> FunctionCallTagger:
        """A tagger for exactly the output language of a compiled tool-call grammar."""
        return cls(
            grammar.tools,
            parallel=grammar.parallel,
            tool_choice=grammar.tool_choice,
            max_rollback=max_rollback,
        )

    @classmethod
    def for_schema(
        cls, schema: Mapping[str, Any], *, layout: JsonLayout | None = None, max_rollback: int = 64
    ) -> FunctionCallTagger:
        """A tagger for a structured output: one JSON value of a normalized ``schema``
        (``schema.normalize_schema``), the language ``EbnfBuilder.schema`` compiles.

        Keys, enum values, free values and scaffold get the same tags as inside a tool call's
        arguments, so a ``runtime.call(Schema, ...)`` answer is spread over the same buckets.
        """
        other = object.__new__(cls)
        other.tools = ()
        other.parallel = False
        other.tool_choice = "required"
        other.layout = layout or JsonLayout()
        other.max_rollback = max_rollback
        other._root = compile_schema(schema, other.layout)
        other._calls = None
        other._reset()
        return other

    def fresh(self) -> FunctionCallTagger:
        """A new tagger at the start of an output, sharing this one's compiled schema nodes."""
        other = object.__new__(FunctionCallTagger)
        for name in (
            "tools", "parallel", "tool_choice", "layout", "max_rollback", "_root", "_calls"
        ):  # fmt: skip
            setattr(other, name, getattr(self, name))
        other._reset()
        return other

    def _reset(self) -> None:
        self._configs: tuple[Stack, ...] = (initial(self._root),)
        self._chars = 0
        self._tokens = 0
        self._partial = False  # the last token ended inside a multi-byte character
        self._undo: deque[tuple[tuple[Stack, ...], int, bool]] = deque(maxlen=self.max_rollback)

    @property
    def num_tokens(self) -> int:
        """Tokens fed since the start (rollbacks subtract)."""
        return self._tokens

    @property
    def is_complete(self) -> bool:
        """True exactly when the output so far is complete: the grammar would accept a stop
        token now (a whole call or array of calls, or at least one character of free text), and
        no multi-byte character is left half-written."""
        return not self._partial and any(can_end(s) for s in self._configs)

    def between_calls(self) -> bool:
        """True right after a complete call inside the array of parallel calls, where the
        output either closes the array or starts another call (the decoder's one decision about
        how many calls to make; see ``RuntimeConfig.continue_calls_at``)."""
        if self._calls is None or self._partial:
            return False
        for config in self._configs:
            if config is None:
                continue
            frame = config[0]
            if isinstance(frame, ArrFrame) and frame.node is self._calls and frame.phase == AFTER:
                return True
        return False

    def feed(self, token_text: str) -> Tag:
        """Consume one accepted token's text and return its tag.

        ``token_text`` is the token's share of the decoded output (``TokenTextStream``); it may
        hold several characters across structural boundaries, or none while a multi-byte
        character is still incomplete: the tag is then that of the character in progress, and
        the output is not complete until a later token finishes that character.

        Raises
        ------
        GrammarRejectedError
            The text is not a continuation the grammar accepts; the tagger is left unchanged.
        """
        configs, chars = self._configs, self._chars
        cls = role = state = 0
        for offset, ch in enumerate(token_text):
            survivors: list[Stack] = []
            first_reason: Reject | None = None
            for config in configs:
                try:
                    results = step(config, ch)
                except Reject as exc:
                    first_reason = first_reason or exc
                    continue
                for new, kind, char_role in results:
                    survivors.append(new)
                    c, s = _KIND_TAG[kind]
                    cls, state = max(cls, c), max(state, s)
                    role = max(role, char_role)
            if not survivors:
                raise GrammarRejectedError(
                    f"token {self._tokens} ({token_text!r}): character {offset} ({ch!r}, output "
                    f"offset {chars}) is not accepted: {first_reason}",
                    token_index=self._tokens,
                )
            configs = tuple(dict.fromkeys(survivors)) if len(survivors) > 1 else (survivors[0],)
            if chars == 0 and self.tool_choice == "auto":
                state = _CRITICAL  # the first character decides between a call and text
            chars += 1
        if not token_text:
            for config in configs:
                kind, char_role = pending(config)
                c, s = _KIND_TAG[kind]
                cls, state, role = max(cls, c), max(state, s), max(role, char_role)
        nxt = int(any(k in _CRITICAL_KINDS for config in configs for k in upcoming(config)))
        self._undo.append((self._configs, self._chars, self._partial))
        self._configs, self._chars, self._partial = configs, chars, not token_text
        self._tokens += 1
        return _TAGS[(cls, int(role), state, nxt)]

    def feed_all(self, token_texts: Iterable[str]) -> list[Tag]:
        """``feed`` each text in order."""
        return [self.feed(text) for text in token_texts]

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` feeds (speculative or jump-forward decoding, App. B.7).

        Raises ``ValueError`` when ``n`` exceeds what the bounded undo log holds.
        """
        if n < 0 or n > len(self._undo):
            raise ValueError(
                f"cannot roll back {n} token(s): {len(self._undo)} can be undone "
                f"(max_rollback={self.max_rollback})"
            )
        if n == 0:
            return
        for _ in range(n - 1):
            self._undo.pop()
        self._configs, self._chars, self._partial = self._undo.pop()
        self._tokens -= n


def _check_choice(tool_choice: Any, specs: Sequence[ToolSpec]) -> None:
    if not isinstance(tool_choice, str):
        raise ToolChoiceError(f"tool_choice must be a string, got {type(tool_choice).__name__}")
    names = [s.name for s in specs]
    if tool_choice not in TOOL_CHOICE_MODES and tool_choice not in names:
        raise ToolChoiceError(
            f"tool_choice {tool_choice!r} is neither one of {', '.join(TOOL_CHOICE_MODES)} nor a "
            f"tool name; tools are: {', '.join(names)}"
        )


def _calls_array(root: Node) -> ArrayNode | None:
    # The array of parallel calls is the root itself, or one option of a root union (auto).
    options = root.options if isinstance(root, UnionNode) else (root,)
    return next((o for o in options if isinstance(o, ArrayNode)), None)
