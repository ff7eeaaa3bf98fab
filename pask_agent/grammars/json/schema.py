"""Normalize a tool's JSON Schema into the subset the tool-call grammar enforces exactly.

Tool specs arrive from Pydantic, Python signatures, OpenAI dicts and BFCL function docs. They all
become one normalized dialect here, so the grammar builder (``json/ebnf.py``), the prompt renderer
and the span labeller see a single shape:

* BFCL spellings become JSON Schema: ``dict`` → ``object``, ``float`` → ``number``,
  ``tuple`` → ``array``, ``any`` → ``{}`` (any JSON value). BFCL's non-standard ``optional`` key
  is dropped (``required`` already says it).
* ``$ref`` into ``$defs``/``definitions`` is inlined; a recursive reference is rejected.
* An object with properties is closed: ``additionalProperties`` becomes ``false`` and every entry
  of ``required`` must name a property. An object without properties means "any JSON object"
  (xgrammar's strict mode would instead allow only ``{}``), or a map when
  ``additionalProperties`` is a schema.
* ``type: [a, b]`` and ``oneOf`` become ``anyOf`` (the grammar cannot enforce "exactly one").
* Keys come out in one canonical order (``type`` and ``description`` first), titles are dropped.

Annotations that the grammar does not enforce are kept so that the prompt still shows them:
``description``, ``default``, ``examples``, ``format`` and the numeric bounds ``minimum``,
``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``, ``multipleOf``. Constraints that would
change which strings are valid and that the grammar cannot express (``pattern``, ``not``,
``if``/``then``/``else``, ``patternProperties``, ``uniqueItems: true``, …) raise ``SchemaError``
with the JSON path of the offending keyword, so a schema is never silently loosened beyond these
documented numeric bounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pask_agent.errors import SchemaError

_BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array"}
# Objects/arrays inside each other. The normalizer, the EBNF builder, the tagger and jsonschema
# each recurse once per level; 40 levels work end to end, 300 overflowed Python's stack in
# jsonschema, so answers deeper than this are refused up front with a SchemaError.
MAX_NESTING = 64
_JSON_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
_ANNOTATIONS = (
    "description",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "default",
    "examples",
)
_DROPPED = frozenset(
    {"title", "$schema", "$id", "$comment", "optional", "deprecated", "readOnly", "writeOnly"}
)
_STRUCTURAL = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
        "$defs",
        "definitions",
        "uniqueItems",
    }
)
# Output key order: what a reader (and the model) should see first comes first.
_KEY_ORDER = (
    "type",
    "description",
    "enum",
    "const",
    "anyOf",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
) + _ANNOTATIONS[1:]


def normalize_parameters(schema: Any, *, path: str = "$") -> dict[str, Any]:
    """Normalize a tool's ``parameters`` schema; the result is always a closed object schema.

    ``None`` or ``{}`` (a tool without arguments) becomes an object with no properties that
    accepts only ``{}``.

    Raises
    ------
    SchemaError
        The schema is not an object schema, or uses a construct the grammar cannot enforce;
        ``err.path`` is the JSON path of the problem.
    """
    if schema is None or (isinstance(schema, Mapping) and not schema):
        return {"type": "object", "properties": {}, "required": [], "additionalProperties": False}
    if not isinstance(schema, Mapping):
        raise SchemaError(f"parameters must be a JSON object schema, got {schema!r}", path=path)
    node = normalize_schema(schema, path=path)
    if node.get("type") != "object":
        raise SchemaError(
            f"tool parameters must be an object schema (type 'object' or BFCL 'dict'), "
            f"got {node.get('type', 'an untyped schema')!r}",
            path=path,
        )
    if "properties" not in node:
        # A tool whose arguments are an open object: make it explicit and closed.
        if "additionalProperties" in node:
            raise SchemaError(
                "tool parameters need named properties, not a map of arbitrary keys", path=path
            )
        node = {**node, "properties": {}, "required": [], "additionalProperties": False}
    return _ordered(node)


def normalize_schema(schema: Mapping[str, Any], *, path: str = "$") -> dict[str, Any]:
    """Normalize one JSON Schema node (see the module docstring for the rules).

    Raises
    ------
    SchemaError
        As for :func:`normalize_parameters`, and when objects and arrays nest more than
        ``MAX_NESTING`` levels deep.
    """
    defs: dict[str, Any] = {}
    for key in ("$defs", "definitions"):
        if isinstance(schema.get(key), Mapping):
            defs.update({f"#/{key}/{name}": sub for name, sub in schema[key].items()})
    try:
        node = _normalize(schema, path, defs, ())
        depth = _nesting(node)
    except RecursionError as exc:
        # deeper than Python's stack: far past the limit
        raise SchemaError(_too_deep("hundreds of"), path=path) from exc
    if depth > MAX_NESTING:
        raise SchemaError(_too_deep(str(depth)), path=path)
    return node


def _too_deep(levels: str) -> str:
    return (
        f"objects and arrays nest {levels} levels deep, more than the limit of {MAX_NESTING}; "
        "flatten the schema (e.g. pass nested parts as separate arguments)"
    )


def _nesting(node: Any) -> int:
    """How many objects/arrays an answer nests at most (``anyOf`` branches add no level)."""
    if not isinstance(node, Mapping):
        return 0
    children = [*node.get("properties", {}).values(), *node.get("prefixItems", [])]
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), Mapping):
            children.append(node[key])
    inner = max((_nesting(c) for c in children), default=0)
    level = 1 if children or node.get("type") in ("object", "array") else 0
    return max(level + inner, *(_nesting(b) for b in node.get("anyOf", [])), 0)


def _normalize(
    node: Any, path: str, defs: Mapping[str, Any], active_refs: tuple[str, ...]
) -> dict[str, Any]:
    if node is True:
        return {}
    if not isinstance(node, Mapping):
        raise SchemaError(f"a schema must be a JSON object, got {node!r}", path=path)
    if "$ref" in node:
        return _inline_ref(node, path, defs, active_refs)
    for key in node:
        if key not in _STRUCTURAL and key not in _DROPPED and key not in _ANNOTATIONS:
            raise SchemaError(
                f"unsupported JSON Schema keyword {key!r}: the tool-call grammar cannot enforce "
                "it; remove it or express the constraint with enum/type/required",
                path=f"{path}.{key}",
            )
    if node.get("uniqueItems") is True:
        raise SchemaError(
            "uniqueItems cannot be enforced by the grammar; drop it or use an enum",
            path=f"{path}.uniqueItems",
        )
    out: dict[str, Any] = {k: node[k] for k in _ANNOTATIONS if k in node}
    if "allOf" in node:
        return _merge_all_of(node, out, path, defs, active_refs)
    if "anyOf" in node or "oneOf" in node:
        key = "anyOf" if "anyOf" in node else "oneOf"
        branches = node[key]
        if not isinstance(branches, list) or not branches:
            raise SchemaError(f"{key} must be a non-empty list of schemas", path=f"{path}.{key}")
        out["anyOf"] = [
            _normalize(b, f"{path}.{key}[{i}]", defs, active_refs) for i, b in enumerate(branches)
        ]
        return _ordered(out)
    if "enum" in node or "const" in node:
        return _ordered({**out, **_literal_choices(node, path)})
    type_ = node.get("type")
    if isinstance(type_, list):
        if not type_:
            raise SchemaError("type list must not be empty", path=f"{path}.type")
        branches = [
            _normalize({**node, "type": t}, f"{path}.type[{i}]", defs, active_refs)
            for i, t in enumerate(type_)
        ]
        for branch in branches:
            for key in _ANNOTATIONS:
                branch.pop(key, None)
        return _ordered({**out, "anyOf": branches})
    if type_ is None:
        if any(k in node for k in ("properties", "required", "additionalProperties")):
            type_ = "object"
        elif any(k in node for k in ("items", "prefixItems")):
            type_ = "array"
        else:
            return _ordered(out)  # no type, no constraint: any JSON value
    if not isinstance(type_, str):
        raise SchemaError(f"type must be a string, got {type_!r}", path=f"{path}.type")
    if type_ == "any":
        return _ordered(out)
    type_ = _BFCL_TYPES.get(type_, type_)
    if type_ not in _JSON_TYPES:
        raise SchemaError(
            f"unknown type {type_!r}; use one of {', '.join(_JSON_TYPES)} "
            "(or BFCL's dict/float/tuple/any)",
            path=f"{path}.type",
        )
    out["type"] = type_
    if type_ == "object":
        out.update(_normalize_object(node, path, defs, active_refs))
    elif type_ == "array":
        out.update(_normalize_array(node, path, defs, active_refs))
    elif type_ == "string":
        out.update(_bounds(node, ("minLength", "maxLength"), path))
    return _ordered(out)


def _inline_ref(
    node: Mapping[str, Any], path: str, defs: Mapping[str, Any], active_refs: tuple[str, ...]
) -> dict[str, Any]:
    ref = node["$ref"]
    if ref in active_refs:
        raise SchemaError(
            f"recursive $ref {ref!r} cannot be inlined; bound the nesting depth explicitly",
            path=f"{path}.$ref",
        )
    if ref not in defs:
        raise SchemaError(f"$ref {ref!r} does not point into $defs/definitions", path=path)
    target = _normalize(defs[ref], path, defs, (*active_refs, ref))
    # Sibling keywords (a field's description next to its $ref) override the definition's.
    siblings = {k: v for k, v in node.items() if k != "$ref" and k not in _DROPPED}
    if siblings:
        extra = _normalize(siblings, path, defs, active_refs)
        target = {**target, **{k: extra[k] for k in _ANNOTATIONS if k in extra}}
    return _ordered(target)


def _merge_all_of(
    node: Mapping[str, Any],
    annotations: dict[str, Any],
    path: str,
    defs: Mapping[str, Any],
    active_refs: tuple[str, ...],
) -> dict[str, Any]:
    parts = node["allOf"]
    if not isinstance(parts, list) or len(parts) != 1:
        raise SchemaError(
            "allOf with more than one schema is not supported; merge the schemas by hand",
            path=f"{path}.allOf",
        )
    inner = _normalize(parts[0], f"{path}.allOf[0]", defs, active_refs)
    return _ordered({**inner, **annotations})


def _literal_choices(node: Mapping[str, Any], path: str) -> dict[str, Any]:
    values = [node["const"]] if "const" in node else node["enum"]
    key = "const" if "const" in node else "enum"
    if not isinstance(values, list) or not values:
        raise SchemaError("enum must be a non-empty list", path=f"{path}.{key}")
    type_ = node.get("type")
    type_ = _BFCL_TYPES.get(type_, type_) if isinstance(type_, str) else None
    for i, value in enumerate(values):
        if isinstance(value, dict | list):
            raise SchemaError(
                "enum values must be strings, numbers, booleans or null",
                path=f"{path}.{key}[{i}]",
            )
        if type_ is not None and type_ != "any" and not _matches_type(value, type_):
            raise SchemaError(
                f"enum value {value!r} is not of the declared type {type_!r}",
                path=f"{path}.{key}[{i}]",
            )
    # const is an enum of one: the grammar and the tagger then need a single literal path
    out: dict[str, Any] = {"enum": list(values)}
    if type_ is not None and type_ != "any":
        out["type"] = type_
    return out


def _matches_type(value: Any, type_: str) -> bool:
    if type_ == "string":
        return isinstance(value, str)
    if type_ == "boolean":
        return isinstance(value, bool)
    if type_ == "null":
        return value is None
    if type_ == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if type_ == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return False


def _normalize_object(
    node: Mapping[str, Any], path: str, defs: Mapping[str, Any], active_refs: tuple[str, ...]
) -> dict[str, Any]:
    props = node.get("properties")
    extra = node.get("additionalProperties")
    if props is None or (isinstance(props, Mapping) and not props and "required" not in node):
        # No named properties: an open object (BFCL's bare `dict`), or a typed map.
        if isinstance(extra, Mapping):
            return {
                "additionalProperties": _normalize(
                    extra, f"{path}.additionalProperties", defs, active_refs
                )
            }
        if props is not None and extra is False:
            return {"properties": {}, "required": [], "additionalProperties": False}
        return {}
    if not isinstance(props, Mapping):
        raise SchemaError("properties must be an object", path=f"{path}.properties")
    out_props = {}
    for name, sub in props.items():
        if not isinstance(name, str) or not name:
            raise SchemaError("property names must be non-empty strings", path=f"{path}.properties")
        out_props[name] = _normalize(sub, f"{path}.properties.{name}", defs, active_refs)
    required = node.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise SchemaError("required must be a list of property names", path=f"{path}.required")
    for i, name in enumerate(required):
        if name not in out_props:
            raise SchemaError(
                f"required names {name!r}, which is not among the properties {sorted(out_props)}",
                path=f"{path}.required[{i}]",
            )
    if len(set(required)) != len(required):
        raise SchemaError("required lists a property twice", path=f"{path}.required")
    return {"properties": out_props, "required": list(required), "additionalProperties": False}


def _normalize_array(
    node: Mapping[str, Any], path: str, defs: Mapping[str, Any], active_refs: tuple[str, ...]
) -> dict[str, Any]:
    out: dict[str, Any] = _bounds(node, ("minItems", "maxItems"), path)
    if "prefixItems" in node:
        prefix = node["prefixItems"]
        if not isinstance(prefix, list) or not prefix:
            raise SchemaError("prefixItems must be a non-empty list", path=f"{path}.prefixItems")
        out["prefixItems"] = [
            _normalize(p, f"{path}.prefixItems[{i}]", defs, active_refs)
            for i, p in enumerate(prefix)
        ]
    items = node.get("items")
    if isinstance(items, list):  # draft-4 tuple form
        raise SchemaError("use prefixItems instead of a list under items", path=f"{path}.items")
    if items is False:
        out["items"] = False
    elif items is not None:
        out["items"] = _normalize(items, f"{path}.items", defs, active_refs)
    return out


def _bounds(node: Mapping[str, Any], keys: tuple[str, str], path: str) -> dict[str, int]:
    out = {}
    for key in keys:
        if key in node:
            value = node[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise SchemaError(f"{key} must be a non-negative integer", path=f"{path}.{key}")
            out[key] = value
    lo, hi = out.get(keys[0], 0), out.get(keys[1])
    if hi is not None and hi < lo:
        raise SchemaError(f"{keys[1]} is smaller than {keys[0]}", path=f"{path}.{keys[1]}")
    return out


def _ordered(node: Mapping[str, Any]) -> dict[str, Any]:
    rank = {k: i for i, k in enumerate(_KEY_ORDER)}
    return {k: node[k] for k in sorted(node, key=lambda k: rank.get(k, len(rank)))}
