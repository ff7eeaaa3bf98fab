"""ToolSpec: every accepted tool form normalizes to one schema dialect; bad input is typed."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from langchain_core.tools import tool
from pydantic import BaseModel, Field

from pask_agent.errors import ConfigError, SchemaError
from pask_agent.grammars.tool_spec import ToolSpec, load_tool_specs, tool_specs

CLOSED = {"additionalProperties": False}


class Location(BaseModel):
    lat: float
    lon: float


class FindPlaces(BaseModel):
    """Find places near a location."""

    where: Location = Field(description="Centre of the search.")
    kinds: list[Literal["cafe", "bar"]]
    pair: tuple[int, int]
    limit: int | None = None
    weights: dict[str, int] = {}


def get_weather(city: str, unit: Literal["c", "f"] = "c") -> str:
    """Get the weather for a city.

    Args:
        city: The city name.
        unit: Temperature unit.
    """
    return city + unit


BFCL_DOC = {
    "name": "geo.distance",
    "description": "Distance between two points.",
    "parameters": {
        "type": "dict",
        "properties": {
            "a": {"type": "tuple", "items": {"type": "float"}, "description": "First point."},
            "scale": {"type": "float", "description": "Scale.", "optional": True},
            "extra": {"type": "any", "description": "Anything."},
            "meta": {"type": "dict", "description": "Free-form options."},
        },
        "required": ["a"],
        "optional": [],
    },
}


def test_pydantic_model_is_inlined_closed_and_typed() -> None:
    spec = ToolSpec.from_any(FindPlaces)
    assert spec.name == "FindPlaces"
    assert spec.description == "Find places near a location."
    props = spec.parameters["properties"]
    assert props["where"] == {
        "type": "object",
        "description": "Centre of the search.",
        "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
        "required": ["lat", "lon"],
        **CLOSED,
    }
    assert props["kinds"] == {"type": "array", "items": {"type": "string", "enum": ["cafe", "bar"]}}
    assert props["pair"]["prefixItems"] == [{"type": "integer"}, {"type": "integer"}]
    assert props["limit"]["anyOf"] == [{"type": "integer"}, {"type": "null"}]
    assert props["weights"]["additionalProperties"] == {"type": "integer"}
    assert spec.parameters["required"] == ["where", "kinds", "pair"]
    assert spec.parameters["additionalProperties"] is False


def test_typed_function_takes_descriptions_from_its_docstring() -> None:
    spec = ToolSpec.from_any(get_weather)
    assert (spec.name, spec.description) == ("get_weather", "Get the weather for a city.")
    assert spec.parameters["properties"]["city"] == {
        "type": "string",
        "description": "The city name.",
    }
    unit = spec.parameters["properties"]["unit"]
    assert unit["enum"] == ["c", "f"] and unit["description"] == "Temperature unit."
    assert spec.parameters["required"] == ["city"]


def test_langchain_tool() -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    spec = ToolSpec.from_any(add)
    assert spec.name == "add" and spec.description == "Add two numbers."
    assert spec.parameters["properties"] == {"a": {"type": "integer"}, "b": {"type": "integer"}}


def test_bfcl_doc_types_are_translated() -> None:
    spec = ToolSpec.from_any(BFCL_DOC)
    props = spec.parameters["properties"]
    assert spec.parameters["type"] == "object"
    assert props["a"] == {
        "type": "array",
        "description": "First point.",
        "items": {"type": "number"},
    }
    assert props["scale"] == {"type": "number", "description": "Scale."}  # BFCL "optional" dropped
    assert props["extra"] == {"description": "Anything."}  # any JSON value
    assert props["meta"] == {"type": "object", "description": "Free-form options."}  # any object
    assert "optional" not in spec.parameters


def test_openai_dict_json_schema_and_roundtrip_agree() -> None:
    schema = {
        "title": "lookup",
        "description": "Look a word up.",
        "type": "object",
        "properties": {"word": {"type": "string"}},
        "required": ["word"],
    }
    from_schema = ToolSpec.from_any(schema)
    assert from_schema.name == "lookup" and from_schema.description == "Look a word up."
    openai = from_schema.to_openai()
    assert openai["type"] == "function" and openai["function"]["name"] == "lookup"
    assert ToolSpec.from_any(openai) == from_schema
    assert ToolSpec.from_any(openai["function"]) == from_schema
    assert ToolSpec.from_any(from_schema) is from_schema


def test_tool_without_parameters_takes_an_empty_object() -> None:
    spec = ToolSpec.from_any({"name": "ping", "description": "Ping."})
    assert spec.parameters == {"type": "object", "properties": {}, "required": [], **CLOSED}


def test_refs_inside_defs_are_inlined() -> None:
    schema = {
        "name": "f",
        "parameters": {
            "type": "object",
            "$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}}},
            "properties": {"p": {"$ref": "#/$defs/P", "description": "A point."}},
        },
    }
    p = ToolSpec.from_any(schema).parameters["properties"]["p"]
    assert p == {
        "type": "object",
        "description": "A point.",
        "properties": {"x": {"type": "integer"}},
        "required": [],
        **CLOSED,
    }


@pytest.mark.parametrize(
    ("parameters", "path", "fragment"),
    [
        (
            {"type": "object", "properties": {"x": {"type": "string", "pattern": "a+"}}},
            "$.parameters.properties.x.pattern",
            "pattern",
        ),
        (
            {"type": "object", "properties": {"x": {"type": "str"}}},
            "$.parameters.properties.x.type",
            "unknown type",
        ),
        (
            {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["y"]},
            "$.parameters.required[0]",
            "'y'",
        ),
        ({"type": "array", "items": {"type": "string"}}, "$.parameters", "object schema"),
        (
            {"type": "object", "properties": {"x": {"type": "integer", "enum": ["1"]}}},
            "$.parameters.properties.x.enum[0]",
            "declared type",
        ),
        (
            {"type": "object", "properties": {"x": {"enum": []}}},
            "$.parameters.properties.x.enum",
            "non-empty",
        ),
        (
            {"type": "object", "properties": {"x": {"type": "array", "uniqueItems": True}}},
            "$.parameters.properties.x.uniqueItems",
            "uniqueItems",
        ),
        (
            {
                "type": "object",
                "$defs": {"N": {"type": "object", "properties": {"n": {"$ref": "#/$defs/N"}}}},
                "properties": {"root": {"$ref": "#/$defs/N"}},
            },
            "$.parameters.properties.root.properties.n.$ref",
            "recursive",
        ),
        (
            {"type": "object", "properties": {"x": {"allOf": [{"type": "integer"}, {}]}}},
            "$.parameters.properties.x.allOf",
            "allOf",
        ),
        ({"type": "object", "properties": {"x": 5}}, "$.parameters.properties.x", "JSON object"),
    ],
)
def test_unsupported_schemas_name_the_path(parameters: dict, path: str, fragment: str) -> None:
    with pytest.raises(SchemaError) as info:
        ToolSpec.from_any({"name": "f", "parameters": parameters})
    assert info.value.path == path
    assert fragment in info.value.reason


def test_unrecognized_objects_are_schema_errors() -> None:
    with pytest.raises(SchemaError, match="cannot make a tool"):
        ToolSpec.from_any(42)
    with pytest.raises(SchemaError, match="unrecognized tool dict"):
        ToolSpec.from_any({"hello": "world"})
    with pytest.raises(SchemaError, match="non-empty string name") as info:
        ToolSpec.from_any({"type": "function", "function": {"name": "", "parameters": {}}})
    assert info.value.path == "$.function.name"


def test_tool_list_validation() -> None:
    with pytest.raises(SchemaError, match="empty"):
        tool_specs([])
    with pytest.raises(SchemaError, match="list of tools"):
        tool_specs(BFCL_DOC)  # a dict, not a list
    with pytest.raises(SchemaError, match="duplicate tool name 'geo.distance'") as info:
        tool_specs([BFCL_DOC, BFCL_DOC])
    assert info.value.path == "$[1].name"
    bad = {"name": "g", "parameters": {"type": "object", "properties": {"x": {"not": {}}}}}
    with pytest.raises(SchemaError) as info:
        tool_specs([BFCL_DOC, bad])
    assert info.value.path == "$[1].parameters.properties.x.not"
    assert [s.name for s in tool_specs([BFCL_DOC, get_weather])] == ["geo.distance", "get_weather"]


def test_load_tool_specs(tmp_path) -> None:
    good = tmp_path / "tools.json"
    good.write_text(json.dumps([BFCL_DOC, ToolSpec.from_any(get_weather).to_openai()]))
    assert [s.name for s in load_tool_specs(good)] == ["geo.distance", "get_weather"]
    with pytest.raises(ConfigError, match="cannot read"):
        load_tool_specs(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text("[{")
    with pytest.raises(ConfigError, match="not JSON"):
        load_tool_specs(broken)
