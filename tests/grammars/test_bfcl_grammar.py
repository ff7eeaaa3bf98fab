"""All 1000 BFCL non-live cases: every function set compiles, every ground truth is accepted token
by token on both bundled tokenizers, and mutated calls are rejected. Also the loader and the
official AST checker wrapper."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pask_agent.errors import ConfigError
from pask_agent.eval.bfcl import (
    NON_LIVE_CATEGORIES,
    BfclCase,
    ast_check,
    ground_truth_calls,
    ground_truth_text,
    load_bfcl,
    parse_calls,
)
from pask_agent.grammars.compiler import make_compiler, stop_token_ids
from pask_agent.grammars.json.tool_grammar import ToolCallGrammar, compile_tool_grammar
from pask_agent.runtime.models.loading import load_tokenizer

# BFCL answers that contradict their own schema: a string where the schema says array of float
# (linear_regression_fit.x) and strings where it says array of integer (sort_list.elements).
# A schema-exact grammar must reject them.
SCHEMA_VIOLATING_ANSWERS = {"parallel_multiple_21", "parallel_multiple_94"}
TOKENIZERS = {"default": 151936, "smollm2-135m": 49152}


@pytest.fixture(scope="module")
def cases() -> list[BfclCase]:
    return [case for category in NON_LIVE_CATEGORIES for case in load_bfcl(category)]


@pytest.fixture(scope="module")
def toolkits() -> dict[str, tuple[Any, Any, int]]:
    """Per tokenizer: (tokenizer, compiler, stop id); the compiler's cache is shared by tests."""
    out = {}
    for model, vocab_size in TOKENIZERS.items():
        tokenizer = load_tokenizer(model)
        out[model] = (tokenizer, make_compiler(tokenizer, vocab_size), stop_token_ids(tokenizer)[0])
    return out


def feed(grammar: ToolCallGrammar, tokenizer: Any, text: str, stop: int) -> bool:
    matcher = grammar.matcher()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return (
        all(matcher.accept_token(t) for t in ids)
        and matcher.accept_token(stop)
        and (matcher.is_terminated())
    )


def test_loader_counts_and_shape(cases: list[BfclCase]) -> None:
    counts = {c: sum(case.category == c for case in cases) for c in NON_LIVE_CATEGORIES}
    assert counts == {
        "simple_python": 400,
        "multiple": 200,
        "parallel": 200,
        "parallel_multiple": 200,
    }
    first = cases[0]
    assert first.id == "simple_python_0" and first.messages[0]["role"] == "user"
    assert first.functions[0]["name"] == "calculate_triangle_area" and not first.parallel
    assert load_bfcl("parallel", limit=3)[2].parallel
    with pytest.raises(ConfigError, match="unknown BFCL category 'simple_cobol'.*simple_python"):
        load_bfcl("simple_cobol")


def test_ground_truth_text_rules(cases: list[BfclCase]) -> None:
    by_id = {case.id: case for case in cases}
    # "unit": ["units", ""] → first value kept; "z": ["", 0] on an optional argument → omitted.
    assert ground_truth_text(by_id["simple_python_0"]) == (
        '{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5, '
        '"unit": "units"}}'
    )
    assert ground_truth_calls(by_id["simple_python_2"]) == [
        {"name": "math.hypot", "arguments": {"x": 4, "y": 5}}
    ]
    # Dict answers hold alternatives per key and resolve recursively, in schema order.
    calls = ground_truth_calls(by_id["simple_python_89"])
    assert calls[0]["arguments"]["conditions"] == {
        "department": "Science",
        "school": "Bluebird High School",
    }
    parallel = json.loads(ground_truth_text(by_id["parallel_0"]))
    assert [c["arguments"]["artist"] for c in parallel] == ["Taylor Swift", "Maroon 5"]


@pytest.mark.parametrize("model", sorted(TOKENIZERS))
def test_every_ground_truth_is_accepted(model: str, cases: list[BfclCase], toolkits) -> None:
    tokenizer, compiler, stop = toolkits[model]
    rejected = set()
    for case in cases:
        grammar = compile_tool_grammar(
            compiler, case.functions, tool_choice="required", parallel=case.parallel
        )
        if not feed(grammar, tokenizer, ground_truth_text(case), stop):
            rejected.add(case.id)
    assert rejected == SCHEMA_VIOLATING_ANSWERS


def _mutations(case: BfclCase) -> dict[str, Any]:
    """Wrong name, missing required argument and out-of-enum value, where the case allows."""
    calls = ground_truth_calls(case)
    specs = {spec.name: spec for spec in case.tools()}
    out: dict[str, Any] = {}
    wrong = [dict(c) for c in calls]
    wrong[0] = {**wrong[0], "name": wrong[0]["name"] + "_x"}
    out["wrong_name"] = wrong
    for i, c in enumerate(calls):
        params = specs[c["name"]].parameters
        if params["required"] and "missing_required" not in out:
            args = {k: v for k, v in c["arguments"].items() if k != params["required"][0]}
            out["missing_required"] = [*calls[:i], {**c, "arguments": args}, *calls[i + 1 :]]
        for key, value in c["arguments"].items():
            if "enum" in params["properties"][key] and "out_of_enum" not in out:
                args = {**c["arguments"], key: f"{value}_not_in_enum"}
                out["out_of_enum"] = [*calls[:i], {**c, "arguments": args}, *calls[i + 1 :]]
    return out


def test_mutated_calls_are_rejected(cases: list[BfclCase], toolkits) -> None:
    tokenizer, compiler, stop = toolkits["default"]
    tried = {"wrong_name": 0, "missing_required": 0, "out_of_enum": 0}
    for case in cases:
        if case.id in SCHEMA_VIOLATING_ANSWERS:
            continue
        grammar = compile_tool_grammar(
            compiler, case.functions, tool_choice="required", parallel=case.parallel
        )
        for kind, calls in _mutations(case).items():
            text = json.dumps(calls if case.parallel else calls[0], ensure_ascii=False)
            assert not feed(grammar, tokenizer, text, stop), (case.id, kind, text)
            tried[kind] += 1
    assert tried == {"wrong_name": 998, "missing_required": 998, "out_of_enum": 99}


def test_ast_checker_scores_ground_truth_and_wrong_values(cases: list[BfclCase]) -> None:
    picked = [
        c
        for c in cases
        if c.id in ("simple_python_0", "multiple_0", "parallel_0", "parallel_multiple_0")
    ]
    assert len(picked) == 4
    for case in picked:
        calls = parse_calls(ground_truth_text(case))
        assert ast_check(case, calls), case.id
        wrong_value = json.loads(json.dumps(calls))
        key = next(iter(wrong_value[0]["arguments"]))
        wrong_value[0]["arguments"][key] = 987654
        assert not ast_check(case, wrong_value), case.id
        wrong_name = [{**calls[0], "name": "nope"}, *calls[1:]]
        assert not ast_check(case, wrong_name), case.id
    assert not ast_check(picked[2], parse_calls(ground_truth_text(picked[2]))[:1])  # one call short
    assert parse_calls("I cannot help with that.") == []
