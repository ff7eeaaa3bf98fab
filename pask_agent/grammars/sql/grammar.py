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
* Columns are bound to tables where a left-to-right grammar can tell (``compile_sql_grammar``):
  a query that reads one table names only that table's columns, and ``table.col`` accepts only
  ``table``'s. An alias (``T2.col``) in a join still qualifies any column, since the alias is
  declared after it is used; ``table_aliases=False`` forbids table aliases, so every qualified
  column is bound, and makes every ``JOIN`` state its condition.
* Literals: integers and decimals of at most 15 + 10 digits, single-quoted strings
  (``''`` escapes a quote, no newline), ``NULL``, ``CURRENT_DATE``/``CURRENT_TIMESTAMP``.
* Not covered: ``WITH`` (CTEs), window functions, ``NATURAL``/``RIGHT``/``FULL`` joins,
  columns of a derived table that are not schema column names.
"""

from __future__ import annotations

import re

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

_SHARED = r"""
root ::= query ";"?
compound_query ::= any_core (sp set_op sp any_core)+ order_clause? limit_clause?
free_query ::= (joined_core | bare_core) order_clause? limit_clause?
set_op ::= K_UNION (sp K_ALL)? | K_INTERSECT | K_EXCEPT
bare_core ::= K_SELECT sp (K_DISTINCT sp)? proj_list
joined_core ::= K_SELECT sp (K_DISTINCT sp)? proj_list sp K_FROM sp joined_from joined_tail
joined_tail ::= where_clause? group_clause?
join_cond ::= sp K_ON sp expr | sp K_USING sp "(" column_name ("," sp column_name)* ")"
derived_ref ::= "(" query ")" (sp K_AS sp table_alias)?
not_opt ::= (K_NOT sp)?
cmp_op ::= "=" | "==" | "!=" | "<>" | "<" | "<=" | ">" | ">="
limit_clause ::= sp K_LIMIT sp integer (sp K_OFFSET sp integer)?
count_star ::= ("COUNT" | "count") "(*)"
literal ::= number | string | K_NULL | K_CURRENT_DATE | K_CURRENT_TIMESTAMP
number ::= integer ("." [0-9]{1,FRAC})?
integer ::= [0-9]{1,INT}
string ::= "'" ([^'\n] | "''")* "'"
alias ::= ident | "\"" [A-Za-z0-9_ ]{1,40} "\""
ident ::= [A-Za-z_] [A-Za-z0-9_]{0,39}
table_alias ::= [A-Za-z] [A-Za-z0-9]{0,3}
sp ::= [ \n]
"""

_SCOPED = r"""
proj_list ::= proj ("," sp proj)*
proj ::= "*" | qualifier ".*" | expr (sp K_AS sp alias)?
where_clause ::= sp K_WHERE sp expr
group_clause ::= sp K_GROUP sp K_BY sp group_item ("," sp group_item)* (sp K_HAVING sp expr)?
group_item ::= expr | alias
order_clause ::= sp K_ORDER sp K_BY sp order_item ("," sp order_item)*
order_item ::= (expr | alias) (sp (K_ASC | K_DESC))?
expr ::= and_expr (sp K_OR sp and_expr)*
and_expr ::= not_expr (sp K_AND sp not_expr)*
not_expr ::= K_NOT sp not_expr | predicate
predicate ::= sum_expr predicate_tail?
predicate_tail ::= sp cmp_op sp sum_expr | sp K_IS sp (K_NOT sp)? K_NULL | sp not_opt match_tail
match_tail ::= K_LIKE sp sum_expr | K_BETWEEN sp sum_expr sp K_AND sp sum_expr | in_tail
in_tail ::= K_IN sp "(" (query | expr ("," sp expr)*) ")"
sum_expr ::= prod_expr (sp ("+" | "-" | "||") sp prod_expr)*
prod_expr ::= unary (sp ("*" | "/" | "%") sp unary)*
unary ::= "-" primary | primary
primary ::= literal | column_ref | scalar_call | aggregate_call | case_expr | cast_expr | nested
nested ::= "(" expr ")" | "(" query ")" | K_EXISTS sp "(" query ")"
scalar_call ::= scalar_name "(" (expr ("," sp expr)*)? ")"
aggregate_call ::= count_star | aggregate_name "(" (K_DISTINCT sp)? expr ("," sp expr)* ")"
case_expr ::= K_CASE (sp expr)? (sp K_WHEN sp expr sp K_THEN sp expr)+ (sp K_ELSE sp expr)? sp K_END
cast_expr ::= K_CAST "(" expr sp K_AS sp cast_type ")"
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


_SCOPED_RULES = tuple(line.split(" ::= ")[0] for line in _SCOPED.strip().splitlines()) + (
    "column_ref",
    "column_name",
    "qualifier",
)
MAX_BOUND_TABLES = 32  # past this the per-table branches cost more to compile than they bind


def _scoped(suffix: str) -> str:
    """The clause and expression rules, renamed for one column scope (``""`` = every column)."""
    text = _SCOPED.strip()
    if not suffix:
        return text
    pattern = re.compile(r"\b(" + "|".join(_SCOPED_RULES) + r")\b")
    return pattern.sub(lambda m: m.group(1) + suffix, text)


# Without table aliases, a small model's ``T1.`` habit starts with the token ``T``; left only
# these names to continue it, it wrote ``TIME(``/``TOTAL(``/``TRIM(`` in 52 of 245 dev
# candidates (results/sql_dev_unaliased_full). They go when aliases do (``TOTAL`` is ``SUM``
# that returns 0.0 on no rows; a question here rarely needs the others).
ALIAS_LOOKALIKES = frozenset({"TIME", "TOTAL", "TRIM"})


def _functions(names: tuple[str, ...], table_aliases: bool) -> list[str]:
    return [n for n in names if table_aliases or n not in ALIAS_LOOKALIKES]


def _joins(table_aliases: bool) -> list[str]:
    """How tables are joined: aliased and optionally conditioned, or by name with a condition."""
    cond, cross, alias = ("join_cond?", " | K_CROSS sp K_JOIN", " (sp K_AS sp table_alias)?")
    if not table_aliases:
        cond, cross, alias = "join_cond", "", ""
    return [
        f'join ::= "," sp table_ref | sp join_op sp table_ref {cond}',
        f"join_op ::= K_JOIN | K_INNER sp K_JOIN | K_LEFT sp (K_OUTER sp)? K_JOIN{cross}",
        f"table_ref ::= table_name{alias} | derived_ref",
    ]


def compile_sql_grammar(
    schema: SqlSchema, *, bind_columns: bool = True, table_aliases: bool = True
) -> str:
    """EBNF (xgrammar syntax, root rule ``root``) for one read-only SELECT over ``schema``.

    Why the per-table branches: a left-to-right grammar cannot see ``FROM`` while the select
    list is written, but it can keep one branch alive per table in which only that table's
    columns exist. The parser follows every branch at once; a query that turns out to read one
    table keeps the branch of that table, so it cannot name another table's column anywhere
    (select list, ``WHERE``, ``GROUP BY``, ``HAVING``, ``ORDER BY``). A query with a join, a
    derived table or a compound operator takes the free branch, where an alias (``T1.col``)
    may qualify any column, but a table's own name qualifies only that table's columns.
    Subqueries are whole queries and are bound the same way on their own.

    Parameters
    ----------
    schema
        The database schema; its table and column names are the only ones the grammar allows.
    bind_columns
        ``False`` gives the unbound grammar of earlier releases (any column anywhere); kept to
        measure what binding changes. Schemas of more than ``MAX_BOUND_TABLES`` tables bind
        qualified names only.
    table_aliases
        ``False`` leaves tables unaliased (``FROM customers JOIN orders ON ...``), so a
        qualifier is always a table's own name and binds its column in joins too, where a
        small model's ``T2.first_name`` otherwise names the wrong table; a ``JOIN`` must then
        state its condition (``ON``/``USING``), and ``CROSS JOIN`` is gone. A derived table may
        still be aliased, but its columns are named bare. ``TIME``, ``TOTAL`` and ``TRIM``
        go too (``ALIAS_LOOKALIKES``).

    Returns
    -------
    str
        Grammar text for ``xgrammar.GrammarCompiler.compile_grammar``.
    """
    tables = schema.tables
    bound = bind_columns and len(tables) <= MAX_BOUND_TABLES
    suffixes = [f"_t{i}" for i in range(len(tables))]
    all_tables = sorted({s for t in tables for s in spellings(t.name)})
    all_columns = sorted({s for c in schema.column_names() for s in spellings(c)})
    shared = (
        _SHARED.strip()
        .replace("{1,FRAC}", f"{{1,{MAX_FRACTION_DIGITS}}}")
        .replace("{1,INT}", f"{{1,{MAX_INT_DIGITS}}}")
    )
    if bound:  # a plain table read alone is some table's branch, so the free one must join
        queries = " | ".join(f"query{s}" for s in suffixes)
        cores = " | ".join(f"core{s}" for s in suffixes)
        structure = [
            f"query ::= compound_query | free_query | {queries}",
            f"any_core ::= joined_core | bare_core | {cores}",
            "joined_from ::= table_ref join+ | derived_ref join*",
        ]
    else:
        structure = [
            "query ::= compound_query | free_query",
            "any_core ::= joined_core | bare_core",
            "joined_from ::= table_ref join*",
        ]
    lines = [shared, *structure, *_joins(table_aliases), _scoped("")]
    lines.append(f"table_name ::= {_alternatives(all_tables)}")
    lines.append(f"column_name ::= {_alternatives(all_columns)}")
    qualified = [f'table_name{s} "." column_name{s}' for s in suffixes]
    alias_ref = ' | table_alias "." column_name' if table_aliases else ""
    lines.append(
        "column_ref ::= column_name" + alias_ref + " | " + " | ".join(qualified)
        if bind_columns
        else 'column_ref ::= column_name | qualifier "." column_name'
    )
    or_alias = " | table_alias" if table_aliases else ""
    own_alias = " (sp K_AS sp table_alias)?" if table_aliases else ""
    lines.append(f"qualifier ::= table_name{or_alias}")
    for table, s in zip(tables, suffixes, strict=True):
        columns = sorted({sp for c in table.columns for sp in spellings(c.name)})
        lines += [
            f"table_name{s} ::= {_alternatives(spellings(table.name))}",
            f"column_name{s} ::= {_alternatives(columns)}",
        ]
        if not bound:
            continue
        lines += [
            f"query{s} ::= core{s} order_clause{s}? limit_clause?",
            f"core{s} ::= K_SELECT sp (K_DISTINCT sp)? proj_list{s} sp K_FROM sp table_name{s}"
            f"{own_alias} where_clause{s}? group_clause{s}?",
            f'column_ref{s} ::= column_name{s} | qualifier{s} "." column_name{s}',
            f"qualifier{s} ::= table_name{s}{or_alias}",
            _scoped(s),
        ]
    lines += [
        "scalar_name ::= "
        + " | ".join(_case_pair(f) for f in _functions(SCALAR_FUNCTIONS, table_aliases)),
        "aggregate_name ::= "
        + " | ".join(_case_pair(f) for f in _functions(AGGREGATE_FUNCTIONS, table_aliases)),
        "cast_type ::= " + " | ".join(_case_pair(t) for t in CAST_TYPES),
    ]
    lines += [f"K_{k} ::= {_case_pair(k)}" for k in KEYWORDS]
    return "\n".join(lines) + "\n"
