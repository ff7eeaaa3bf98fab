"""BFCL non-live cases from the installed ``bfcl_eval`` package, their ground truth as our output
text, and the official AST checker (paper §4.1, App. C.1).

Data files are ``bfcl_eval/data/BFCL_v4_<category>.json`` and
``bfcl_eval/data/possible_answer/BFCL_v4_<category>.json``, JSON Lines. Ground truth lists the
acceptable values per argument; ``""`` means "may be omitted".
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pask_agent.errors import ConfigError, GrammarRejectedError, ModelNotAvailableError
from pask_agent.grammars.tool_spec import ToolSpec, tool_specs

NON_LIVE_CATEGORIES: tuple[str, ...] = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
)
_INSTALL = "pip install --no-deps bfcl-eval==2026.3.23"
_MODEL_CONFIG = "bfcl_eval.constants.model_config"


@dataclass(frozen=True, slots=True)
class BfclCase:
    """One BFCL single-turn case. Nested dicts are the file's JSON; treat them as read-only.

    ``messages`` is the (only) turn's chat messages; ``functions`` are BFCL function docs;
    ``ground_truth`` is one ``{function_name: {argument: [acceptable values]}}`` per expected call.
    """

    id: str
    category: str
    messages: tuple[Mapping[str, Any], ...]
    functions: tuple[Mapping[str, Any], ...]
    ground_truth: tuple[Mapping[str, Mapping[str, list[Any]]], ...]

    @property
    def parallel(self) -> bool:
        """Whether the case expects (and the grammar should allow) several calls at once."""
        return self.category.startswith("parallel") or "_parallel" in self.category

    def tools(self) -> tuple[ToolSpec, ...]:
        return tool_specs(self.functions)

    def request(self) -> dict[str, Any]:
        """The chat request BFCL asks for: its messages and tools, a call required, parallel
        calls allowed only where the category expects them (``Runtime.chat(**case.request())``).
        """
        return {
            "messages": list(self.messages),
            "tools": self.tools(),
            "tool_choice": "required",
            "parallel_tool_calls": self.parallel,
        }


def bfcl_data_dir() -> Path:
    """The ``bfcl_eval/data`` folder of the installed package.

    Raises
    ------
    ModelNotAvailableError
        ``bfcl_eval`` is not installed (the message names the install command).
    """
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailableError(f"BFCL data needs the bfcl_eval package; run: {_INSTALL}")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def load_bfcl(category: str, *, limit: int | None = None) -> tuple[BfclCase, ...]:
    """Load one single-turn category (non-live or live) with its ground truth, in file order.

    Raises
    ------
    ConfigError
        Unknown category (the message lists the available ones).
    """
    data = bfcl_data_dir()
    questions = data / f"BFCL_v4_{category}.json"
    answers = data / "possible_answer" / f"BFCL_v4_{category}.json"
    if not questions.is_file() or not answers.is_file():
        known = sorted(
            p.name[len("BFCL_v4_") : -5] for p in (data / "possible_answer").glob("*.json")
        )
        raise ConfigError(f"unknown BFCL category {category!r}; available: {', '.join(known)}")
    truth = {row["id"]: row["ground_truth"] for row in _json_lines(answers)}
    cases = []
    for row in _json_lines(questions):
        if limit is not None and len(cases) >= limit:
            break
        turns = row["question"]
        if len(turns) != 1:
            raise ConfigError(f"{row['id']} has {len(turns)} turns; only single-turn is supported")
        cases.append(
            BfclCase(
                id=row["id"],
                category=category,
                messages=tuple(turns[0]),
                functions=tuple(row["function"]),
                ground_truth=tuple(truth[row["id"]]),
            )
        )
    return tuple(cases)


def ground_truth_calls(case: BfclCase) -> list[dict[str, Any]]:
    """The reference calls as ``{"name", "arguments"}`` dicts, one acceptable value per argument.

    Each argument takes its first acceptable value that is valid under the tool's schema (BFCL
    lists a few answers that contradict their own schema, e.g. a string for an array; when no
    alternative is valid the first one is kept, and the grammar will reject it). A first value
    of ``""`` means "may be omitted": an optional argument is then left out, a required one takes
    its first other value. Dict-valued answers hold a list of alternatives per key and are
    resolved the same way, recursively. Keys follow the schema's property order, as the grammar
    requires, and an integral float becomes an int where the schema says integer.

    Raises
    ------
    ConfigError
        A required argument has no usable value, or a call names an unknown function.
    """
    specs = {spec.name: spec for spec in case.tools()}
    calls = []
    for expected in case.ground_truth:
        ((name, answers),) = expected.items()
        if name not in specs:
            raise ConfigError(f"{case.id}: ground truth calls unknown function {name!r}")
        arguments = _pick_members(answers, specs[name].parameters, f"{case.id}: {name}")
        calls.append({"name": name, "arguments": arguments})
    return calls


def _pick_members(
    answers: Mapping[str, list[Any]], schema: Mapping[str, Any], where: str
) -> dict[str, Any]:
    props = schema.get("properties", {})
    required = set(schema.get("required", ()))
    out = {}
    for key in [*props, *[k for k in answers if k not in props]]:
        if key not in answers:
            continue
        values = answers[key]
        if not isinstance(values, list):
            values = [values]
        if values and values[0] == "" and key not in required:
            continue
        if key not in props and "" in values:
            continue  # an omittable answer for a key the schema does not have (BFCL data slip)
        sub = props.get(key, {})
        usable = [_resolve(v, sub, f"{where}.{key}") for v in values if v != ""]
        if not usable:
            raise ConfigError(f"{where}: required argument {key!r} has no value")
        out[key] = next((v for v in usable if _valid(v, sub)), usable[0])
    return out


def _resolve(value: Any, schema: Mapping[str, Any], where: str) -> Any:
    if isinstance(value, dict):
        return _pick_members(value, schema, where)
    if isinstance(value, list):
        items = schema.get("items") if isinstance(schema.get("items"), Mapping) else {}
        return [_resolve(v, items, where) for v in value]
    if isinstance(value, float) and value.is_integer() and schema.get("type") == "integer":
        return int(value)
    return value


def _valid(value: Any, schema: Mapping[str, Any]) -> bool:
    import jsonschema

    return jsonschema.Draft202012Validator(schema).is_valid(value)


def ground_truth_text(case: BfclCase) -> str:
    """The reference answer exactly as the tool-call grammar spells it.

    One call renders as ``{"name": ..., "arguments": {...}}``; a parallel case renders a JSON
    array of calls. The layout is ``json.dumps``'s default with ``ensure_ascii=False``.
    """
    calls = ground_truth_calls(case)
    payload: Any = calls if case.parallel else calls[0]
    if not case.parallel and len(calls) != 1:
        raise ConfigError(f"{case.id}: a non-parallel case with {len(calls)} expected calls")
    return json.dumps(payload, ensure_ascii=False)


def parse_calls(text: str) -> list[dict[str, Any]]:
    """Parse a grammar-shaped output into call dicts; free text (no call) gives ``[]``.

    Raises
    ------
    GrammarRejectedError
        The text starts like a call but is not valid JSON of the call shape.
    """
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return []
    try:
        payload = json.loads(stripped)
    except json.JSONDecodeError as exc:
        raise GrammarRejectedError(
            f"output is not valid JSON at char {exc.pos}: {exc.msg}"
        ) from exc
    items = payload if isinstance(payload, list) else [payload]
    for item in items:
        if not (
            isinstance(item, dict)
            and isinstance(item.get("name"), str)
            and isinstance(item.get("arguments"), dict)
        ):
            raise GrammarRejectedError(f"not a call object: {json.dumps(item)[:200]}")
    return items


def ast_check(case: BfclCase, calls: Sequence[Mapping[str, Any]]) -> bool:
    """Score calls with BFCL's official AST checker (Python semantics, as in the paper)."""
    return bool(ast_check_result(case, calls)["valid"])


def ast_check_result(case: BfclCase, calls: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The checker's full result dict (``valid``, ``error``, ``error_type``)."""
    checker, language = _ast_checker()
    model_output = [{call["name"]: dict(call["arguments"])} for call in calls]
    return checker(
        [dict(f) for f in case.functions],
        model_output,
        [dict(g) for g in case.ground_truth],
        language,
        case.category,
        "pask-agent",
    )


class _AnyModelConfig(dict):
    """``MODEL_CONFIG_MAPPING`` stand-in: every model keeps dotted function names."""

    def __missing__(self, key: str) -> Any:
        return types.SimpleNamespace(underscore_to_dot=False)


def _ast_checker() -> tuple[Any, Any]:
    # The real model_config module imports every API client SDK that bfcl-eval supports. The
    # checker only asks it whether a model rewrites dots in names, so a stand-in module is
    # registered before the first import (only if nothing else registered that name).
    if _MODEL_CONFIG not in sys.modules:
        bfcl_data_dir()  # a clear install hint instead of an ImportError
        shim = types.ModuleType(_MODEL_CONFIG)
        shim.MODEL_CONFIG_MAPPING = _AnyModelConfig()  # type: ignore[attr-defined]
        sys.modules[_MODEL_CONFIG] = shim
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    return ast_checker, Language.PYTHON


def _json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
