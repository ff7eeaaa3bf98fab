"""SQLite schemas: the tables and columns a text-to-SQL grammar may name (paper §3.3, App. A.3).

A ``SqlSchema`` is read from a database file (the ``CREATE TABLE`` text in ``sqlite_master``,
opened read-only) or from DDL text, parsed with sqlglot's SQLite dialect. The same value drives
three consumers: the SQL grammar (which identifiers are legal), the structural tagger (which
words are schema identifiers) and the prompt-span labeller (which DDL spans are tables,
columns, types and constraints). ``ddl()`` renders the canonical ``CREATE TABLE`` text that
prompts carry, so the three always agree on spelling.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import sqlglot
from sqlglot import exp
from sqlglot.dialects.sqlite import SQLite
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from pask_agent.errors import DDLError

_SIMPLE_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Words that start a column constraint: the declared type ends before the first of them.
CONSTRAINT_WORDS = frozenset(
    "CONSTRAINT PRIMARY NOT NULL UNIQUE CHECK DEFAULT COLLATE REFERENCES GENERATED AS "
    "AUTOINCREMENT".split()
)
# SQL words that must not be written bare as identifiers in generated SQL.
RESERVED_WORDS = frozenset(
    "ABORT ACTION ADD ALL ALTER AND AS ASC ATTACH BETWEEN BY CASE CAST CHECK COLLATE COLUMN "
    "COMMIT CONSTRAINT CREATE CROSS CURRENT_DATE CURRENT_TIME CURRENT_TIMESTAMP DEFAULT DELETE "
    "DESC DETACH DISTINCT DROP ELSE END ESCAPE EXCEPT EXISTS FOREIGN FROM FULL GLOB GROUP HAVING "
    "IF IN INDEX INNER INSERT INTERSECT INTO IS ISNULL JOIN KEY LEFT LIKE LIMIT NATURAL NOT "
    "NOTNULL NULL OFFSET ON OR ORDER OUTER PRAGMA PRIMARY REFERENCES REPLACE RIGHT SELECT SET "
    "TABLE THEN TO UNION UNIQUE UPDATE USING VACUUM VALUES WHEN WHERE WITH".split()
)


def needs_quotes(name: str) -> bool:
    """True when ``name`` can only be written as a double-quoted identifier."""
    return not _SIMPLE_IDENT.match(name) or name.upper() in RESERVED_WORDS


def quote_identifier(name: str) -> str:
    """``name`` as SQLite spells it in generated SQL: bare when possible, else double-quoted."""
    if needs_quotes(name):
        return '"' + name.replace('"', '""') + '"'
    return name


@dataclass(frozen=True, slots=True)
class SqlColumn:
    """One column: its name, declared type text ('' when none) and constraints."""

    name: str
    type: str = ""
    primary_key: bool = False
    not_null: bool = False
    unique: bool = False
    default: str | None = None
    references: tuple[str, str] | None = None  # (table, column); column '' = the table's key


@dataclass(frozen=True, slots=True)
class SqlTable:
    """One table; ``primary_key`` lists the key columns (one or several) in order."""

    name: str
    columns: tuple[SqlColumn, ...]
    primary_key: tuple[str, ...] = ()

    def column(self, name: str) -> SqlColumn:
        for col in self.columns:
            if col.name.lower() == name.lower():
                return col
        raise KeyError(f"table {self.name!r} has no column {name!r}")

    def ddl(self) -> str:
        """Canonical ``CREATE TABLE`` text: one column per line, inline single-column keys."""
        composite = len(self.primary_key) > 1
        lines = []
        for col in self.columns:
            parts = [quote_identifier(col.name)]
            if col.type:
                parts.append(col.type)
            if col.primary_key and not composite:
                parts.append("PRIMARY KEY")
            if col.not_null:
                parts.append("NOT NULL")
            if col.unique:
                parts.append("UNIQUE")
            if col.default is not None:
                parts.append(f"DEFAULT {col.default}")
            if col.references is not None:
                table, column = col.references
                target = quote_identifier(table)
                parts.append(
                    f"REFERENCES {target}({quote_identifier(column)})"
                    if column
                    else f"REFERENCES {target}"
                )
            lines.append("  " + " ".join(parts))
        if composite:
            keys = ", ".join(quote_identifier(k) for k in self.primary_key)
            lines.append(f"  PRIMARY KEY ({keys})")
        body = ",\n".join(lines)
        return f"CREATE TABLE {quote_identifier(self.name)} (\n{body}\n);"


@dataclass(frozen=True, slots=True)
class SqlSchema:
    """The tables of one SQLite database, in definition order.

    Raises
    ------
    DDLError
        From the constructors, when the DDL cannot be parsed or defines no table.
    """

    tables: tuple[SqlTable, ...]

    def __post_init__(self) -> None:
        if not self.tables:
            raise DDLError("the schema has no tables; give at least one CREATE TABLE statement")
        seen: set[str] = set()
        for table in self.tables:
            if table.name.lower() in seen:
                raise DDLError(f"table {table.name!r} is defined twice; keep one definition")
            seen.add(table.name.lower())

    @property
    def table_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tables)

    def column_names(self) -> tuple[str, ...]:
        """Every distinct column name over all tables, first occurrence order."""
        names: dict[str, None] = {}
        for table in self.tables:
            for col in table.columns:
                names.setdefault(col.name, None)
        return tuple(names)

    def table(self, name: str) -> SqlTable:
        for table in self.tables:
            if table.name.lower() == name.lower():
                return table
        raise KeyError(f"no table {name!r}; tables are {', '.join(self.table_names)}")

    def ddl(self) -> str:
        """All tables' canonical ``CREATE TABLE`` statements, blank-line separated."""
        return "\n\n".join(t.ddl() for t in self.tables)

    @classmethod
    def from_ddl(cls, text: str) -> SqlSchema:
        """Parse SQLite DDL; statements other than ``CREATE TABLE`` (indexes, views) are ignored.

        Raises
        ------
        DDLError
            The text does not parse as SQLite, or holds no ``CREATE TABLE``.
        """
        if not isinstance(text, str) or not text.strip():
            raise DDLError(
                "the DDL text is empty; pass the CREATE TABLE statements of the database"
            )
        try:
            statements = sqlglot.parse(text, read="sqlite")
            tokens = SQLite().tokenize(text)
        except (ParseError, TokenError) as exc:
            raise DDLError(
                f"could not parse the DDL as SQLite ({_first_line(exc)}); fix that "
                "statement (each must be complete, with balanced parentheses)"
            ) from exc
        by_start = {tok.start: i for i, tok in enumerate(tokens)}
        tables = []
        for stmt in statements:
            if isinstance(stmt, exp.Create) and (stmt.kind or "").upper() == "TABLE":
                tables.append(_table_from_create(stmt, text, tokens, by_start))
        if not tables:
            raise DDLError("the DDL defines no table; it needs at least one CREATE TABLE statement")
        return cls(tables=tuple(tables))

    @classmethod
    def from_sqlite(cls, path: str | Path) -> SqlSchema:
        """Read the ``CREATE TABLE`` text of a database file opened read-only.

        Raises
        ------
        DDLError
            The file is missing, not a SQLite database, or has no tables.
        """
        path = Path(path)
        if not path.is_file():
            raise DDLError(f"{path} does not exist; pass the path of a SQLite database file")
        try:
            con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
            try:
                rows = con.execute(
                    "SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL "
                    "AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
                ).fetchall()
            finally:
                con.close()
        except sqlite3.DatabaseError as exc:
            raise DDLError(f"{path} is not a readable SQLite database ({exc})") from exc
        if not rows:
            raise DDLError(f"{path} has no tables; create them before asking questions over it")
        return cls.from_ddl(";\n".join(r[0] for r in rows) + ";")


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _name(node: exp.Expression | None) -> str:
    if isinstance(node, exp.Identifier):
        return str(node.this)
    if isinstance(node, exp.Table | exp.Column):
        return node.name
    raise DDLError(f"expected an identifier in the DDL, found {node!r}")


def _declared_type(
    text: str, tokens: list[Token], by_start: dict[int, int], ident: exp.Identifier
) -> str:
    """The declared type exactly as written: tokens after the name up to the first constraint."""
    start = ident.meta.get("start") if ident.meta else None
    if start is None:
        return ""
    # Quoted identifiers start one character earlier than the meta records on some versions.
    index = by_start.get(start, by_start.get(start - 1))
    if index is None:
        return ""
    depth, first, last = 0, None, None
    for tok in tokens[index + 1 :]:
        if depth == 0 and (
            tok.token_type in (TokenType.COMMA, TokenType.R_PAREN)
            or (
                tok.token_type not in (TokenType.STRING, TokenType.IDENTIFIER)
                and tok.text.split()[0].upper() in CONSTRAINT_WORDS
            )
        ):
            break
        depth += tok.token_type == TokenType.L_PAREN
        depth -= tok.token_type == TokenType.R_PAREN
        first = tok.start if first is None else first
        last = tok.end
    return "" if first is None or last is None else " ".join(text[first : last + 1].split())


def _reference(ref: exp.Reference) -> tuple[str, list[str]]:
    target = ref.this
    if isinstance(target, exp.Schema):
        return _name(target.this), [_name(c) for c in target.expressions]
    return _name(target), []


def _table_from_create(
    stmt: exp.Create, text: str, tokens: list[Token], by_start: dict[int, int]
) -> SqlTable:
    schema = stmt.this
    if not isinstance(schema, exp.Schema):
        raise DDLError(
            f"CREATE TABLE {stmt.this.sql()} has no column list (CREATE TABLE ... AS "
            "SELECT is not supported); write the columns out"
        )
    table_name = _name(schema.this)
    cols: dict[str, dict[str, object]] = {}
    order: list[str] = []
    pk: list[str] = []
    for item in schema.expressions:
        if isinstance(item, exp.Identifier):  # a column without a type
            cols[item.name] = {"name": item.name}
            order.append(item.name)
        elif isinstance(item, exp.ColumnDef):
            name = _name(item.this)
            col: dict[str, object] = {
                "name": name,
                "type": _declared_type(text, tokens, by_start, item.this),
            }
            for con in item.constraints:
                kind = con.kind
                if isinstance(kind, exp.PrimaryKeyColumnConstraint):
                    pk.append(name)
                elif isinstance(kind, exp.NotNullColumnConstraint):
                    col["not_null"] = not kind.args.get("allow_null")
                elif isinstance(kind, exp.UniqueColumnConstraint):
                    col["unique"] = True
                elif isinstance(kind, exp.DefaultColumnConstraint):
                    col["default"] = kind.this.sql(dialect="sqlite")
                elif isinstance(kind, exp.Reference):
                    ref_table, ref_cols = _reference(kind)
                    col["references"] = (ref_table, ref_cols[0] if ref_cols else "")
            cols[name] = col
            order.append(name)
        elif isinstance(item, exp.PrimaryKey):
            pk.extend(_name(e.this if isinstance(e, exp.Ordered) else e) for e in item.expressions)
        elif isinstance(item, exp.ForeignKey):
            ref = item.args.get("reference")
            if isinstance(ref, exp.Reference):
                ref_table, ref_cols = _reference(ref)
                for i, local in enumerate(item.expressions):
                    target = ref_cols[i] if i < len(ref_cols) else ""
                    if _name(local) in cols:
                        cols[_name(local)]["references"] = (ref_table, target)
    if not order:
        raise DDLError(f"table {table_name!r} has no columns; give it at least one")
    columns = []
    for name in order:
        spec = cols[name]
        columns.append(
            SqlColumn(
                name=name,
                type=str(spec.get("type", "")),
                primary_key=name in pk,
                not_null=bool(spec.get("not_null", False)),
                unique=bool(spec.get("unique", False)),
                default=spec.get("default"),  # type: ignore[arg-type]
                references=spec.get("references"),  # type: ignore[arg-type]
            )
        )
    unknown = [k for k in pk if k not in cols]
    if unknown:
        raise DDLError(f"table {table_name!r}: PRIMARY KEY names unknown columns {unknown}")
    return SqlTable(name=table_name, columns=tuple(columns), primary_key=tuple(pk))
