"""The scanner's schema nodes: what may be written next (the parse state is in ``frames``).

Each node mirrors one case of ``ebnf.EbnfBuilder.schema`` (same language, same literal
spellings), plus the call-level pieces ``tool_grammar`` adds: the dispatch literal (tool name)
whose value selects the arguments schema, and free text. Nodes are immutable, built once per
tool set and compared by identity.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pask_agent.grammars.json.layout import JsonLayout, json_literal
from pask_agent.grammars.tool_spec import ToolSpec


class Kind(enum.IntEnum):
    """What one character is, structurally."""

    SPACE = 0  # the space in ", " and ": "
    PUNCT = 1  # { } [ ] , :
    QUOTE = 2  # quotes delimiting keys and string values
    FIXED_KEY = 3  # characters of the call object's own keys ("name", "arguments")
    TOOL_NAME = 4  # characters of the tool-name value
    ARG_KEY = 5  # characters of a schema property name
    LITERAL = 6  # enum/const/true/false/null characters
    VALUE_FIRST = 7  # first character of a free string or number (or free map key)
    VALUE_REST = 8  # later characters of a free string or number
    TEXT = 9  # free text (tool_choice auto/none): a sentence's body
    TEXT_BOUNDARY = 10  # free text that ends a sentence or a line (. ! ? ; : newline)
    CALL_AFTER_TEXT = 11  # the `{`/`[` at a line start that turns text into a call (auto)


class Role(enum.IntEnum):
    """Whose value a character belongs to; ordered from least to most protective (prose below
    any part of a call)."""

    TEXT_BODY = 0
    TEXT_BOUNDARY = 1
    SCAFFOLD = 2
    OPTIONAL = 3
    REQUIRED = 4
    DISPATCH = 5


# ---- schema nodes (immutable, compared by identity) --------------------------------------------
@dataclass(frozen=True, slots=True, eq=False)
class AnyNode:
    """Any JSON value; holds the generic object/array/number nodes it starts (one per layout)."""

    layout: JsonLayout
    number: NumberNode = field(init=False)
    map: MapNode = field(init=False)
    array: ArrayNode = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "number", NumberNode(False, self.layout))
        object.__setattr__(self, "map", MapNode(self))
        object.__setattr__(self, "array", ArrayNode((), self, 0, None))


@dataclass(frozen=True, slots=True, eq=False)
class StringNode:
    min_len: int = 0
    max_len: int | None = None


@dataclass(frozen=True, slots=True, eq=False)
class NumberNode:
    integer: bool
    layout: JsonLayout


@dataclass(frozen=True, slots=True, eq=False)
class LiteralNode:
    texts: tuple[str, ...]
    kind: Kind = Kind.LITERAL
    dispatch: bool = False  # the completed literal's index selects a DispatchNode option


@dataclass(frozen=True, slots=True, eq=False)
class ArrayNode:
    prefix: tuple[Node, ...]
    items: Node | None  # None: nothing beyond the prefix
    min_count: int
    max_count: int | None

    def item_at(self, i: int) -> Node | None:
        return self.prefix[i] if i < len(self.prefix) else self.items


@dataclass(frozen=True, slots=True, eq=False)
class Prop:
    key: str
    raw: str  # the key exactly as written, quotes included
    node: Node
    required: bool
    key_kind: Kind
    role: Role


@dataclass(frozen=True, slots=True, eq=False)
class RecordNode:
    """An object with named properties, written in schema order (optional ones skippable)."""

    props: tuple[Prop, ...]
    allowed: tuple[tuple[int, ...], ...] = field(init=False)  # keys that may come at step i
    can_close: tuple[bool, ...] = field(init=False)  # "}" allowed once props[:i] are done

    def __post_init__(self) -> None:
        n = len(self.props)
        allowed, closable = [], []
        for i in range(n + 1):
            nxt: list[int] = []
            for j in range(i, n):
                nxt.append(j)
                if self.props[j].required:
                    break
            allowed.append(tuple(nxt))
            closable.append(not any(p.required for p in self.props[i:]))
        object.__setattr__(self, "allowed", tuple(allowed))
        object.__setattr__(self, "can_close", tuple(closable))


@dataclass(frozen=True, slots=True, eq=False)
class MapNode:
    value: Node  # any string keys, values of this node


@dataclass(frozen=True, slots=True, eq=False)
class DispatchNode:
    options: tuple[Node, ...]  # chosen by the record's completed dispatch literal


@dataclass(frozen=True, slots=True, eq=False)
class UnionNode:
    options: tuple[Node, ...]


# Free text (tool_choice auto/none) may not open with these: a call must look like a call, so
# the small models' habit of wrapping calls in fences (```json) or tags (<tool_call>) or
# leading blank lines cannot smuggle a call into text. The grammar and the tagger share it.
FREE_TEXT_FORBIDDEN_FIRST = "{[`< \t\r\n"
# Under auto, text may be followed by calls: a line that starts with one of these is a call.
CALL_OPENERS = "{["
# Characters that end a sentence or a line of prose (the ``text_boundary`` role).
TEXT_BOUNDARY_CHARS = frozenset(".!?;:\n")


@dataclass(frozen=True, slots=True, eq=False)
class TextNode:
    """Free text of at least one character; its first is not in FREE_TEXT_FORBIDDEN_FIRST.

    ``then``: the calls that may follow the text (``tool_choice="auto"``). They start at a line
    start with ``{`` or ``[``, so no later line of the text may start with those; the calls end
    the output. ``None`` (``tool_choice="none"``): text only, any line may start with anything.
    """

    then: Node | None = None


Node = (
    AnyNode
    | StringNode
    | NumberNode
    | LiteralNode
    | ArrayNode
    | RecordNode
    | MapNode
    | DispatchNode
    | UnionNode
    | TextNode
)

ANY_STRING = StringNode()
ANY_LITERALS = LiteralNode(("true", "false", "null"))


def compile_schema(
    schema: Mapping[str, Any], layout: JsonLayout, *, any_node: AnyNode | None = None
) -> Node:
    """Scanner node for one normalized schema (``schema.normalize_schema`` output).

    Mirrors ``EbnfBuilder.schema`` case by case; property roles are the schema's own
    required/optional split. ``any_node`` shares one ``AnyNode`` across a tool set.
    """
    any_node = any_node or AnyNode(layout)
    if "const" in schema:
        return LiteralNode((json_literal(schema["const"]),))
    if "enum" in schema:
        return LiteralNode(tuple(json_literal(v) for v in schema["enum"]))
    if "anyOf" in schema:
        branches = schema["anyOf"]
        return UnionNode(tuple(compile_schema(b, layout, any_node=any_node) for b in branches))
    kind = schema.get("type")
    if kind is None:
        return any_node
    if kind == "string":
        return StringNode(schema.get("minLength", 0), schema.get("maxLength"))
    if kind in ("integer", "number"):
        return NumberNode(kind == "integer", layout)
    if kind == "boolean":
        return LiteralNode(("true", "false"))
    if kind == "null":
        return LiteralNode(("null",))
    if kind == "array":
        return _compile_array(schema, layout, any_node)
    if kind == "object":
        props = schema.get("properties")
        if props is None:
            extra = schema.get("additionalProperties")
            if not extra:
                return any_node.map
            return MapNode(compile_schema(extra, layout, any_node=any_node))
        required = set(schema.get("required", ()))
        return RecordNode(
            tuple(
                Prop(
                    key=name,
                    raw=json_literal(name),
                    node=compile_schema(sub, layout, any_node=any_node),
                    required=name in required,
                    key_kind=Kind.ARG_KEY,
                    role=Role.REQUIRED if name in required else Role.OPTIONAL,
                )
                for name, sub in props.items()
            )
        )
    raise ValueError(f"schema type {kind!r} is not normalized; run normalize_schema first")


def _compile_array(schema: Mapping[str, Any], layout: JsonLayout, any_node: AnyNode) -> ArrayNode:
    prefix = tuple(
        compile_schema(p, layout, any_node=any_node) for p in schema.get("prefixItems", ())
    )
    items = schema.get("items")
    lo, hi = schema.get("minItems", 0), schema.get("maxItems")
    if prefix:
        if items is False or (hi is not None and hi <= len(prefix)):
            return ArrayNode(prefix, None, len(prefix), len(prefix))
        rest = compile_schema(items, layout, any_node=any_node) if items else any_node
        return ArrayNode(prefix, rest, len(prefix), hi)
    if items is False or hi == 0:
        return ArrayNode((), None, 0, 0)
    if not isinstance(items, Mapping):
        return any_node.array if lo == 0 and hi is None else ArrayNode((), any_node, lo, hi)
    item = compile_schema(items, layout, any_node=any_node)
    return ArrayNode((), item, lo, hi)


def output_node(
    tools: Sequence[ToolSpec], *, parallel: bool, calls: bool, text: bool, layout: JsonLayout
) -> Node:
    """The whole assistant output, as ``tool_grammar.tool_call_ebnf`` builds it: a call
    ``{"name": <tool>, "arguments": <that tool's schema>}`` (when ``parallel``, an array of one
    or more of them, or under auto also one bare call) if ``calls``, free text if ``text``."""
    if not calls:
        return TextNode()
    any_node = AnyNode(layout)
    names = LiteralNode(tuple(json_literal(t.name) for t in tools), Kind.TOOL_NAME, True)
    args = DispatchNode(
        tuple(compile_schema(t.parameters, layout, any_node=any_node) for t in tools)
    )
    call = RecordNode(
        (
            Prop("name", '"name"', names, True, Kind.FIXED_KEY, Role.DISPATCH),
            Prop("arguments", '"arguments"', args, True, Kind.FIXED_KEY, Role.SCAFFOLD),
        )
    )
    # parallel: an array of calls; under auto (text allowed) also one bare call, mirroring
    # tool_grammar.tool_call_ebnf
    array = ArrayNode((), call, 1, None)
    options: tuple[Node, ...] = ((array, call) if text else (array,)) if parallel else (call,)
    if text:
        calls_node = options[0] if len(options) == 1 else UnionNode(options)
        options = (*options, TextNode(then=calls_node))  # text, then maybe calls (auto)
    return options[0] if len(options) == 1 else UnionNode(options)
