"""Prompt span labels for SQLite DDL in a text-to-SQL prompt (paper §3.6, App. A.3, Table 6).

All prompt text starts as ``protected_content``. A ``CREATE TABLE`` statement becomes schema
text only after it is validated: it must parse with sqlglot (SQLite dialect) as a table
definition whose name is a table of the given schema. Inside a validated statement:

* table identifiers (the defined table and ``REFERENCES`` targets) → ``function_name``;
* column identifiers (definitions, key lists, referenced columns) → ``parameter_key``;
* declared column types (``INTEGER``, ``VARCHAR(20)``) → ``type_constraint``;
* constraints (``PRIMARY KEY``, ``NOT NULL``, ``UNIQUE``, ``DEFAULT`` and its value,
  ``REFERENCES``, ``FOREIGN KEY``, ``CHECK``, ``COLLATE``, ``AUTOINCREMENT``, ``ON DELETE``...)
  → ``enum_constraint``;
* everything else in the statement (``CREATE TABLE``, parentheses, commas, whitespace, ``;``,
  ``CHECK`` expressions) → ``schema_scaffold``.

Quoted identifiers are labelled inside the quotes; the quotes are scaffold. The labels reach
tokens through ``span_labels.labels_for_tokens`` (offset mapping, conservative combination).

A BIRD-style prompt (``integrations/sql_prompt.py``) follows each table with example rows and
the values of its short text columns. Most of a linked prompt is that text, so leaving it
``protected_content`` would make the plan for a schema-heavy prompt about instructions it does
not have. Lines in exactly that format, naming a table and columns of the schema, are labelled:

* ``/* N example rows from T:`` block: ``T`` → ``function_name``, the header's column names →
  ``parameter_key``, the rows → ``schema_description`` (illustrations the query never copies),
  the rest → ``schema_scaffold``;
* ``-- T.c is one of: 'a', 'b'``: ``T`` → ``function_name``, ``c`` → ``parameter_key``, each
  value → ``enum_constraint`` (the complete set a ``WHERE`` must copy exactly); after
  ``e.g.:`` the values are examples, ``schema_description``; the rest → ``schema_scaffold``.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.dialects.sqlite import SQLite
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from pask_agent.grammars.span_labels import CharSpan, labels_for_tokens, spans_of_char_labels
from pask_agent.grammars.sql.schema import CONSTRAINT_WORDS, SqlSchema

_CREATE = re.compile(r"\bCREATE\s+TABLE\b", re.IGNORECASE)
_QUOTES = {'"': '"', "`": "`", "[": "]", "'": "'"}
_TABLE_CONSTRAINTS = frozenset(("CONSTRAINT", "PRIMARY", "FOREIGN", "UNIQUE", "CHECK"))
_NAME_TYPES = (TokenType.VAR, TokenType.IDENTIFIER)
_NAME = r'(?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)'
_ROWS_BLOCK = re.compile(
    r"^/\*\n\d+ example rows from (?P<table>[^\n:]+):\n"
    r"(?P<header>[^\n]*)\n(?P<rows>(?:.*\n)*?)\*/",
    re.MULTILINE,
)
_VALUES_LINE = re.compile(
    rf"^-- (?P<table>{_NAME})\.(?P<column>{_NAME}) (?P<kind>is one of|e\.g\.): (?P<values>.*)$",
    re.MULTILINE,
)
_VALUE = re.compile(r"'(?:[^']|'')*'")


def find_ddl_spans(text: str, schema: SqlSchema) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of validated ``CREATE TABLE`` statements in ``text``."""
    return [(start, end) for start, end, _ in _ddl_statements(text, schema)]


def _ddl_statements(text: str, schema: SqlSchema) -> list[tuple[int, int, str]]:
    """``(start, end, table)`` of each validated ``CREATE TABLE`` statement in ``text``."""
    names = {n.lower() for n in schema.table_names}
    spans: list[tuple[int, int, str]] = []
    for match in _CREATE.finditer(text):
        if spans and match.start() < spans[-1][1]:
            continue
        end = _statement_end(text, match.end())
        if end is None:
            continue
        try:
            stmt = sqlglot.parse_one(text[match.start() : end], read="sqlite")
        except (ParseError, TokenError):
            continue
        if (
            isinstance(stmt, exp.Create)
            and isinstance(stmt.this, exp.Schema)
            and stmt.this.this.name.lower() in names
        ):
            spans.append((match.start(), end, stmt.this.this.name.lower()))
    return spans


def label_ddl_spans(
    text: str, schema: SqlSchema, *, unlinked: Collection[str] = ()
) -> list[CharSpan]:
    """Table-6 labels as a sorted partition of ``text`` into ``(start, end, label)`` spans.

    Every block of a table in ``unlinked`` (its ``CREATE TABLE``, example rows and value
    lines) is ``unlinked_schema`` as a whole: the question names neither the table nor its
    values (``integrations/sql_prompt.unlinked_tables``), so under a budget it is what goes
    first, before any part of a table the query will likely read.
    """
    labels = ["protected_content"] * len(text)
    blocks: list[tuple[int, int, str]] = []
    for start, end, table in _ddl_statements(text, schema):
        blocks.append((start, end, table))
        labels[start:end] = ["schema_scaffold"] * (end - start)
        tokens = SQLite().tokenize(text[start:end])
        for s, e, label in _label_statement(text[start:end], tokens):
            labels[start + s : start + e] = [label] * (e - s)
    for spans, block in (_label_rows_blocks(text, schema), _label_values_lines(text, schema)):
        for s, e, label in spans:
            labels[s:e] = [label] * (e - s)
        blocks += block
    skip = {t.lower() for t in unlinked}
    for s, e, table in blocks:
        if table in skip:
            labels[s:e] = ["unlinked_schema"] * (e - s)
    return spans_of_char_labels(labels)


def _unquote(name: str) -> str:
    return name[1:-1].replace('""', '"') if name.startswith('"') else name


def _columns_of(schema: SqlSchema, table: str) -> set[str] | None:
    """Lower-cased column names of ``table``, or None when the schema has no such table."""
    try:
        return {c.name.lower() for c in schema.table(table).columns}
    except KeyError:
        return None


def _label_rows_blocks(
    text: str, schema: SqlSchema
) -> tuple[list[CharSpan], list[tuple[int, int, str]]]:
    """Example-row blocks whose table and header columns are the schema's: their labels, and
    ``(start, end, table)`` of each block."""
    out: list[CharSpan] = []
    blocks: list[tuple[int, int, str]] = []
    for m in _ROWS_BLOCK.finditer(text):
        columns = _columns_of(schema, m["table"])
        names = m["header"].split(" | ")
        if columns is None or not all(n.lower() in columns for n in names):
            continue
        blocks.append((m.start(), m.end(), m["table"].lower()))
        out.append((m.start(), m.end(), "schema_scaffold"))
        out.append((m.start("table"), m.end("table"), "function_name"))
        at = m.start("header")
        for name in names:
            out.append((at, at + len(name), "parameter_key"))
            at += len(name) + 3
        if m["rows"]:
            out.append((m.start("rows"), m.end("rows") - 1, "schema_description"))
    return out, blocks


def _label_values_lines(
    text: str, schema: SqlSchema
) -> tuple[list[CharSpan], list[tuple[int, int, str]]]:
    """``-- table.column is one of: ...`` lines whose table and column are the schema's: their
    labels, and ``(start, end, table)`` of each line."""
    out: list[CharSpan] = []
    blocks: list[tuple[int, int, str]] = []
    for m in _VALUES_LINE.finditer(text):
        columns = _columns_of(schema, _unquote(m["table"]))
        if columns is None or _unquote(m["column"]).lower() not in columns:
            continue
        blocks.append((m.start(), m.end(), _unquote(m["table"]).lower()))
        out.append((m.start(), m.end(), "schema_scaffold"))
        for group, label in (("table", "function_name"), ("column", "parameter_key")):
            quoted = m[group].startswith('"')
            out.append((m.start(group) + quoted, m.end(group) - quoted, label))
        value = "enum_constraint" if m["kind"] == "is one of" else "schema_description"
        base = m.start("values")
        out += [(base + v.start(), base + v.end(), value) for v in _VALUE.finditer(m["values"])]
    return out, blocks


def label_ddl_tokens(
    text: str, schema: SqlSchema, tokenizer: Any, *, add_special_tokens: bool = False
) -> list[str]:
    """One Table-6 label per token of ``tokenizer(text)``."""
    return labels_for_tokens(
        text, label_ddl_spans(text, schema), tokenizer, add_special_tokens=add_special_tokens
    )


def _statement_end(text: str, i: int) -> int | None:
    """End (exclusive, after an optional ``;``) of the statement whose body starts after ``i``."""
    depth, quote = 0, ""
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = ""
        elif ch in _QUOTES:
            quote = _QUOTES[ch]
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                j = i + 1
                while j < len(text) and text[j] in " \t":
                    j += 1
                return j + 1 if j < len(text) and text[j] == ";" else i + 1
            if depth < 0:
                return None
        elif ch == ";" and depth == 0:
            return None
        i += 1
    return None


def _name_span(tok: Token) -> tuple[int, int]:
    """Characters of an identifier without its quotes."""
    if tok.token_type == TokenType.IDENTIFIER:
        return tok.start + 1, tok.end
    return tok.start, tok.end + 1


def _label_statement(stmt: str, tokens: list[Token]) -> list[CharSpan]:
    out: list[CharSpan] = []

    def put(tok: Token, label: str) -> None:
        if label in ("function_name", "parameter_key"):
            s, e = _name_span(tok)
            out.append((s, e, label))
        else:
            out.append((tok.start, tok.end + 1, label))

    i = 0
    while i < len(tokens) and tokens[i].token_type != TokenType.L_PAREN:
        if tokens[i].token_type in _NAME_TYPES and tokens[i].text.upper() != "IF":
            put(tokens[i], "function_name")  # the table name (and its schema prefix)
        i += 1
    item_start, mode, depth = True, "", 1
    i += 1
    while i < len(tokens) and depth > 0:
        tok = tokens[i]
        kind, word = tok.token_type, tok.text.split()[0].upper() if tok.text else ""
        if kind == TokenType.L_PAREN:
            depth += 1
            if mode == "type":
                put(tok, "type_constraint")
        elif kind == TokenType.R_PAREN:
            depth -= 1
            if mode == "type" and depth >= 1:
                put(tok, "type_constraint")
        elif depth == 1 and kind == TokenType.COMMA:
            item_start, mode = True, ""
        elif item_start:
            item_start = False
            if word in _TABLE_CONSTRAINTS and kind not in (TokenType.IDENTIFIER,):
                mode = "table_constraint"
                put(tok, "enum_constraint")
            else:
                mode = "type"
                put(tok, "parameter_key")
        elif (
            mode == "type"
            and depth == 1
            and word in CONSTRAINT_WORDS
            and kind
            not in (
                TokenType.IDENTIFIER,
                TokenType.STRING,
            )
        ):
            mode = _label_constraint_token(tok, tokens, i, depth, "constraint", put)
        elif mode == "type":
            put(tok, "type_constraint")
        else:
            mode = _label_constraint_token(tok, tokens, i, depth, mode, put)
        i += 1
    return out


def _label_constraint_token(
    tok: Token, tokens: list[Token], i: int, depth: int, mode: str, put: Any
) -> str:
    """Label one token inside a column or table constraint; returns the new mode."""
    kind = tok.token_type
    prev = tokens[i - 1].token_type if i else None
    if kind == TokenType.REFERENCES:
        put(tok, "enum_constraint")
        return "references"
    if mode == "references" and kind in _NAME_TYPES and prev == TokenType.REFERENCES:
        put(tok, "function_name")
        return "references"
    if kind in _NAME_TYPES and depth == 2 and mode in ("references", "table_constraint"):
        put(tok, "parameter_key")
        return mode
    if mode == "check" and depth >= 2:
        return mode  # the CHECK expression stays scaffold
    if tok.text.upper() == "CHECK":
        put(tok, "enum_constraint")
        return "check"
    if depth == 1:
        put(tok, "enum_constraint")
        return "constraint" if mode != "table_constraint" else mode
    return mode
