"""Normalized JSON Schema → xgrammar EBNF rules, in one fixed compact JSON layout.

We write the EBNF ourselves instead of asking xgrammar for a JSON-Schema grammar because the
tool-call format needs control that its converter does not offer: an object without properties
must mean "any object" (strict mode allows only ``{}``), number literals need a digit bound (an
unbounded grammar let a compressed cache emit ``2000000000000…`` forever), and the layout must be
exactly Python's ``json.dumps`` default (``", "`` and ``": "``, no other whitespace) so that one
output has one spelling and ground truth renders the same way.

Layout and bounds (``JsonLayout``):
* objects ``{"a": 1, "b": 2}``, arrays ``[1, 2]``, keys in the schema's property order;
* integers at most ``max_int_digits`` digits; numbers add at most ``max_frac_digits`` fraction
  digits and an exponent of at most 3 digits;
* strings are JSON strings without raw control characters; enum and const values are spelled as
  ``json.dumps(value, ensure_ascii=False)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pask_agent.errors import SchemaError
from pask_agent.grammars.json.layout import JsonLayout, json_literal


def ebnf_literal(text: str) -> str:
    """Quote ``text`` as an EBNF string literal (xgrammar syntax)."""
    out = []
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


class EbnfBuilder:
    """Accumulates named rules; identical bodies share one rule.

    ``prefix`` keeps rule names of several builders apart; the generic JSON rules
    (``{prefix}json_value`` …) are emitted once, on first use.
    """

    def __init__(self, prefix: str = "", layout: JsonLayout | None = None) -> None:
        self.prefix = prefix
        self.layout = layout or JsonLayout()
        self._rules: dict[str, str] = {}
        self._by_body: dict[str, str] = {}
        self._count = 0

    # -- bookkeeping -------------------------------------------------------------------------
    def rule(self, body: str, hint: str = "r") -> str:
        """Name for a rule with ``body``; reuses an existing rule with the same body."""
        if body in self._by_body:
            return self._by_body[body]
        name = f"{self.prefix}{hint}_{self._count}"
        self._count += 1
        self._rules[name] = body
        self._by_body[body] = name
        return name

    def named(self, name: str, body: str) -> str:
        """Define a rule with a fixed name (used for roots and the generic JSON rules)."""
        full = f"{self.prefix}{name}"
        if full not in self._rules:
            self._rules[full] = body
        return full

    def text(self) -> str:
        return "\n".join(f"{name} ::= {body}" for name, body in self._rules.items()) + "\n"

    # -- primitives --------------------------------------------------------------------------
    def string(self, min_len: int = 0, max_len: int | None = None) -> str:
        char = self.named(
            "json_char",
            '[^"\\\\\\x00-\\x1f] | "\\\\" ["\\\\/bfnrt] | "\\\\u" [0-9a-fA-F]{4}',
        )
        if min_len == 0 and max_len is None:
            return self.named("json_string", f'"\\"" {char}* "\\""')
        reps = f"{{{min_len},}}" if max_len is None else f"{{{min_len},{max_len}}}"
        return self.rule(f'"\\"" {char}{reps} "\\""', "str")

    def integer(self) -> str:
        n = self.layout.max_int_digits - 1
        return self.named("json_int", f'"-"? ("0" | [1-9] [0-9]{{0,{n}}})')

    def number(self) -> str:
        integer = self.integer()
        frac = self.layout.max_frac_digits
        return self.named(
            "json_number", f'{integer} ("." [0-9]{{1,{frac}}})? ([eE] [+\\-]? [0-9]{{1,3}})?'
        )

    def boolean(self) -> str:
        return self.named("json_bool", '"true" | "false"')

    def null(self) -> str:
        return self.named("json_null", '"null"')

    def any_value(self) -> str:
        """Any JSON value in the compact layout (recursive rules)."""
        value = f"{self.prefix}json_value"
        if value in self._rules:
            return value
        self._rules[value] = ""  # reserve the name before building the recursive parts
        obj = self.any_object()
        arr = self.named("json_array", f'"[" ({value} (", " {value})*)? "]"')
        parts = [obj, arr, self.string(), self.number(), self.boolean(), self.null()]
        self._rules[value] = " | ".join(parts)
        return value

    def any_object(self, value_rule: str | None = None) -> str:
        """Any JSON object; with ``value_rule`` a map whose values follow that rule."""
        key = self.string()
        if value_rule is None:
            value_rule = f"{self.prefix}json_value"
            self.any_value()
            member = self.named("json_member", f'{key} ": " {value_rule}')
            return self.named("json_object", f'"{{" ({member} (", " {member})*)? "}}"')
        member = self.rule(f'{key} ": " {value_rule}', "member")
        return self.rule(f'"{{" ({member} (", " {member})*)? "}}"', "map")

    # -- schemas -----------------------------------------------------------------------------
    def schema(self, node: Mapping[str, Any], path: str = "$") -> str:
        """Rule name for a normalized schema node (see ``schema.normalize_schema``)."""
        if "const" in node:
            return self.rule(ebnf_literal(json_literal(node["const"])), "const")
        if "enum" in node:
            body = " | ".join(ebnf_literal(json_literal(v)) for v in node["enum"])
            return self.rule(body, "enum")
        if "anyOf" in node:
            branches = [self.schema(b, f"{path}.anyOf[{i}]") for i, b in enumerate(node["anyOf"])]
            return self.rule(" | ".join(branches), "any_of")
        type_ = node.get("type")
        if type_ is None:
            return self.any_value()
        if type_ == "string":
            return self.string(node.get("minLength", 0), node.get("maxLength"))
        if type_ == "integer":
            return self.integer()
        if type_ == "number":
            return self.number()
        if type_ == "boolean":
            return self.boolean()
        if type_ == "null":
            return self.null()
        if type_ == "array":
            return self._array(node, path)
        if type_ == "object":
            return self._object(node, path)
        raise SchemaError(f"type {type_!r} reached the grammar builder unnormalized", path=path)

    def _array(self, node: Mapping[str, Any], path: str) -> str:
        prefix = [
            self.schema(p, f"{path}.prefixItems[{i}]")
            for i, p in enumerate(node.get("prefixItems", ()))
        ]
        items = node.get("items")
        lo, hi = node.get("minItems", 0), node.get("maxItems")
        if prefix:
            # Tuples (Pydantic `tuple[...]`): the prefix is always written in full.
            if items is False or (hi is not None and hi <= len(prefix)):
                rest = ""
            else:
                item = self.schema(items, f"{path}.items") if items else self.any_value()
                more = "*" if hi is None else f"{{0,{hi - len(prefix)}}}"
                rest = f' (", " {item}){more}'
            return self.rule('"[" ' + ' ", " '.join(prefix) + rest + ' "]"', "tuple")
        item = self.schema(items, f"{path}.items") if isinstance(items, Mapping) else None
        if item is None:
            if items is False:
                return self.rule('"[" "]"', "empty_array")
            item = self.any_value()
        if hi == 0:
            return self.rule('"[" "]"', "empty_array")
        tail_hi = "" if hi is None else str(hi - 1)
        tail = f'(", " {item}){{{max(lo - 1, 0)},{tail_hi}}}'
        body = f"{item} {tail}"
        if lo == 0:
            body = f"({body})?"
        return self.rule(f'"[" {body} "]"', "array")

    def _object(self, node: Mapping[str, Any], path: str) -> str:
        props = node.get("properties")
        if props is None:
            extra = node.get("additionalProperties")
            value = self.schema(extra, f"{path}.additionalProperties") if extra else None
            return self.any_object(value)
        required = set(node.get("required", ()))
        entries = [
            (
                self.rule(
                    ebnf_literal(json_literal(name) + ": ")
                    + " "
                    + self.schema(sub, f"{path}.properties.{name}"),
                    "prop",
                ),
                name in required,
            )
            for name, sub in props.items()
        ]
        # first[i]: members from i on when none was written yet; rest[i]: after one was.
        first, rest = '""', '""'
        for member, is_required in reversed(entries):
            new_rest = self.rule(f'", " {member} {rest}', "rest")
            new_first = self.rule(f"{member} {rest}", "first")
            if not is_required:
                new_rest = self.rule(f"{new_rest} | {rest}", "rest")
                new_first = self.rule(f"{new_first} | {first}", "first")
            first, rest = new_first, new_rest
        return self.rule(f'"{{" {first} "}}"', "object")
