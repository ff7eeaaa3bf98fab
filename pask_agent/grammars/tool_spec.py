"""One value for a tool, whatever it was written as (paper §3.6, App. A.3; issue 3 item 1).

``ToolSpec.from_any`` accepts a Pydantic model class, a typed Python function (its docstring
gives the descriptions), a JSON Schema dict with a ``title``/``name``, an OpenAI tool dict, a BFCL
function doc, a LangChain tool, or a ``ToolSpec``. The parameters are normalized once
(``json/schema.normalize_parameters``) so that the grammar, the prompt and the span labeller all
see the same schema.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pask_agent.errors import ConfigError, SchemaError
from pask_agent.grammars.json.schema import normalize_parameters


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A callable tool: name, description and a normalized JSON Schema for its arguments.

    ``parameters`` is always ``{"type": "object", "properties": {...}, "required": [...],
    "additionalProperties": False}`` in the normalized dialect; treat it as read-only.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]

    @classmethod
    def from_any(cls, obj: Any) -> ToolSpec:
        """Build a spec from any supported tool form.

        Raises
        ------
        SchemaError
            The object is not a recognized tool form, has no usable name, or its schema uses a
            construct the grammar cannot enforce (``err.path`` points at it).
        """
        if isinstance(obj, ToolSpec):
            return obj
        if isinstance(obj, Mapping):
            return _from_mapping(obj)
        if _is_langchain_tool(obj) or _is_pydantic_model(obj) or inspect.isfunction(obj):
            return _from_mapping(_convert_with_langchain(obj))
        raise SchemaError(
            f"cannot make a tool from {type(obj).__name__}: pass a Pydantic model class, a typed "
            "function, a JSON Schema dict, an OpenAI tool dict, a BFCL function doc or a "
            "LangChain tool"
        )

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI tool dict that chat templates take as ``tools=[...]``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


def tool_specs(tools: Sequence[Any]) -> tuple[ToolSpec, ...]:
    """Convert and validate a tool list: at least one tool, names unique.

    Raises
    ------
    SchemaError
        Empty list, duplicate names, or a tool that ``ToolSpec.from_any`` rejects (the path is
        prefixed with the tool's index, ``$[2].parameters…``).
    """
    if isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Sequence):
        raise SchemaError(f"tools must be a list of tools, got {type(tools).__name__}")
    if not tools:
        raise SchemaError("the tool list is empty; give at least one tool")
    specs = []
    for i, tool in enumerate(tools):
        try:
            specs.append(ToolSpec.from_any(tool))
        except SchemaError as exc:
            raise SchemaError(exc.reason, path=f"$[{i}]" + exc.path[1:]) from exc
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise SchemaError(
                f"duplicate tool name {spec.name!r} (also tool {seen[spec.name]}); names must "
                "be unique because the model selects a tool by name",
                path=f"$[{i}].name",
            )
        seen[spec.name] = i
    return tuple(specs)


def _from_mapping(obj: Mapping[str, Any]) -> ToolSpec:
    if obj.get("type") == "function" and isinstance(obj.get("function"), Mapping):
        fn, prefix = obj["function"], "$.function"  # OpenAI tool dict
    elif "parameters" in obj or ("name" in obj and "properties" not in obj):
        fn, prefix = obj, "$"  # OpenAI function dict or BFCL function doc
    elif "properties" in obj or obj.get("type") in ("object", "dict"):
        # A bare JSON Schema: its title names the tool, its description describes it.
        name = obj.get("title") or obj.get("name")
        schema = {k: v for k, v in obj.items() if k not in ("title", "name", "description")}
        fn = {"name": name, "description": obj.get("description", ""), "parameters": schema}
        prefix = "$"
    else:
        raise SchemaError(
            "unrecognized tool dict: expected an OpenAI tool ({'type': 'function', 'function': "
            "{...}}), a function doc with name/parameters, or a JSON Schema with a title"
        )
    name = fn.get("name")
    if not isinstance(name, str) or not name.strip():
        raise SchemaError("a tool needs a non-empty string name", path=f"{prefix}.name")
    if any(ord(ch) < 0x20 for ch in name):
        raise SchemaError("a tool name must not contain control characters", path=f"{prefix}.name")
    description = fn.get("description") or ""
    if not isinstance(description, str):
        raise SchemaError("description must be a string", path=f"{prefix}.description")
    parameters = normalize_parameters(fn.get("parameters"), path=f"{prefix}.parameters")
    return ToolSpec(name=name, description=description, parameters=parameters)


def _is_pydantic_model(obj: Any) -> bool:
    try:
        from pydantic import BaseModel
    except ImportError:  # pragma: no cover - pydantic is a dependency
        return False
    return inspect.isclass(obj) and issubclass(obj, BaseModel)


def _is_langchain_tool(obj: Any) -> bool:
    try:
        from langchain_core.tools import BaseTool
    except ImportError:  # pragma: no cover - langchain-core is a dependency
        return False
    return isinstance(obj, BaseTool)


def _convert_with_langchain(obj: Any) -> Mapping[str, Any]:
    # langchain-core already turns signatures + Google-style docstrings and Pydantic models into
    # OpenAI tool dicts (refs inlined, titles dropped); we normalize what it returns.
    from langchain_core.utils.function_calling import convert_to_openai_tool

    try:
        return convert_to_openai_tool(obj)
    except (TypeError, ValueError, KeyError) as exc:
        name = getattr(obj, "__name__", type(obj).__name__)
        raise SchemaError(f"cannot derive a JSON Schema from {name}: {exc}") from exc


def load_tool_specs(path: str | Path) -> tuple[ToolSpec, ...]:
    """Read a JSON file holding a list of tools in any form ``ToolSpec`` accepts (CLI ``--tools``).

    Raises
    ------
    ConfigError
        The file is missing or is not JSON.
    SchemaError
        The content is not a valid tool list (see ``tool_specs``).
    """
    file = Path(path)
    try:
        payload = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read tools file {file}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"tools file {file} is not JSON (line {exc.lineno}): {exc.msg}") from exc
    if isinstance(payload, Mapping):
        payload = [payload]  # one tool on its own is a list of one
    return tool_specs(payload)
