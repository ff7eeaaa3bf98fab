"""Incremental, schema-driven scanner for the tool-call grammar's compact JSON layout.

The structural tagger (``tagger.py``) needs to know, for every generated character, where in
the schema it is: a key of which object, the value of which property, the tool name. xgrammar
knows this too but keeps its parser state private (DESIGN.md, "Seams"), so this is a second,
small parser over the same language as ``ebnf`` + ``tool_grammar`` (nodes in ``nodes.py``,
frames in ``frames.py``): keys in schema order, separators exactly ``", "`` and ``": "``, no
other whitespace, bounded numbers, strings without raw control characters, free text whose first
character is not ``{``/``[`` (under ``tool_choice="auto"`` followed, after a newline, by calls:
a text line that starts with ``{``/``[`` is where the calls begin).

A configuration is an immutable linked stack ``(frame, parent)`` of small frozen frames. The
depth is bounded by the schema's nesting and a step replaces only the top frame, so a snapshot
is one reference and the work per character does not depend on how long the output already is.
``anyOf`` keeps every configuration still alive (deduplicated), so the scanner accepts exactly
the grammar's language; the tagger combines their tags conservatively (App. A.1). ``step``
reports each character's ``Kind`` and ``Role``; the mapping to ``Tag`` lives in the tagger.
"""

from __future__ import annotations

from pask_agent.grammars.json import numbers
from pask_agent.grammars.json.frames import (
    AFTER,
    COLON,
    COLON_SP,
    COMMA_SP,
    KEY,
    KEY_OPEN,
    N_START,
    OPEN,
    VALUE,
    ArrFrame,
    LitFrame,
    MapFrame,
    NumFrame,
    RecFrame,
    Stack,
    StartFrame,
    Step,
    StrFrame,
    TextFrame,
)
from pask_agent.grammars.json.nodes import (
    ANY_LITERALS,
    ANY_STRING,
    CALL_OPENERS,
    FREE_TEXT_FORBIDDEN_FIRST,
    TEXT_BOUNDARY_CHARS,
    AnyNode,
    ArrayNode,
    DispatchNode,
    Kind,
    LiteralNode,
    MapNode,
    Node,
    NumberNode,
    RecordNode,
    Role,
    StringNode,
    TextNode,
    UnionNode,
)


class Reject(Exception):
    """A configuration cannot take the character; the message says why."""


_HEX = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset('"\\/bfnrt')


def initial(node: Node) -> Stack:
    """The configuration before any character of a value of ``node``."""
    return (StartFrame(node, Role.SCAFFOLD), None)


def step(stack: Stack, ch: str) -> list[Step]:
    """All configurations after reading ``ch``, each with the character's kind and role.

    Raises ``Reject`` when none exists.
    """
    if stack is None:
        raise Reject("the output is already complete; nothing may follow")
    frame, rest = stack
    return _STEPPERS[type(frame)](frame, rest, ch)


def can_end(stack: Stack) -> bool:
    """True when the text read so far is a complete output (a stop token would be legal)."""
    while stack is not None:
        frame, rest = stack
        if isinstance(frame, TextFrame):
            return True
        if isinstance(frame, NumFrame) and frame.state in numbers.ACCEPTING:
            stack = rest
            continue
        if isinstance(frame, LitFrame) and any(
            len(frame.node.texts[i]) == frame.pos for i in frame.cands
        ):
            stack = rest
            continue
        return False
    return True


# ---- starting a value -------------------------------------------------------------------------
def _start(node: Node, role: Role, ch: str, parent: Stack, choice: int = -1) -> list[Step]:
    kind = type(node)
    if kind is DispatchNode:
        return _start(node.options[choice], role, ch, parent)
    if kind is UnionNode:
        out: list[Step] = []
        reason: Reject | None = None
        for option in node.options:
            try:
                out.extend(_start(option, role, ch, parent, choice))
            except Reject as exc:
                reason = reason or exc
        if not out:
            raise reason or Reject("no alternative accepts it")
        return out
    if kind is AnyNode:
        node = _any_by_first_char(node, ch)
        kind = type(node)
    if kind is RecordNode or kind is MapNode:
        if ch != "{":
            raise Reject("an object must start with '{'")
        if kind is RecordNode:
            return [((RecFrame(node, OPEN, 0, (), 0, role, -1), parent), Kind.PUNCT, Role.SCAFFOLD)]
        return [((MapFrame(node, OPEN, role), parent), Kind.PUNCT, Role.SCAFFOLD)]
    if kind is ArrayNode:
        if ch != "[":
            raise Reject("an array must start with '['")
        return [((ArrFrame(node, OPEN, 0, role), parent), Kind.PUNCT, Role.SCAFFOLD)]
    if kind is StringNode:
        if ch != '"':
            raise Reject("a string must start with '\"'")
        return [((StrFrame(node, 0, 0, role), parent), Kind.QUOTE, Role.SCAFFOLD)]
    if kind is NumberNode:
        return _step_num(NumFrame(node, N_START, 0, role), parent, ch)
    if kind is LiteralNode:
        return _step_lit(LitFrame(node, tuple(range(len(node.texts))), 0, role), parent, ch)
    if kind is TextNode:
        if ch in FREE_TEXT_FORBIDDEN_FIRST:
            raise Reject(f"free text must not start with {ch!r} (calls must be bare JSON)")
        return [_text_char(TextFrame(False, node.then), parent, ch)]
    raise TypeError(f"unknown scanner node {node!r}")


def _any_by_first_char(node: AnyNode, ch: str) -> Node:
    if ch == "{":
        return node.map
    if ch == "[":
        return node.array
    if ch == '"':
        return ANY_STRING
    if ch == "-" or ch in numbers.DIGITS:
        return node.number
    if ch in "tfn":
        return ANY_LITERALS
    raise Reject("no JSON value starts with it")


def _step_start(frame: StartFrame, rest: Stack, ch: str) -> list[Step]:
    return _start(frame.node, frame.role, ch, rest)


# ---- objects ------------------------------------------------------------------------------------
def _step_rec(f: RecFrame, rest: Stack, ch: str) -> list[Step]:
    node, phase = f.node, f.phase
    if phase == KEY:
        props, pos = node.props, f.pos
        cands = tuple(j for j in f.cands if len(props[j].raw) > pos and props[j].raw[pos] == ch)
        if not cands:
            keys = ", ".join(props[j].raw for j in f.cands)
            raise Reject(f"no allowed key continues this way (allowed here: {keys})")
        first = props[cands[0]]
        if len(cands) == 1 and len(first.raw) == pos + 1:  # closing quote of a known key
            return [(_rec(f, COLON, f.idx, cands, 0, rest), Kind.QUOTE, Role.SCAFFOLD)]
        role = max(props[j].role for j in cands)
        return [(_rec(f, KEY, f.idx, cands, pos + 1, rest), first.key_kind, role)]
    if phase == VALUE:
        j = f.cands[0]
        prop = node.props[j]
        parent = (RecFrame(node, AFTER, j + 1, f.cands, 0, f.role, f.choice), rest)
        return _start(prop.node, prop.role, ch, parent, f.choice)
    if phase == COLON:
        return [(_expect(f, rest, ch, ":", COLON_SP), Kind.PUNCT, Role.SCAFFOLD)]
    if phase == COLON_SP:
        return [(_expect(f, rest, ch, " ", VALUE), Kind.SPACE, Role.SCAFFOLD)]
    if phase == COMMA_SP:
        return [(_expect(f, rest, ch, " ", KEY_OPEN), Kind.SPACE, Role.SCAFFOLD)]
    if ch == "}" and phase in (OPEN, AFTER):
        if not node.can_close[f.idx]:
            missing = [p.key for p in node.props[f.idx :] if p.required]
            raise Reject(f"the object is missing required key(s) {missing}")
        return [(rest, Kind.PUNCT, Role.SCAFFOLD)]
    if ch == '"' and phase in (OPEN, KEY_OPEN):
        allowed = node.allowed[f.idx]
        if not allowed:
            raise Reject("this object takes no keys")
        return [(_rec(f, KEY, f.idx, allowed, 1, rest), Kind.QUOTE, Role.SCAFFOLD)]
    if ch == "," and phase == AFTER:
        if not node.allowed[f.idx]:
            raise Reject("every property of this object is written; expected '}'")
        return [(_rec(f, COMMA_SP, f.idx, f.cands, 0, rest), Kind.PUNCT, Role.SCAFFOLD)]
    raise Reject(_EXPECTED[phase])


def _rec(f: RecFrame, phase: int, idx: int, cands: tuple[int, ...], pos: int, rest: Stack) -> Stack:
    return (RecFrame(f.node, phase, idx, cands, pos, f.role, f.choice), rest)


def _expect(
    f: RecFrame | MapFrame | ArrFrame, rest: Stack, ch: str, want: str, phase: int
) -> Stack:
    if ch != want:
        raise Reject(f"expected {want!r}")
    if isinstance(f, RecFrame):
        return _rec(f, phase, f.idx, f.cands, 0, rest)
    if isinstance(f, MapFrame):
        return (MapFrame(f.node, phase, f.role), rest)
    return (ArrFrame(f.node, phase, f.count, f.role), rest)


_EXPECTED = {
    OPEN: "expected a key or '}'",
    AFTER: "expected ', ' or '}'",
    KEY_OPEN: "expected '\"' opening a key",
}


def _step_map(f: MapFrame, rest: Stack, ch: str) -> list[Step]:
    phase = f.phase
    if phase == VALUE:
        parent = (MapFrame(f.node, AFTER, f.role), rest)
        return _start(f.node.value, f.role, ch, parent)
    if phase == COLON:
        return [(_expect(f, rest, ch, ":", COLON_SP), Kind.PUNCT, Role.SCAFFOLD)]
    if phase == COLON_SP:
        return [(_expect(f, rest, ch, " ", VALUE), Kind.SPACE, Role.SCAFFOLD)]
    if phase == COMMA_SP:
        return [(_expect(f, rest, ch, " ", KEY_OPEN), Kind.SPACE, Role.SCAFFOLD)]
    if ch == "}" and phase in (OPEN, AFTER):
        return [(rest, Kind.PUNCT, Role.SCAFFOLD)]
    if ch == '"' and phase in (OPEN, KEY_OPEN):
        parent = (MapFrame(f.node, COLON, f.role), rest)
        return [((StrFrame(ANY_STRING, 0, 0, f.role), parent), Kind.QUOTE, Role.SCAFFOLD)]
    if ch == "," and phase == AFTER:
        return [((MapFrame(f.node, COMMA_SP, f.role), rest), Kind.PUNCT, Role.SCAFFOLD)]
    raise Reject(_EXPECTED[phase])


# ---- arrays -------------------------------------------------------------------------------------
def _step_arr(f: ArrFrame, rest: Stack, ch: str) -> list[Step]:
    node, phase = f.node, f.phase
    if phase == COMMA_SP:
        return [(_expect(f, rest, ch, " ", VALUE), Kind.SPACE, Role.SCAFFOLD)]
    if ch == "]" and phase in (OPEN, AFTER):
        if f.count < node.min_count:
            raise Reject(f"the array needs at least {node.min_count} item(s)")
        return [(rest, Kind.PUNCT, Role.SCAFFOLD)]
    if phase == AFTER:
        if ch != ",":
            raise Reject("expected ', ' or ']'")
        if node.max_count is not None and f.count >= node.max_count:
            raise Reject(f"the array takes at most {node.max_count} item(s); expected ']'")
        return [((ArrFrame(node, COMMA_SP, f.count, f.role), rest), Kind.PUNCT, Role.SCAFFOLD)]
    item = node.item_at(f.count)
    if item is None or (node.max_count is not None and f.count >= node.max_count):
        raise Reject("the array takes no more items; expected ']'")
    parent = (ArrFrame(node, AFTER, _cap(node, f.count + 1), f.role), rest)
    return _start(item, f.role, ch, parent)


def _cap(node: ArrayNode, count: int) -> int:
    # Past every bound the exact count no longer matters; capping keeps states comparable.
    return min(count, max(len(node.prefix), node.min_count, node.max_count or 0) + 1)


# ---- scalars ------------------------------------------------------------------------------------
def _step_str(f: StrFrame, rest: Stack, ch: str) -> list[Step]:
    node, esc = f.node, f.esc
    kind = Kind.VALUE_FIRST if f.count == 0 and esc == 0 else Kind.VALUE_REST
    if esc == -1:
        if ch in _SIMPLE_ESCAPES:
            return [((StrFrame(node, 0, f.count, f.role), rest), Kind.VALUE_REST, f.role)]
        if ch == "u":
            return [((StrFrame(node, 4, f.count, f.role), rest), Kind.VALUE_REST, f.role)]
        raise Reject('invalid escape; expected one of " \\ / b f n r t u')
    if esc > 0:
        if ch not in _HEX:
            raise Reject("\\u must be followed by four hex digits")
        return [((StrFrame(node, esc - 1, f.count, f.role), rest), Kind.VALUE_REST, f.role)]
    if ch == '"':
        if f.count < node.min_len:
            raise Reject(f"the string needs at least {node.min_len} character(s)")
        return [(rest, Kind.QUOTE, Role.SCAFFOLD)]
    if ord(ch) < 0x20:
        raise Reject("raw control characters are not allowed in a string; escape them")
    if node.max_len is not None and f.count >= node.max_len:
        raise Reject(f"the string takes at most {node.max_len} character(s)")
    count = min(f.count + 1, max(node.min_len, node.max_len or 0) + 1)
    new_esc = -1 if ch == "\\" else 0
    return [((StrFrame(node, new_esc, count, f.role), rest), kind, f.role)]


def _step_lit(f: LitFrame, rest: Stack, ch: str) -> list[Step]:
    texts, pos = f.node.texts, f.pos
    cands = tuple(i for i in f.cands if len(texts[i]) > pos and texts[i][pos] == ch)
    if not cands:
        done = [i for i in f.cands if len(texts[i]) == pos]
        if done:  # a number or keyword literal ended; the character belongs to the parent
            return step(_finish_literal(f, done[0], rest), ch)
        allowed = ", ".join(texts[i] for i in f.cands)
        raise Reject(f"the value must be one of: {allowed}")
    kind = f.node.kind
    if ch == '"' and texts[cands[0]][0] == '"':
        if pos == 0 or any(len(texts[i]) == pos + 1 for i in cands):
            kind = Kind.QUOTE
    role = Role.SCAFFOLD if kind is Kind.QUOTE else f.role
    if len(cands) == 1 and len(texts[cands[0]]) == pos + 1:
        return [(_finish_literal(f, cands[0], rest), kind, role)]
    return [((LitFrame(f.node, cands, pos + 1, f.role), rest), kind, role)]


def _finish_literal(f: LitFrame, index: int, rest: Stack) -> Stack:
    if not f.node.dispatch or rest is None:
        return rest
    parent, above = rest
    if not isinstance(parent, RecFrame):
        return rest
    p = parent
    return (RecFrame(p.node, p.phase, p.idx, p.cands, p.pos, p.role, index), above)


def _step_num(f: NumFrame, rest: Stack, ch: str) -> list[Step]:
    node, layout = f.node, f.node.layout
    try:
        nxt, digits = numbers.next_state(
            f.state, f.ndig, ch, integer=node.integer,
            max_int=layout.max_int_digits, max_frac=layout.max_frac_digits,
        )  # fmt: skip
    except numbers.TooManyDigits as exc:
        raise Reject(str(exc)) from None
    what = "integer" if node.integer else "number"
    if nxt == numbers.NO_TRANSITION:
        if f.state not in numbers.ACCEPTING:
            raise Reject(f"not a valid JSON {what}")
        try:
            return step(rest, ch)  # the number ended; the character belongs to the parent
        except Reject as exc:
            raise Reject(f"{exc} (a JSON {what} cannot continue with {ch!r})") from None
    kind = Kind.VALUE_FIRST if f.state == N_START else Kind.VALUE_REST
    return [((NumFrame(node, nxt, digits, f.role), rest), kind, f.role)]


def _step_text(f: TextFrame, rest: Stack, ch: str) -> list[Step]:
    if f.line_start and f.then is not None and ch in CALL_OPENERS:
        # A line that opens with `{`/`[` is the calls that end the output (tool_choice auto).
        steps = _start(f.then, Role.SCAFFOLD, ch, rest)
        return [(new, Kind.CALL_AFTER_TEXT, role) for new, _, role in steps]
    return [_text_char(f, rest, ch)]


def _text_char(f: TextFrame, rest: Stack, ch: str) -> Step:
    line_start = ch == "\n"
    if line_start != f.line_start:
        f = TextFrame(line_start, f.then)
    if ch in TEXT_BOUNDARY_CHARS:
        return (f, rest), Kind.TEXT_BOUNDARY, Role.TEXT_BOUNDARY
    return (f, rest), Kind.TEXT, Role.TEXT_BODY


_STEPPERS = {
    StartFrame: _step_start,
    RecFrame: _step_rec,
    MapFrame: _step_map,
    ArrFrame: _step_arr,
    StrFrame: _step_str,
    LitFrame: _step_lit,
    NumFrame: _step_num,
    TextFrame: _step_text,
}
