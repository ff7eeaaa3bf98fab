"""Schema-bound SQLite SELECT grammar in xgrammar EBNF (paper §3.3, App. A.1).

Why a grammar of our own: constrained decoding must make a read-only query the only thing the
model can write, and must keep table and column names inside the database's schema. The
grammar's root is one ``SELECT`` statement (compound ``UNION``/``INTERSECT``/``EXCEPT`` allowed)
with an optional trailing ``;``. No statement that writes or changes a database (``INSERT``,
``UPDATE``, ``DELETE``, ``REPLACE``, ``DROP``, ``CREATE``, ``ALTER``, ``ATTACH``, ``DETACH``,
``PRAGMA``, ``VACUUM``) has a derivation.

Conventions (the tagger in ``tagger.py`` follows the same ones, and the project's gold SQL
is stored in this canonical form):

* Keywords and function names are all upper case or all lower case (``SELECT``/``select``).
* Tokens are separated by exactly one space or newline: ``a = b``, ``x, y``, ``GROUP BY``.
  No space after ``(`` or before ``)``/``,``; function calls are ``NAME(args)``.
* Table and column names come from the schema, bare when they are plain identifiers that are
  not SQL keywords, double-quoted always (``"final grade"``). Aliases (``AS x``) are any plain
  identifier and ``AS`` is required; a qualifier before ``.`` is a table name or a short table
  alias (a letter and up to 3 letters or digits: ``T1``, ``o``, ``sub``), so a misspelt column
  cannot survive as a made-up qualifier. ``GROUP BY`` and ``ORDER BY`` may also name a
  projection alias.
* Literals: integers and decimals of at most 15 + 10 digits, single-quoted strings
  (``''`` escapes a quote, no newline), ``NULL``, ``CURRENT_DATE``/``CURRENT_TIMESTAMP``.
* Not covered: ``WITH`` (CTEs), window functions, ``NATURAL``/``RIGHT``/``FULL`` joins,
  columns of a derived table that are not schema column names.
"""

from __future__ import annotations

from pask_agent.grammars.sql.schema import SqlSchema, needs_quotes

KEYWORDS: tuple[str, ...] = (
    "SELECT",
    "DISTINCT",
    "ALL",
    "FROM",
    "WHERE",
    "GROUP",
    "BY",
    "HAVING",
    "ORDER",
    "ASC",
    "DESC",
    "LIMIT",
    "OFFSET",
    "UNION",
    "INTERSECT",
    "EXCEPT",
    "JOIN",
    "INNER",
    "LEFT",
    "OUTER",
    "CROSS",
    "ON",
    "USING",
    "AS",
    "AND",
    "OR",
    "NOT",
    "IS",
    "NULL",
    "LIKE",
    "BETWEEN",
    "IN",
    "EXISTS",
    "CASE",
    "WHEN",
    "THEN",
    "ELSE",
    "END",
    "CAST",
    "CURRENT_DATE",
    "CURRENT_TIMESTAMP",
)
SCALAR_FUNCTIONS: tuple[str, ...] = (
    "ROUND",
    "ABS",
    "LENGTH",
    "LOWER",
    "UPPER",
    "SUBSTR",
    "SUBSTRING",
    "COALESCE",
    "IFNULL",
    "NULLIF",
    "REPLACE",
    "TRIM",
    "LTRIM",
    "RTRIM",
    "INSTR",
    "IIF",
    "DATE",
    "TIME",
    "DATETIME",
    "JULIANDAY",
    "STRFTIME",
)
AGGREGATE_FUNCTIONS: tuple[str, ...] = (
    "COUNT",
    "SUM",
    "AVG",
    "MIN",
    "MAX",
    "TOTAL",
    "GROUP_CONCAT",
)
CAST_TYPES: tuple[str, ...] = ("INTEGER", "REAL", "TEXT", "NUMERIC", "FLOAT")
MAX_INT_DIGITS = 15
MAX_FRACTION_DIGITS = 10

_CORE = r"""
root ::= query ";"?
query ::= select_core (sp set_op sp select_core)* order_clause? limit_clause?
set_op ::= K_UNION (sp K_ALL)? | K_INTERSECT | K_EXCEPT
select_core ::= K_SELECT sp (K_DISTINCT sp)? proj_list from_clause? where_clause? group_clause?
proj_list ::= proj ("," sp proj)*
proj ::= "*" | qualifier ".*" | expr (sp K_AS sp alias)?
from_clause ::= sp K_FROM sp table_ref join*
join ::= "," sp table_ref | sp join_op sp table_ref join_cond?
join_op ::= K_JOIN | K_INNER sp K_JOIN | K_LEFT sp (K_OUTER sp)? K_JOIN | K_CROSS sp K_JOIN
join_cond ::= sp K_ON sp expr | sp K_USING sp "(" column_name ("," sp column_name)* ")"
table_ref ::= (table_name | "(" query ")") (sp K_AS sp table_alias)?
where_clause ::= sp K_WHERE sp expr
group_clause ::= sp K_GROUP sp K_BY sp group_item ("," sp group_item)* (sp K_HAVING sp expr)?
group_item ::= expr | alias
order_clause ::= sp K_ORDER sp K_BY sp order_item ("," sp order_item)*
order_item ::= (expr | alias) (sp (K_ASC | K_DESC))?
limit_clause ::= sp K_LIMIT sp integer (sp K_OFFSET sp integer)?
expr ::= and_expr (sp K_OR sp and_expr)*
and_expr ::= not_expr (sp K_AND sp not_expr)*
not_expr ::= K_NOT sp not_expr | predicate
predicate ::= sum_expr predicate_tail?
predicate_tail ::= sp cmp_op sp sum_expr | sp K_IS sp (K_NOT sp)? K_NULL | sp not_opt match_tail
not_opt ::= (K_NOT sp)?
match_tail ::= K_LIKE sp sum_expr | K_BETWEEN sp sum_expr sp K_AND sp sum_expr | in_tail
in_tail ::= K_IN sp "(" (query | expr ("," sp expr)*) ")"
cmp_op ::= "=" | "==" | "!=" | "<>" | "<" | "<=" | ">" | ">="
sum_expr ::= prod_expr (sp ("+" | "-" | "||") sp prod_expr)*
prod_expr ::= unary (sp ("*" | "/" | "%") sp unary)*
unary ::= "-" primary | primary
primary ::= literal | column_ref | scalar_call | aggregate_call | case_expr | cast_expr | nested
nested ::= "(" expr ")" | "(" query ")" | K_EXISTS sp "(" query ")"
column_ref ::= column_name | qualifier "." column_name
qualifier ::= table_name | table_alias
scalar_call ::= scalar_name "(" (expr ("," sp expr)*)? ")"
aggregate_call ::= count_star | aggregate_name "(" (K_DISTINCT sp)? expr ("," sp expr)* ")"
count_star ::= ("COUNT" | "count") "(*)"
case_expr ::= K_CASE (sp expr)? (sp K_WHEN sp expr sp K_THEN sp expr)+ (sp K_ELSE sp expr)? sp K_END
cast_expr ::= K_CAST "(" expr sp K_AS sp cast_type ")"
literal ::= number | string | K_NULL | K_CURRENT_DATE | K_CURRENT_TIMESTAMP
number ::= integer ("." [0-9]{1,FRAC})?
integer ::= [0-9]{1,INT}
string ::= "'" ([^'\n] | "''")* "'"
alias ::= ident | "\"" [A-Za-z0-9_ ]{1,40} "\""
ident ::= [A-Za-z_] [A-Za-z0-9_]{0,39}
table_alias ::= [A-Za-z] [A-Za-z0-9]{0,3}
sp ::= [ \n]
"""


def _literal(text: str) -> str:
    """An EBNF string literal for ``text``."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def spellings(name: str) -> list[str]:
    """How SQL may write a schema name: double-quoted always, bare when that is unambiguous."""
    quoted = '"' + name.replace('"', '""') + '"'
    return [quoted] if needs_quotes(name) else [name, quoted]


def _alternatives(words: list[str]) -> str:
    return " | ".join(_literal(w) for w in words)


def _case_pair(word: str) -> str:
    return f"{_literal(word)} | {_literal(word.lower())}"


def compile_sql_grammar(schema: SqlSchema) -> str:
    """EBNF (xgrammar syntax, root rule ``root``) for one read-only SELECT over ``schema``.

    Parameters
    ----------
    schema
        The database schema; its table and column names are the only ones the grammar allows.

    Returns
    -------
    str
        Grammar text for ``xgrammar.GrammarCompiler.compile_grammar``.
    """
    tables = sorted({s for t in schema.table_names for s in spellings(t)})
    quoted_tables = sorted({s for t in schema.table_names for s in spellings(t) if s[0] == '"'})
    columns = sorted({s for c in schema.column_names() for s in spellings(c)})
    lines = [
        _CORE.strip()
        .replace("{1,FRAC}", f"{{1,{MAX_FRACTION_DIGITS}}}")
        .replace("{1,INT}", f"{{1,{MAX_INT_DIGITS}}}"),
        f"table_name ::= {_alternatives(tables)}",
        f"table_name_quoted ::= {_alternatives(quoted_tables)}",
        f"column_name ::= {_alternatives(columns)}",
        "scalar_name ::= " + " | ".join(_case_pair(f) for f in SCALAR_FUNCTIONS),
        "aggregate_name ::= " + " | ".join(_case_pair(f) for f in AGGREGATE_FUNCTIONS),
        "cast_type ::= " + " | ".join(_case_pair(t) for t in CAST_TYPES),
    ]
    lines += [f"K_{k} ::= {_case_pair(k)}" for k in KEYWORDS]
    return "\n".join(lines) + "\n"
