"""Looking ahead from a parser stack: the ``next`` tag component and partial characters (App. A.1).

``upcoming`` lists the kinds the next meaningful character may have (the forced space of a
separator and the opening quote of a key or string are skipped: they carry no decision), which
decides ``lookahead_critical`` vs ``no_lookahead``. ``pending`` names the character a token is
in the middle of when it adds no complete character (part of a multi-byte character).
"""

from __future__ import annotations

from pask_agent.grammars.json.frames import (
    AFTER,
    COLON,
    COLON_SP,
    KEY,
    OPEN,
    VALUE,
    LitFrame,
    MapFrame,
    NumFrame,
    RecFrame,
    Stack,
    StartFrame,
    StrFrame,
    TextFrame,
)
from pask_agent.grammars.json.nodes import (
    AnyNode,
    DispatchNode,
    Kind,
    LiteralNode,
    Node,
    NumberNode,
    Role,
    StringNode,
    TextNode,
    UnionNode,
)


def upcoming(stack: Stack) -> frozenset[Kind]:
    """Kinds the next meaningful character may have, skipping the space of a separator and the
    opening quote of a key or string (those are forced and carry no decision)."""
    if stack is None:
        return frozenset()
    f = stack[0]
    kind = type(f)
    if kind is TextFrame:
        return _K_TEXT_OR_CALL if f.line_start and f.then is not None else _K_TEXT
    if kind is StartFrame:
        return _start_kinds(f.node, -1)
    if kind is StrFrame:
        return _K_STR_FIRST if f.count == 0 and f.esc == 0 else _K_STR_REST
    if kind is NumFrame:
        return _K_NUM_REST
    if kind is LitFrame:
        texts, pos, out = f.node.texts, f.pos, set()
        for i in f.cands:
            text = texts[i]
            if pos >= len(text):
                out.add(Kind.PUNCT)
            elif text[pos] == '"' and pos == len(text) - 1:
                out.add(Kind.QUOTE)
            else:
                out.add(f.node.kind)
        return frozenset(out)
    if f.phase in (COLON, AFTER):
        return _K_PUNCT
    if kind is RecFrame:
        props = f.node.props
        if f.phase == KEY:
            return frozenset(
                props[j].key_kind if len(props[j].raw) > f.pos + 1 else Kind.QUOTE for j in f.cands
            )
        if f.phase in (COLON_SP, VALUE):
            return _start_kinds(props[f.cands[0]].node, f.choice)
        keys = frozenset(props[j].key_kind for j in f.node.allowed[f.idx])
        return keys | _K_PUNCT if f.phase == OPEN and f.node.can_close[0] else keys
    if kind is MapFrame:
        if f.phase in (COLON_SP, VALUE):
            return _start_kinds(f.node.value, -1)
        return _K_MAP_OPEN if f.phase == OPEN else _K_FIRST
    # ArrFrame
    item = f.node.item_at(f.count)
    if item is None or (f.node.max_count is not None and f.count >= f.node.max_count):
        return _K_PUNCT
    kinds = _start_kinds(item, -1)
    return kinds | _K_PUNCT if f.phase == OPEN and f.node.min_count == 0 else kinds


def _start_kinds(node: Node, choice: int) -> frozenset[Kind]:
    kind = type(node)
    if kind is DispatchNode:
        return _K_PUNCT if choice < 0 else _start_kinds(node.options[choice], -1)
    if kind is UnionNode:
        return frozenset().union(*(_start_kinds(o, choice) for o in node.options))
    if kind is StringNode:
        return _K_STR_FIRST
    if kind is NumberNode:
        return _K_FIRST
    if kind is LiteralNode:
        return frozenset(
            (Kind.QUOTE if t == '""' else node.kind) if t[0] == '"' else node.kind
            for t in node.texts
        )
    if kind is AnyNode:
        return _K_ANY
    if kind is TextNode:
        return _K_TEXT
    return _K_PUNCT


def pending(stack: Stack) -> tuple[Kind, Role]:
    """Kind and role of the character being produced when a token adds no complete character
    (a token holding only part of a multi-byte character)."""
    if stack is None:
        return Kind.PUNCT, Role.SCAFFOLD
    f = stack[0]
    if isinstance(f, StrFrame):
        return (Kind.VALUE_FIRST if f.count == 0 else Kind.VALUE_REST), f.role
    if isinstance(f, LitFrame):
        return f.node.kind, f.role
    if isinstance(f, RecFrame) and f.phase == KEY:
        return f.node.props[f.cands[0]].key_kind, max(f.node.props[j].role for j in f.cands)
    if isinstance(f, TextFrame | StartFrame):
        return Kind.TEXT, Role.TEXT_BODY
    return Kind.PUNCT, Role.SCAFFOLD


_K_TEXT = frozenset((Kind.TEXT, Kind.TEXT_BOUNDARY))
_K_TEXT_OR_CALL = _K_TEXT | {Kind.CALL_AFTER_TEXT}
_K_PUNCT = frozenset((Kind.PUNCT,))
_K_FIRST = frozenset((Kind.VALUE_FIRST,))
_K_STR_FIRST = frozenset((Kind.VALUE_FIRST, Kind.QUOTE))
_K_STR_REST = frozenset((Kind.VALUE_REST, Kind.QUOTE))
_K_NUM_REST = frozenset((Kind.VALUE_REST, Kind.PUNCT))
_K_MAP_OPEN = frozenset((Kind.VALUE_FIRST, Kind.PUNCT))
_K_ANY = frozenset((Kind.VALUE_FIRST, Kind.LITERAL, Kind.PUNCT))
