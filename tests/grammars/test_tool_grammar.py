"""The tool-call grammar on real tokenizers: exact schemas, tool_choice modes, masked specials."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
import xgrammar as xgr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pask_agent.errors import SchemaError, ToolChoiceError
from pask_agent.grammars.compiler import make_compiler, special_token_ids, stop_token_ids
from pask_agent.grammars.json.tool_grammar import (
    ToolCallGrammar,
    compile_tool_grammar,
    tool_call_ebnf,
)
from pask_agent.runtime.models.loading import load_tokenizer

QWEN_VOCAB = 151936
WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {
        "type": "dict",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
        },
        "required": ["city", "days"],
    },
}
SEARCH = {
    "name": "search.web",
    "description": "Search.",
    "parameters": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "maxLength": 12},
            "filters": {"type": "dict", "description": "Any options."},
            "weights": {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 2},
            "near": {
                "anyOf": [
                    {"type": "null"},
                    {
                        "type": "object",
                        "properties": {"lat": {"type": "number"}},
                        "required": ["lat"],
                    },
                ]
            },
            "pair": {
                "type": "array",
                "prefixItems": [{"type": "integer"}, {"type": "boolean"}],
                "minItems": 2,
                "maxItems": 2,
            },
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
        "required": ["query"],
    },
}
TOOLS = [WEATHER, SEARCH]


@pytest.fixture(scope="module")
def qwen() -> Any:
    return load_tokenizer("default")


@pytest.fixture(scope="module")
def compiler(qwen: Any) -> xgr.GrammarCompiler:
    return make_compiler(qwen, QWEN_VOCAB)


def accepts(grammar: ToolCallGrammar, tokenizer: Any, text: str) -> bool:
    """Feed ``text`` token by token, then a stop token; True if the grammar ends there."""
    matcher = grammar.matcher()
    # split_special_tokens: text such as "<|im_end|>" inside a string is what a model writes with
    # ordinary tokens (the special ids are masked), so tokenize it that way.
    ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    for token in ids:
        if not matcher.accept_token(token):
            return False
    return matcher.accept_token(stop_token_ids(tokenizer)[0]) and matcher.is_terminated()


def call(name: str, **arguments: Any) -> str:
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def test_exact_arguments_are_accepted_and_violations_rejected(qwen, compiler) -> None:
    g = compile_tool_grammar(compiler, TOOLS, tool_choice="required")
    ok = [
        call("get_weather", city="Paris", days=3),
        call("get_weather", city='Zürich "old"\\n', unit="celsius", days=-12),
        call("search.web", query="kv cache"),
        call(
            "search.web", query="x", filters={"a": [1, {"b": None}], "c": "d"}, weights=[0.5, 1e-3]
        ),
        call("search.web", query="x", near=None, pair=[3, True], counts={"a": 1, "b": 2}),
        call("search.web", query="x", near={"lat": 48.85}),
        call("get_weather", city="P", days=1234567890123456),  # 16 digits
        call("search.web", query="x").replace('"x"', '"x", "weights": [0.' + "1" * 21 + "]"),
    ]
    for text in ok:
        assert accepts(g, qwen, text), text
    bad = {
        "wrong function name": call("get_wether", city="Paris", days=3),
        "missing required": call("get_weather", city="Paris"),
        "out of enum": call("get_weather", city="Paris", unit="kelvin", days=3),
        "unknown key": call("get_weather", city="Paris", days=3, hours=4),
        "wrong type": call("get_weather", city="Paris", days="3"),
        "float for integer": call("get_weather", city="Paris", days=3.0),
        "key order": '{"name": "get_weather", "arguments": {"days": 3, "city": "Paris"}}',
        "compact separators": '{"name":"get_weather","arguments":{"city":"Paris","days":3}}',
        "runaway number": call("get_weather", city="P", days=12345678901234567),
        "runaway fraction": call("search.web", query="x").replace(
            '"x"', '"x", "weights": [0.' + "1" * 22 + "]"
        ),
        "string too long": call("search.web", query="a" * 13),
        "too many items": call("search.web", query="x", weights=[1, 2, 3]),
        "empty array under minItems": call("search.web", query="x", weights=[]),
        "tuple too short": call("search.web", query="x", pair=[3]),
        "map value type": call("search.web", query="x", counts={"a": "1"}),
        "nested required": call("search.web", query="x", near={}),
        "free text": "It is sunny.",
        "parallel array": "[" + call("get_weather", city="Paris", days=3) + "]",
        "trailing text": call("get_weather", city="Paris", days=3) + " ok",
        "raw newline in string": call("get_weather", city="a", days=1).replace('"a"', '"a\nb"'),
    }
    for why, text in bad.items():
        assert not accepts(g, qwen, text), why


def test_tool_choice_modes(qwen, compiler) -> None:
    weather = call("get_weather", city="Paris", days=3)
    search = call("search.web", query="q")
    auto = compile_tool_grammar(compiler, TOOLS)
    assert auto.tool_choice == "auto" and not auto.parallel
    assert accepts(auto, qwen, weather) and accepts(auto, qwen, "Which city do you mean?")
    assert not accepts(auto, qwen, "{not a call}")
    assert not accepts(auto, qwen, "")  # an empty answer is neither a call nor text
    none = compile_tool_grammar(compiler, TOOLS, tool_choice="none")
    assert accepts(none, qwen, "Sure.") and not accepts(none, qwen, weather)
    for mode in ("required", "any"):
        g = compile_tool_grammar(compiler, TOOLS, tool_choice=mode)
        assert accepts(g, qwen, search) and not accepts(g, qwen, "Sure.")
    named = compile_tool_grammar(compiler, TOOLS, tool_choice="search.web")
    assert accepts(named, qwen, search) and not accepts(named, qwen, weather)


def test_parallel_calls_are_a_non_empty_array(qwen, compiler) -> None:
    g = compile_tool_grammar(compiler, TOOLS, tool_choice="required", parallel=True)
    one = call("get_weather", city="Paris", days=3)
    two = call("search.web", query="q")
    assert accepts(g, qwen, f"[{one}]") and accepts(g, qwen, f"[{one}, {two}, {one}]")
    assert not accepts(g, qwen, one) and not accepts(g, qwen, "[]")
    # under auto a single bare call is also legal (a small model opens a lone call with "{")
    auto = compile_tool_grammar(compiler, TOOLS, tool_choice="auto", parallel=True)
    assert accepts(auto, qwen, one) and accepts(auto, qwen, f"[{one}, {two}]")
    assert not accepts(auto, qwen, f"[{one}]{one}")
    assert not accepts(g, qwen, f"[{one},{two}]")
    auto = compile_tool_grammar(compiler, TOOLS, parallel=True)
    assert accepts(auto, qwen, f"[{two}]") and accepts(auto, qwen, "No call needed.")


def test_special_tokens_are_masked_and_stop_only_when_complete(qwen, compiler) -> None:
    specials = special_token_ids(qwen, QWEN_VOCAB)
    assert specials == list(range(151643, QWEN_VOCAB))
    assert stop_token_ids(qwen) == [151643, 151645]
    g = compile_tool_grammar(compiler, TOOLS, tool_choice="auto")
    matcher = g.matcher()
    prefix = '{"name": "get_weather", "arguments": {"city": "Par'
    for token in qwen(prefix, add_special_tokens=False)["input_ids"]:
        assert matcher.accept_token(token)
    bitmask = xgr.allocate_token_bitmask(1, QWEN_VOCAB)
    matcher.fill_next_token_bitmask(bitmask)
    allowed = xgr.testing._get_masked_tokens_from_bitmask(bitmask, QWEN_VOCAB)
    rejected = set(allowed)  # the helper returns the masked-out ids
    assert set(specials) <= rejected  # no <|im_start|>, <tool_call> or [PAD] inside a string
    assert qwen.convert_tokens_to_ids("is") not in rejected
    # Free text (auto) must not contain special tokens either, but may stop.
    free = g.matcher()
    for token in qwen("Hello", add_special_tokens=False)["input_ids"]:
        assert free.accept_token(token)
    free.fill_next_token_bitmask(bitmask)
    rejected = set(xgr.testing._get_masked_tokens_from_bitmask(bitmask, QWEN_VOCAB))
    assert 151644 in rejected and 151657 in rejected and 151700 in rejected
    assert 151645 not in rejected and 151643 not in rejected
    logits = torch.zeros(1, QWEN_VOCAB)
    xgr.apply_token_bitmask_inplace(logits, bitmask)
    assert torch.isinf(logits[0, 151644]) and not torch.isinf(logits[0, 151645])


def test_smollm2_specials_and_stops() -> None:
    smol = load_tokenizer("smollm2-135m")
    assert stop_token_ids(smol) == [0, 2]
    assert special_token_ids(smol, 49152) == list(range(17))
    g = compile_tool_grammar(make_compiler(smol, 49152), [WEATHER], tool_choice="get_weather")
    assert accepts(g, smol, call("get_weather", city="Paris", days=3))
    assert not accepts(g, smol, call("get_weather", city="Paris"))


def test_ebnf_is_deterministic_and_readable() -> None:
    text = tool_call_ebnf(TOOLS, tool_choice="required", parallel=True)
    assert text == tool_call_ebnf(TOOLS, tool_choice="required", parallel=True)
    assert text.startswith("root ::= calls\n")
    assert "free_text" not in text


def test_bad_tool_choice_and_tools(compiler) -> None:
    with pytest.raises(ToolChoiceError, match="'get_wether'.*get_weather, search.web"):
        compile_tool_grammar(compiler, TOOLS, tool_choice="get_wether")
    with pytest.raises(ToolChoiceError, match="must be a string"):
        compile_tool_grammar(compiler, TOOLS, tool_choice={"type": "function"})  # type: ignore[arg-type]
    with pytest.raises(SchemaError, match="empty"):
        compile_tool_grammar(compiler, [])
    with pytest.raises(SchemaError, match="duplicate"):
        compile_tool_grammar(compiler, [WEATHER, WEATHER])
    with pytest.raises(TypeError, match="GrammarCompiler"):
        compile_tool_grammar(object(), TOOLS)  # type: ignore[arg-type]


JSON_SCALARS = st.none() | st.booleans() | st.integers(-(10**15), 10**15) | st.text(max_size=8)
ANY_JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
SEARCH_ARGS = st.fixed_dictionaries(
    {"query": st.text(max_size=12)},
    optional={
        "filters": st.dictionaries(st.text(max_size=6), ANY_JSON, max_size=3),
        "weights": st.lists(
            st.floats(allow_nan=False, allow_infinity=False, width=64)
            | st.integers(-(10**15), 10**15),
            min_size=1,
            max_size=2,
        ),
        "near": st.none() | st.fixed_dictionaries({"lat": st.floats(-90, 90)}),
        "pair": st.tuples(st.integers(-(10**15), 10**15), st.booleans()).map(list),
        "counts": st.dictionaries(st.text(max_size=4), st.integers(-999, 999), max_size=3),
    },
)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(args=SEARCH_ARGS)
def test_random_schema_valid_arguments_are_accepted(qwen, compiler, args: dict) -> None:
    """Any value valid under the schema, in schema key order, survives the real tokenizer."""
    order = list(SEARCH["parameters"]["properties"])
    ordered = {k: args[k] for k in order if k in args}
    g = compile_tool_grammar(compiler, TOOLS, tool_choice="required")
    assert accepts(g, qwen, call("search.web", **ordered))
