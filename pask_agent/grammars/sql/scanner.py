"""Character-level scanner for the SQL tagger: a lexer plus a clause stack (one frame per
open parenthesis) over the language of ``grammar.py``.

Each closed lexeme yields its ``(cls, role, state)`` part; ``SqlTagger`` (``tagger.py``)
combines the parts of one token into a ``Tag`` and owns snapshots and rollback. The state is a
frozen value whose stack depth is the parenthesis depth and whose word buffer is bounded, so a
step's cost does not depend on how much text came before.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pask_agent.errors import GrammarRejectedError
from pask_agent.grammars.sql.grammar import (
    AGGREGATE_FUNCTIONS,
    CAST_TYPES,
    SCALAR_FUNCTIONS,
    spellings,
)
from pask_agent.grammars.sql.schema import SqlSchema

# fmt: off
_CLAUSE_ROLE = {"start": "outside_schema", "select": "projection", "from": "relation",
                "on": "relation", "using": "relation", "where": "predicate",
                "having": "predicate", "group": "projection", "order": "projection",
                "limit": "outside_schema", "compound": "outside_schema"}
# fmt: on
COMPARED_CLAUSES = frozenset(("where", "having", "on"))
CLAUSE_WORDS = frozenset(
    "SELECT FROM WHERE GROUP BY HAVING ORDER LIMIT OFFSET UNION INTERSECT "
    "EXCEPT ALL JOIN INNER LEFT OUTER CROSS ON USING".split()
)
OPERAND_LITERALS = frozenset(("NULL", "CURRENT_DATE", "CURRENT_TIMESTAMP"))
FUNCTIONS = frozenset(SCALAR_FUNCTIONS + AGGREGATE_FUNCTIONS)
_TWO_CHAR_OPS = frozenset(("<=", ">=", "<>", "!=", "==", "||"))
_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_SELECT = frozenset(("SELECT", "select", "ALL", "all"))

# What the parser expects next.
START, OPERAND, AFTER, TABLE, ALIAS, QUALIFIED, KEYWORD, INT, COLUMN, CAST_TYPE, DONE = range(11)
ITEM = 11  # an operand that starts a GROUP BY / ORDER BY item: may also be a projection alias
OPERANDS = (OPERAND, ITEM)

# fmt: off
_SIMPLE_KEYWORDS = {"IS": OPERAND, "LIKE": OPERAND, "THEN": OPERAND, "ELSE": OPERAND,
                    "WHEN": OPERAND, "ASC": AFTER, "DESC": AFTER, "NOT": KEYWORD}
_CLAUSE_KEYWORDS = {"FROM": ("from", TABLE), "WHERE": ("where", OPERAND),
                    "JOIN": ("from", TABLE), "HAVING": ("having", OPERAND),
                    "LIMIT": ("limit", INT), "ON": ("on", OPERAND), "OFFSET": ("limit", INT),
                    "USING": ("using", KEYWORD)}
# fmt: on

Part = tuple[str, str, str]  # (cls, role, state) of one lexeme


@dataclass(frozen=True, slots=True)
class Frame:
    kind: str  # query | call | cast | group | in | using
    clause: str
    case_depth: int = 0
    between: int = 0


@dataclass(frozen=True, slots=True)
class State:
    frames: tuple[Frame, ...] = (Frame("query", "start"),)
    expect: int = START
    lex: str = ""  # "" | word | number | string | string_q | quoted | quoted_q | op | space
    buf: str = ""
    pending_paren: str = "group"  # kind of frame a "(" right now would open
    pending_clause: str = ""  # clause that BY will open (after GROUP/ORDER)


def word_case_ok(word: str) -> bool:
    return word.isupper() or word.islower() or not any(c.isalpha() for c in word)


class SqlScanner:
    """Lexer and clause stack; see ``SqlTagger`` for the public, token-level API."""

    def __init__(self, schema: SqlSchema) -> None:
        self._tables = frozenset(s for t in schema.table_names for s in spellings(t))
        self._columns = frozenset(s for c in schema.column_names() for s in spellings(c))
        self._names = self._tables | self._columns
        # Longer words are never schema names, so the word buffer stays bounded by this.
        self._max_word = max(64, max(len(n) for n in self._names) + 1)
        self._state = State()
        self._touched = False  # has the open lexeme a character in the current token?

    # -- lexer -----------------------------------------------------------------------------
    def _char(self, ch: str, parts: list[Part]) -> None:
        st = self._state
        lex = st.lex
        if lex == "word" and ch in _WORD_CHARS:
            self._state = replace(st, buf=(st.buf + ch)[: self._max_word])
            self._check_word_prefix()
            return
        if lex == "number" and (ch.isdigit() or (ch == "." and "." not in st.buf)):
            self._state = replace(st, buf=st.buf + ch)
            return
        if lex == "string":
            if ch == "'":
                self._state = replace(st, lex="string_q")
            elif ch == "\n":
                raise GrammarRejectedError("a string literal may not contain a newline")
            return
        if lex == "string_q" and ch == "'":
            self._state = replace(st, lex="string")
            return
        if lex == "quoted":
            self._state = replace(
                st,
                lex="quoted_q" if ch == '"' else "quoted",
                buf=st.buf if ch == '"' else (st.buf + ch)[: self._max_word],
            )
            return
        if lex == "quoted_q" and ch == '"':
            self._state = replace(st, lex="quoted", buf=(st.buf + '""')[: self._max_word])
            return
        if lex == "op" and st.buf + ch in _TWO_CHAR_OPS:
            self._state = replace(st, buf=st.buf + ch)
            self._finish(None, parts)
            return
        if lex and lex != "space":
            self._finish(ch, parts)
        self._begin(ch, parts)

    def _begin(self, ch: str, parts: list[Part]) -> None:
        st = self._state
        if st.expect == DONE:
            raise GrammarRejectedError(f"{ch!r} after ';': only one statement is allowed")
        if ch in " \n":
            self._state = replace(st, lex="space")
        elif ch.isalpha() or ch == "_":
            self._state = replace(st, lex="word", buf=ch)
            self._check_word_prefix()
        elif ch.isdigit():
            self._state = replace(st, lex="number", buf=ch)
        elif ch == "'":
            self._state = replace(st, lex="string", buf="")
        elif ch == '"':
            self._state = replace(st, lex="quoted", buf="")
        elif ch in "<>=!|":
            self._state = replace(st, lex="op", buf=ch)
        elif ch in "(),.;*+-/%":
            self._state = replace(st, lex="", buf="")
            parts.append(self._punct(ch))
        else:
            raise GrammarRejectedError(f"character {ch!r} is not part of the SQL grammar")

    def _check_word_prefix(self) -> None:
        """Reject a word as soon as it cannot become what its position requires."""
        st = self._state
        allowed = {
            START: _SELECT,
            TABLE: self._tables,
            QUALIFIED: self._columns,
            COLUMN: self._columns,
        }.get(st.expect)
        if allowed is not None and not any(name.startswith(st.buf) for name in allowed):
            raise GrammarRejectedError(f"{st.buf!r} cannot start a word that fits here")

    def _finish(self, terminator: str | None, parts: list[Part]) -> None:
        """Close the open lexeme; ``terminator`` is the character after it (None at the end)."""
        st = self._state
        lex, buf = st.lex, st.buf
        self._state = replace(st, lex="", buf="")
        if not self._touched:  # its characters were tagged with the previous token
            parts = []
        if lex == "word":
            parts.append(self._word(buf, terminator))
        elif lex == "number":
            if buf.endswith("."):
                raise GrammarRejectedError(f"number {buf!r} needs digits after the point")
            parts.append(self._literal())
        elif lex == "string_q":
            parts.append(self._literal())
        elif lex == "quoted_q":
            parts.append(self._quoted('"' + buf + '"', terminator))
        elif lex == "op":
            parts.append(self._operator(buf))

    # -- parser ----------------------------------------------------------------------------
    def _role(self) -> str:
        return _CLAUSE_ROLE[self._state.frames[-1].clause]

    def _ident_role(self) -> str:
        return "relation" if self._state.expect == TABLE else self._role()

    def _set(
        self,
        expect: int,
        *,
        pending: str = "group",
        top: Frame | None = None,
        pending_clause: str = "",
    ) -> None:
        st = self._state
        frames = st.frames if top is None else st.frames[:-1] + (top,)
        self._state = replace(
            st, expect=expect, pending_paren=pending, frames=frames, pending_clause=pending_clause
        )

    def _literal_part(self) -> Part:
        st = self._state
        if st.frames[-1].clause in COMPARED_CLAUSES and st.expect != INT:
            return ("free_generation", self._role(), "critical")
        return ("free_generation", "outside_schema", "stable")

    def _literal(self) -> Part:
        part = self._literal_part()
        if self._state.expect not in (OPERAND, ITEM, INT):
            raise GrammarRejectedError("a literal cannot follow here; an operator or keyword must")
        self._set(AFTER)
        return part

    def _quoted(self, text: str, terminator: str | None) -> Part:
        st = self._state
        role = self._role()
        if st.expect == ALIAS or (st.expect == ITEM and text not in self._names):
            self._set(AFTER)
            return ("free_generation", role, "stable")
        ident_role = self._ident_role()
        if st.expect in OPERANDS and terminator == "." and text in self._tables:
            self._set(QUALIFIED)
        elif st.expect in (OPERAND, ITEM, QUALIFIED, COLUMN) and text in self._columns:
            self._set(AFTER)
        elif st.expect == TABLE and text in self._tables:
            self._set(AFTER, pending="")
        else:
            raise GrammarRejectedError(f"{text} is not a table or column of the schema here")
        return ("schema_bearing", ident_role, "critical")

    def _word(self, word: str, terminator: str | None) -> Part:
        st = self._state
        top = st.frames[-1]
        role = self._role()
        upper = word.upper()
        scaffold: Part = ("pure_scaffold", role, "stable")
        if st.expect == START:
            if upper == "SELECT":
                self._set(OPERAND, top=replace(top, clause="select"))
                return ("pure_scaffold", "outside_schema", "boundary")
            if upper == "ALL" and top.clause == "compound":  # UNION ALL
                self._set(START, top=replace(top, clause="start"))
                return ("pure_scaffold", "outside_schema", "boundary")
            raise GrammarRejectedError(f"expected SELECT, got {word!r}")
        if st.expect == ALIAS:
            self._set(AFTER, pending="")
            return ("free_generation", role, "stable")
        if st.expect == CAST_TYPE:
            if upper not in CAST_TYPES:
                raise GrammarRejectedError(f"CAST to {word!r}: use one of {CAST_TYPES}")
            self._set(AFTER)
            return scaffold
        if st.expect == TABLE:
            if word not in self._tables:
                raise GrammarRejectedError(f"{word!r} is not a table of the schema")
            self._set(AFTER, pending="")
            return ("schema_bearing", "relation", "critical")
        if st.expect in (QUALIFIED, COLUMN):
            if word not in self._columns:
                raise GrammarRejectedError(f"{word!r} is not a column of the schema")
            self._set(AFTER)
            return ("schema_bearing", role, "critical")
        if st.expect in OPERANDS:
            return self._operand_word(word, upper, terminator)
        if st.expect in (AFTER, KEYWORD):
            return self._keyword(upper)
        raise GrammarRejectedError(f"unexpected word {word!r}")

    def _operand_word(self, word: str, upper: str, terminator: str | None) -> Part:
        st = self._state
        top = st.frames[-1]
        role = self._role()
        scaffold: Part = ("pure_scaffold", role, "stable")
        if terminator == "(" and upper in FUNCTIONS | {"CAST"}:
            self._set(OPERAND, pending="cast" if upper == "CAST" else "call")
            return scaffold
        if terminator == ".":
            self._set(QUALIFIED)
            return ("schema_bearing", role, "critical")
        if word in self._columns:
            self._set(AFTER)
            return ("schema_bearing", role, "critical")
        if upper == "SELECT" and top.kind in ("group", "in"):
            self._set(OPERAND, top=Frame("query", "select"))
            return ("pure_scaffold", "outside_schema", "boundary")
        if upper in OPERAND_LITERALS:
            self._set(AFTER)
            return scaffold
        if upper in ("NOT", "DISTINCT") or (upper == "WHEN" and top.case_depth):
            self._set(OPERAND)
            return scaffold
        if upper == "CASE":
            self._set(OPERAND, top=replace(top, case_depth=top.case_depth + 1))
            return scaffold
        if upper == "EXISTS":
            self._set(OPERAND, pending="query")
            return scaffold
        if st.expect == ITEM:  # a projection alias
            self._set(AFTER)
            return ("free_generation", role, "stable")
        raise GrammarRejectedError(f"{word!r} is not a column of the schema")

    def _keyword(self, upper: str) -> Part:
        st = self._state
        top = st.frames[-1]
        role = self._role()
        clause_part: Part = ("pure_scaffold", "outside_schema", "boundary")
        scaffold: Part = ("pure_scaffold", role, "stable")
        if upper in ("AND", "OR"):
            if upper == "AND" and top.between:
                self._set(OPERAND, top=replace(top, between=top.between - 1))
                return scaffold
            self._set(OPERAND)
            return ("pure_scaffold", role, "boundary")
        if upper in _SIMPLE_KEYWORDS:
            self._set(_SIMPLE_KEYWORDS[upper])
            return scaffold
        if upper == "BETWEEN":
            self._set(OPERAND, top=replace(top, between=top.between + 1))
            return scaffold
        if upper == "IN":
            self._set(OPERAND, pending="in")
            return scaffold
        if upper == "END" and top.case_depth:
            self._set(AFTER, top=replace(top, case_depth=top.case_depth - 1))
            return scaffold
        if upper == "AS":
            self._set(CAST_TYPE if top.kind == "cast" else ALIAS)
            return scaffold
        if upper in _CLAUSE_KEYWORDS:
            clause, expect = _CLAUSE_KEYWORDS[upper]
            pending = {"FROM": "query", "JOIN": "query", "USING": "using"}.get(upper, "group")
            self._set(expect, pending=pending, top=replace(top, clause=clause))
            return clause_part
        if upper in ("GROUP", "ORDER"):
            self._set(KEYWORD, pending_clause=upper.lower())
            return clause_part
        if upper == "BY" and st.pending_clause:
            self._set(ITEM, top=replace(top, clause=st.pending_clause))
            return clause_part
        if upper in ("INNER", "LEFT", "CROSS", "OUTER"):
            self._set(KEYWORD)
            return clause_part
        if upper in ("UNION", "INTERSECT", "EXCEPT"):
            self._set(START, top=replace(top, clause="compound"))
            return clause_part
        raise GrammarRejectedError(f"keyword {upper!r} cannot appear here")

    def _operator(self, op: str) -> Part:
        if self._state.expect != AFTER:
            raise GrammarRejectedError(f"operator {op!r} needs a value on its left")
        self._set(OPERAND)
        return ("pure_scaffold", self._role(), "stable")

    def _punct(self, ch: str) -> Part:
        st = self._state
        top = st.frames[-1]
        role = self._role()
        boundary: Part = ("pure_scaffold", role, "boundary")
        if ch == "(":
            kind = st.pending_paren or "group"
            if kind == "query":
                self._state = replace(st, frames=st.frames + (Frame("query", "start"),))
                self._set(START)
            else:
                self._state = replace(st, frames=st.frames + (Frame(kind, top.clause),))
                self._set(COLUMN if kind == "using" else OPERAND)
            return boundary
        if ch == ")":
            if len(st.frames) == 1:
                raise GrammarRejectedError("')' closes no open parenthesis")
            popped = st.frames[-1]
            self._state = replace(st, frames=st.frames[:-1])
            after_table = popped.kind == "query" and self._state.frames[-1].clause == "from"
            self._set(AFTER, pending="" if after_table else "group")
            return ("pure_scaffold", self._role(), "boundary")  # the enclosing clause's paren
        if ch == ",":
            nxt = {"from": TABLE, "using": COLUMN}.get(top.clause, OPERAND)
            if top.kind == "query" and top.clause in ("group", "order"):
                nxt = ITEM
            self._set(nxt, pending="query" if nxt == TABLE else "group")
            return boundary
        if ch == ".":
            if st.expect != QUALIFIED:
                raise GrammarRejectedError("'.' must follow a table name or an alias")
            return boundary
        if ch == ";":
            if len(st.frames) != 1 or st.expect != AFTER or top.case_depth or top.between:
                raise GrammarRejectedError("';' may only end a complete statement")
            self._set(DONE)
            return ("pure_scaffold", "outside_schema", "boundary")
        if st.expect in (OPERAND, ITEM, QUALIFIED) and ch in "*-":
            self._set(AFTER if ch == "*" else OPERAND)  # SELECT *, T1.*, COUNT(*), unary minus
            return ("pure_scaffold", role, "stable")
        return self._operator(ch)
