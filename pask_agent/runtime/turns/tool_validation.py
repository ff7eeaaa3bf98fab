"""Every tool call is checked with ``jsonschema`` against its tool's schema before it is returned.

Why, when a grammar already bound the answer: the grammar enforces the call's shape, names and
types, but a schema says more than a grammar can (numeric bounds such as ``minimum``,
``maximum`` and ``multipleOf`` are kept as annotations, ``grammars/json/schema.py``), and a
grammar bug would otherwise reach the caller's tool as a silently wrong call. ``jsonschema`` is
an independent referee: a call it rejects raises :class:`~pask_agent.errors.ToolCallError`
naming the tool, the argument's JSON path and the rule it broke.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema

from pask_agent.errors import ToolCallError
from pask_agent.grammars.tool_spec import ToolSpec
from pask_agent.runtime.turns.results import ToolCall


def validate_tool_call(name: str, arguments: Any, tools: Sequence[ToolSpec]) -> None:
    """Check one call: ``name`` is one of ``tools`` and ``arguments`` validate against its
    (normalized) parameter schema.

    Raises
    ------
    ToolCallError
        Unknown tool, arguments that are not an object, or a schema violation (the first one
        ``jsonschema`` ranks most relevant; ``err.path`` is its JSON path).
    """
    specs = {t.name: t for t in tools}
    if name not in specs:
        raise ToolCallError(
            f"the model called {name!r}, which is not one of the given tools "
            f"({', '.join(specs) or 'none'}); the call was not returned",
            tool=name,
        )
    if not isinstance(arguments, Mapping):
        raise ToolCallError(
            f"arguments of {name!r} must be a JSON object, got {type(arguments).__name__}",
            tool=name,
        )
    schema = specs[name].parameters
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(dict(arguments)))
    if error is not None:
        path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.path)
        raise ToolCallError(
            f"the call to {name!r} breaks its schema at {path}: {error.message}; the call was "
            "not returned (the grammar cannot enforce every schema rule, e.g. numeric bounds)",
            tool=name,
            path=path,
        )


def checked_tool_calls(
    calls: Sequence[ToolCall], tools: Sequence[ToolSpec]
) -> tuple[ToolCall, ...]:
    """``calls`` unchanged when every one validates (see :func:`validate_tool_call`)."""
    for call in calls:
        validate_tool_call(call.name, call.arguments, tools)
    return tuple(calls)
