"""Output specs the runtime decodes against, compiled once per runtime, and their parsers.

* tools → the tool-call grammar + the function-calling tagger (``grammars/``);
* a JSON Schema (or a Pydantic model's schema) → a bounded JSON grammar for that schema;
* free text → no grammar (special tokens are masked by the engine).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from pask_agent.grammars.compiler import make_compiler
from pask_agent.grammars.json.ebnf import EbnfBuilder
from pask_agent.grammars.json.schema import normalize_schema
from pask_agent.grammars.json.tagger import FunctionCallTagger
from pask_agent.grammars.json.tool_grammar import compile_tool_grammar
from pask_agent.grammars.tool_spec import ToolSpec, tool_specs
from pask_agent.runtime.turns.constraint import OutputSpec
from pask_agent.runtime.turns.mixed_output import split_output
from pask_agent.runtime.turns.results import ToolCall

TEXT = OutputSpec("text", None)


class OutputCompiler:
    """Builds and caches ``OutputSpec`` values for one tokenizer (owned by a Runtime)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.compiler = make_compiler(tokenizer, vocab_size)
        self._cache: dict[str, OutputSpec] = {}

    def tools(
        self, tools: Sequence[Any], *, tool_choice: str = "auto", parallel: bool = True
    ) -> OutputSpec:
        specs = tool_specs(tools)
        if tool_choice == "none":
            return TEXT
        key = json.dumps(
            ["tools", [s.to_openai() for s in specs], tool_choice, parallel],
            sort_keys=True,
            default=str,
        )
        if key not in self._cache:
            grammar = compile_tool_grammar(
                self.compiler, specs, tool_choice=tool_choice, parallel=parallel
            )
            tagger = FunctionCallTagger.from_grammar(grammar)
            self._cache[key] = OutputSpec("tools", grammar.compiled, tagger.fresh, specs)
        return self._cache[key]

    def json_schema(self, schema: dict[str, Any]) -> OutputSpec:
        key = json.dumps(["json", schema], sort_keys=True, default=str)
        if key not in self._cache:
            normalized = normalize_schema(schema)
            builder = EbnfBuilder()
            body = builder.schema(normalized, "$")
            builder.named("root", body)
            compiled = self.compiler.compile_grammar(builder.text(), root_rule_name="root")
            tagger = FunctionCallTagger.for_schema(normalized)
            self._cache[key] = OutputSpec("json", compiled, tagger.fresh, normalized)
        return self._cache[key]

    def ebnf(
        self, kind: str, ebnf: str, *, new_tagger: Any = None, payload: Any = None
    ) -> OutputSpec:
        key = json.dumps([kind, ebnf])
        if key not in self._cache:
            compiled = self.compiler.compile_grammar(ebnf, root_rule_name="root")
            self._cache[key] = OutputSpec(kind, compiled, new_tagger, payload)
        return self._cache[key]


def parse_tool_calls(text: str, tools: Sequence[ToolSpec]) -> tuple[ToolCall, ...]:
    """Tool calls in a grammar-bound answer, alone or after its text (``mixed_output.py``);
    free text, or a call cut before it closed, gives none."""
    _, calls_text = split_output(text)
    if calls_text is None:
        return ()
    try:
        value = json.loads(calls_text)
    except json.JSONDecodeError:
        return ()
    items = value if isinstance(value, list) else [value]
    names = {t.name for t in tools}
    calls = []
    for item in items:
        if isinstance(item, dict) and item.get("name") in names:
            calls.append(
                ToolCall(
                    f"call_{uuid.uuid4().hex[:24]}", item["name"], dict(item.get("arguments") or {})
                )
            )
    return tuple(calls)


def schema_prompt(schema: dict[str, Any]) -> str:
    """A field list a small model follows better than a raw JSON Schema dump."""
    normalized = normalize_schema(schema)
    lines = ["Extract the answer as one JSON object with exactly these fields:"]
    _describe(normalized, lines, indent="")
    lines.append("Use null for an optional field the text does not give. Reply with JSON only.")
    return "\n".join(lines)


def _type_name(node: dict[str, Any]) -> str:
    if "enum" in node:
        return "one of " + ", ".join(json.dumps(v) for v in node["enum"])
    if "anyOf" in node:
        return " or ".join(_type_name(n) for n in node["anyOf"])
    kind = node.get("type", "any JSON value")
    if kind == "array":
        # ``items`` may be ``False`` (a closed tuple) or absent (any items).
        items = node.get("items", {})
        rest = _type_name(items) if isinstance(items, dict) else None
        head = ", ".join(_type_name(p) for p in node.get("prefixItems", ()))
        if head:
            return f"list of [{head}]" + (f" then {rest}" if rest else "")
        return f"list of {rest}" if rest else "empty list"
    return str(kind)


def _describe(node: dict[str, Any], lines: list[str], indent: str) -> None:
    required = set(node.get("required", []))
    for name, prop in node.get("properties", {}).items():
        need = "required" if name in required else "optional"
        desc = f" - {prop['description']}" if prop.get("description") else ""
        if prop.get("type") == "object" and prop.get("properties"):
            lines.append(f"{indent}- {name}: object ({need}){desc}, with fields:")
            _describe(prop, lines, indent + "  ")
        else:
            lines.append(f"{indent}- {name}: {_type_name(prop)} ({need}){desc}")
