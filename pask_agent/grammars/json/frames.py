"""The JSON scanner's state: small immutable parse frames on a linked stack (see ``lexer``).

Frames compare by value so that equal parser configurations can be merged; each one points at the
schema node (``nodes``) it is reading. Phases and number states are plain ints so that a frame
stays a cheap, hashable record.
"""

from __future__ import annotations

from dataclasses import dataclass

from pask_agent.grammars.json.nodes import (
    ArrayNode,
    Kind,
    LiteralNode,
    MapNode,
    Node,
    NumberNode,
    RecordNode,
    Role,
    StringNode,
)

# Phases shared by record and map frames.
OPEN, KEY, COLON, COLON_SP, VALUE, AFTER, COMMA_SP, KEY_OPEN = range(8)
# Number automaton states (JSON number with the layout's digit bounds).
N_START, N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_EMARK, N_ESIGN, N_EXP = range(9)


@dataclass(frozen=True, slots=True)
class StartFrame:
    node: Node
    role: Role


@dataclass(frozen=True, slots=True)
class RecFrame:
    node: RecordNode
    phase: int
    idx: int  # first property that may still be written
    cands: tuple[int, ...]  # properties whose key matches what was read (KEY) or was chosen
    pos: int  # characters of the key read so far, opening quote included
    role: Role
    choice: int  # index of the completed dispatch literal, -1 before


@dataclass(frozen=True, slots=True)
class MapFrame:
    node: MapNode
    phase: int
    role: Role


@dataclass(frozen=True, slots=True)
class ArrFrame:
    node: ArrayNode
    phase: int
    count: int  # items started so far (capped, see _cap)
    role: Role


@dataclass(frozen=True, slots=True)
class StrFrame:
    node: StringNode
    esc: int  # 0 plain, -1 after a backslash, k > 0: k hex digits of \uXXXX still due
    count: int  # JSON characters so far (capped)
    role: Role


@dataclass(frozen=True, slots=True)
class LitFrame:
    node: LiteralNode
    cands: tuple[int, ...]
    pos: int
    role: Role


@dataclass(frozen=True, slots=True)
class NumFrame:
    node: NumberNode
    state: int
    ndig: int  # digits in the current section (integer, fraction or exponent part)
    role: Role


@dataclass(frozen=True, slots=True)
class TextFrame:
    """Inside free text: ``line_start`` right after a newline; ``then`` the calls that may
    start there (``TextNode.then``)."""

    line_start: bool = False
    then: Node | None = None


Frame = StartFrame | RecFrame | MapFrame | ArrFrame | StrFrame | LitFrame | NumFrame | TextFrame
Stack = tuple[Frame, "Stack"] | None
Step = tuple[Stack, Kind, Role]
