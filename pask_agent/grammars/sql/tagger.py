"""Structural tagger for schema-bound SQL: one ``Tag`` per generated token (paper §3.3, A.1).

xgrammar decides which tokens are legal but keeps its parser state private, so this is a small
incremental parser of our own over the language of ``grammar.py``: a character-level lexer
(words, numbers, strings, quoted identifiers, operators) feeding a clause stack with one frame
per open parenthesis. A step touches only the top frame and a bounded word buffer, so the work
per token does not depend on how long the query already is, and a snapshot per token makes
``rollback`` exact.

Tag mapping (family ``sql``):

* **cls**: table/column names and qualifiers (``T1.``) → ``schema_bearing``; literals and
  aliases → ``free_generation``; keywords, functions, operators, punctuation →
  ``pure_scaffold``.
* **role**: from the clause the token sits in: ``SELECT`` list, ``GROUP BY`` and ``ORDER BY``
  keys → ``projection``; ``FROM``/``JOIN`` table references and ``ON``/``USING`` join
  conditions → ``relation``; ``WHERE``/``HAVING`` → ``predicate``. Clause keywords themselves
  (``SELECT``, ``FROM``, ``WHERE``, ``GROUP``, ``BY``, ``JOIN``, ``ON``, ``LIMIT``, ``UNION``,
  ...), ``LIMIT``/``OFFSET`` numbers, ``;`` and literals outside ``WHERE``/``HAVING``/``ON``
  → ``outside_schema``. A subquery's tokens follow the subquery's own clauses.
* **state**: schema identifiers, qualifiers and literals compared in ``WHERE``/``HAVING``/
  ``ON`` → ``critical``; clause keywords, ``AND``/``OR``, commas, parentheses, ``.`` and ``;``
  → ``boundary``; everything else → ``stable``.
* **next**: ``lookahead_critical`` when the token ends inside a schema identifier or a compared
  literal, or where the next lexeme is expected to be one (after ``FROM``, ``JOIN``, ``.``,
  ``SELECT``, ``WHERE``, an operator, a comma, ``(`` ...: any operand position outside
  ``LIMIT``); else ``no_lookahead``.

A token that covers several lexemes takes, field by field, the most conservative value:
``schema_bearing > free_generation > pure_scaffold``, ``critical > boundary > stable``,
``relation > predicate > projection > outside_schema``. Whitespace counts only when a token is
whitespace alone. A lexeme still open when a token ends (``Ġcustomer`` before ``_id``) is tagged
from what is known then; a word in operand position that could still become a column or a
qualifier is tagged ``schema_bearing``/``critical``.
"""

from __future__ import annotations

from pask_agent.errors import GrammarRejectedError
from pask_agent.grammars.sql.scanner import (
    AFTER,
    ALIAS,
    CLAUSE_WORDS,
    COLUMN,
    COMPARED_CLAUSES,
    DONE,
    FUNCTIONS,
    INT,
    ITEM,
    KEYWORD,
    OPERAND,
    OPERAND_LITERALS,
    OPERANDS,
    QUALIFIED,
    START,
    TABLE,
    Part,
    SqlScanner,
    State,
    word_case_ok,
)
from pask_agent.grammars.sql.schema import SqlSchema
from pask_agent.grammars.tags import Tag

_CLS = ("pure_scaffold", "free_generation", "schema_bearing")
_STATE = ("stable", "boundary", "critical")
_ROLE = ("outside_schema", "projection", "predicate", "relation")
# Words in operand position that are scaffold once complete (unless a schema name continues).
_OPERAND_KEYWORDS = (
    FUNCTIONS | OPERAND_LITERALS | {"NOT", "CASE", "EXISTS", "CAST", "DISTINCT", "WHEN", "SELECT"}
)


class SqlTagger(SqlScanner):
    """Incremental tagger over the accepted text of one generated SELECT.

    Parameters
    ----------
    schema
        The schema the grammar was compiled from: its names decide which words are identifiers.

    Raises
    ------
    GrammarRejectedError
        From ``feed``, when the text cannot belong to the SQL grammar (unbalanced ``)``, text
        after ``;``, characters outside SQL); the tagger state is left as before that token.
    """

    def __init__(self, schema: SqlSchema) -> None:
        super().__init__(schema)
        self._history: list[State] = []

    # -- public API ------------------------------------------------------------------------
    def feed(self, token_text: str) -> Tag:
        """Consume one token's text and return its tag."""
        before = self._state
        parts: list[Part] = []
        self._touched = False  # has the open lexeme any character in this token?
        try:
            for ch in token_text:
                self._char(ch, parts)
                self._touched = True
        except GrammarRejectedError as exc:
            self._state = before
            raise GrammarRejectedError(str(exc), token_index=len(self._history)) from None
        self._history.append(before)
        open_part = self._open_part()
        if open_part is not None:
            parts.append(open_part)
        return self._combine(parts)

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` fed tokens."""
        if n < 0 or n > len(self._history):
            raise GrammarRejectedError(f"cannot roll back {n} tokens; {len(self._history)} fed")
        if n:
            self._state = self._history[-n]
            del self._history[-n:]

    @property
    def is_complete(self) -> bool:
        """True when the text so far is a whole statement of the grammar."""
        st = self._state
        if st.lex in ("string", "quoted", "op", "space"):
            return False
        if st.lex:
            saved = self._state
            try:
                self._finish(None, [])
                st = self._state
            except GrammarRejectedError:
                return False
            finally:
                self._state = saved
        top = st.frames[-1]
        return (
            len(st.frames) == 1
            and st.expect in (AFTER, DONE)
            and top.case_depth == 0
            and top.between == 0
            and top.clause != "start"
        )

    @property
    def num_tokens(self) -> int:
        return len(self._history)

    # -- tags ------------------------------------------------------------------------------
    def _combine(self, parts: list[Part]) -> Tag:
        nxt = "lookahead_critical" if self._lookahead_critical() else "no_lookahead"
        if not parts:  # whitespace only
            return Tag("pure_scaffold", self._role(), "stable", nxt)
        cls = max((p[0] for p in parts), key=_CLS.index)
        role = max((p[1] for p in parts), key=_ROLE.index)
        state = max((p[2] for p in parts), key=_STATE.index)
        return Tag(cls, role, state, nxt)

    def _lookahead_critical(self) -> bool:
        st = self._state
        if st.lex in ("word", "quoted"):
            part = self._open_part()
            if part is not None and part[2] == "critical":
                return True
        if st.lex in ("string", "string_q", "number"):
            return st.frames[-1].clause in COMPARED_CLAUSES and st.expect != INT
        if st.lex in ("word", "op"):  # a keyword or operator that the next space would close
            saved = st
            try:
                self._finish(" ", [])
                st = self._state
            except GrammarRejectedError:
                return False
            finally:
                self._state = saved
        if st.expect in (TABLE, QUALIFIED, COLUMN):
            return True
        return st.expect in OPERANDS and st.frames[-1].clause != "limit"

    def _open_part(self) -> Part | None:
        """Provisional tag of the lexeme still open at the end of a token."""
        st = self._state
        role = self._role()
        if st.lex == "word":
            if st.expect in (OPERAND, ITEM, QUALIFIED, TABLE, COLUMN):
                upper = st.buf.upper()
                keyword = upper in _OPERAND_KEYWORDS and word_case_ok(st.buf)
                if st.expect in OPERANDS and keyword and not self._prefix_of_name(st.buf):
                    return ("pure_scaffold", role, "stable")
                return ("schema_bearing", self._ident_role(), "critical")
            if st.expect == ALIAS:
                return ("free_generation", role, "stable")
            if st.expect in (START, AFTER, KEYWORD):
                upper = st.buf.upper()
                return (
                    "pure_scaffold",
                    "outside_schema" if upper in CLAUSE_WORDS else role,
                    "boundary" if upper in CLAUSE_WORDS | {"AND", "OR"} else "stable",
                )
            return ("pure_scaffold", role, "stable")
        if st.lex in ("quoted", "quoted_q"):
            if st.expect == ALIAS:
                return ("free_generation", role, "stable")
            return ("schema_bearing", self._ident_role(), "critical")
        if st.lex in ("number", "string", "string_q"):
            return self._literal_part()
        if st.lex == "op":
            return ("pure_scaffold", role, "stable")
        return None

    def _prefix_of_name(self, word: str) -> bool:
        return any(name.startswith(word) and name != word for name in self._names)
