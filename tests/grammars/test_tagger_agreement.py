"""The tagger and xgrammar agree on legality and completion (DESIGN.md, "Seams").

Hypothesis draws outputs straight from the normalized schemas (required keys plus a random subset
of optional ones, enums, nested objects, arrays and tuples, maps, any-values, strings with
escapes and non-ASCII text, numbers with fractions and exponents, free text), tokenizes them with
the real tokenizers, and walks xgrammar's matcher and the tagger side by side: wherever
xgrammar accepts a token the tagger must tag it, after every token ``tagger.is_complete`` must
equal "the stop token is allowed" in xgrammar's mask, and on mutated outputs both must reject at
the same token.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from typing import Any

import numpy as np
import pytest
import xgrammar as xgr
from fuzzing import fuzz_settings
from hypothesis import assume, given
from hypothesis import strategies as st

from pask_agent.errors import GrammarRejectedError
from pask_agent.eval.bfcl import load_bfcl
from pask_agent.grammars.compiler import make_compiler, special_token_ids, stop_token_ids
from pask_agent.grammars.json.layout import json_literal
from pask_agent.grammars.json.nodes import FREE_TEXT_FORBIDDEN_FIRST
from pask_agent.grammars.json.tagger import FunctionCallTagger
from pask_agent.grammars.json.tool_grammar import ToolCallGrammar, compile_tool_grammar
from pask_agent.grammars.token_text import token_texts
from pask_agent.grammars.tool_spec import tool_specs
from pask_agent.runtime.models.loading import load_tokenizer

VOCAB_SIZES = {"default": 151936, "smollm2-135m": 49152}
HAND_TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "dict",
            "properties": {
                "city": {"type": "string", "maxLength": 6},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit", 'a "q"', "東"]},
                "days": {"type": "integer"},
                "scale": {"type": "float"},
                "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
                "where": {
                    "type": "dict",
                    "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                    "required": ["lat"],
                },
            },
            "required": ["city"],
        },
    },
    {
        "name": "get_weather.v2",
        "description": "A tool whose name extends another's.",
        "parameters": {
            "type": "object",
            "properties": {
                "near": {"anyOf": [{"type": "null"}, {"type": "string", "minLength": 1}]},
                "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]},
                "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
                "extra": {"type": "dict"},
                "blob": {"type": "any"},
                "mode": {"const": "fast"},
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            },
            "required": ["mode"],
        },
    },
]


def _bfcl_functions(category: str, index: int) -> list[Any]:
    return list(load_bfcl(category, limit=index + 1)[index].functions)


CONFIGS = {
    "hand-auto": (HAND_TOOLS, False, "auto"),
    "hand-parallel-required": (HAND_TOOLS, True, "required"),
    "bfcl-multiple-auto": (_bfcl_functions("multiple", 3), False, "auto"),
    "bfcl-parallel-multiple-auto": (_bfcl_functions("parallel_multiple", 3), True, "auto"),
}


@cache
def _toolkit(model: str) -> tuple[Any, xgr.GrammarCompiler, int]:
    tokenizer = load_tokenizer(model)
    return tokenizer, make_compiler(tokenizer, VOCAB_SIZES[model]), stop_token_ids(tokenizer)[0]


@cache
def _specials(model: str) -> frozenset[int]:
    return frozenset(special_token_ids(_toolkit(model)[0], VOCAB_SIZES[model]))


@cache
def _grammar(model: str, config: str) -> ToolCallGrammar:
    tools, parallel, choice = CONFIGS[config]
    return compile_tool_grammar(_toolkit(model)[1], tools, tool_choice=choice, parallel=parallel)


# ---- strategies: the text of a schema-valid output ---------------------------------------------
_PLAIN = st.characters(min_codepoint=0x20, exclude_characters='"\\', exclude_categories=("Cs",))
_ESCAPES = st.sampled_from(['\\"', "\\\\", "\\/", "\\b", "\\f", "\\n", "\\r", "\\t"])
_UNICODE_ESCAPE = st.integers(0, 0xFFFF).map(lambda c: f"\\u{c:04x}")
_JSON_CHAR = st.one_of(_PLAIN, _PLAIN, _ESCAPES, _UNICODE_ESCAPE)
_NUMBER = st.one_of(
    st.integers(-(10**15), 10**15).map(str),
    st.floats(-1e6, 1e6, allow_nan=False).map(lambda x: repr(round(x, 5))),
    st.builds(
        lambda i, f, e, s, x: f"{i}.{f}{e}{s}{x}",
        st.integers(-99, 99),
        st.integers(0, 10**6),
        st.sampled_from("eE"),
        st.sampled_from(["", "+", "-"]),
        st.integers(0, 999),
    ),
)


def string_text(min_len: int = 0, max_len: int | None = None) -> st.SearchStrategy[str]:
    hi = min(max_len if max_len is not None else 8, max(min_len, 8))
    return st.lists(_JSON_CHAR, min_size=min_len, max_size=hi).map(lambda c: '"' + "".join(c) + '"')


def _join(open_: str, parts: list[str], close: str) -> str:
    return open_ + ", ".join(parts) + close


ANY_TEXT = st.recursive(
    st.one_of(string_text(), _NUMBER, st.sampled_from(["true", "false", "null"])),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda xs: _join("[", xs, "]")),
        st.lists(st.tuples(string_text(), inner), max_size=3).map(
            lambda kv: _join("{", [f"{k}: {v}" for k, v in kv], "}")
        ),
    ),
    max_leaves=5,
)


def value_text(schema: Mapping[str, Any]) -> st.SearchStrategy[str]:
    """Texts of values valid under a normalized schema, in the grammar's layout."""
    if "const" in schema:
        return st.just(json_literal(schema["const"]))
    if "enum" in schema:
        return st.sampled_from([json_literal(v) for v in schema["enum"]])
    if "anyOf" in schema:
        return st.one_of([value_text(b) for b in schema["anyOf"]])
    kind = schema.get("type")
    if kind is None:
        return ANY_TEXT
    if kind == "string":
        return string_text(schema.get("minLength", 0), schema.get("maxLength"))
    if kind == "integer":
        return st.integers(-(10**15), 10**15).map(str)
    if kind == "number":
        return _NUMBER
    if kind == "boolean":
        return st.sampled_from(["true", "false"])
    if kind == "null":
        return st.just("null")
    if kind == "array":
        prefix = [value_text(p) for p in schema.get("prefixItems", ())]
        items = schema.get("items")
        item = value_text(items) if isinstance(items, Mapping) else ANY_TEXT
        if prefix:
            return st.tuples(*prefix).map(lambda xs: _join("[", list(xs), "]"))
        lo, hi = schema.get("minItems", 0), schema.get("maxItems")
        hi = min(hi if hi is not None else 3, max(lo, 3))
        return st.lists(item, min_size=lo, max_size=hi).map(lambda xs: _join("[", xs, "]"))
    props = schema.get("properties")
    if props is None:
        extra = schema.get("additionalProperties")
        value = value_text(extra) if extra else ANY_TEXT
        pairs = st.lists(st.tuples(string_text(), value), max_size=2)
        return pairs.map(lambda kv: _join("{", [f"{k}: {v}" for k, v in kv], "}"))
    return _record_text(props, set(schema.get("required", ())))


def _record_text(props: Mapping[str, Any], required: set[str]) -> st.SearchStrategy[str]:
    members = []
    for name, sub in props.items():
        text = value_text(sub).map(lambda v, n=name: f"{json_literal(n)}: {v}")
        members.append(text if name in required else st.one_of(st.none(), text))
    return st.tuples(*members).map(lambda ms: _join("{", [m for m in ms if m is not None], "}"))


def output_text(config: str) -> st.SearchStrategy[str]:
    tools, parallel, choice = CONFIGS[config]
    specs = tool_specs(tools)
    call = st.one_of(
        [
            value_text(s.parameters).map(
                lambda args, n=s.name: f'{{"name": {json_literal(n)}, "arguments": {args}}}'
            )
            for s in specs
        ]
    )
    output = (
        st.lists(call, min_size=1, max_size=3).map(lambda c: _join("[", c, "]"))
        if parallel
        else call
    )
    if choice != "auto":
        return output
    free = st.text(min_size=1, max_size=12).filter(lambda t: t[0] not in FREE_TEXT_FORBIDDEN_FIRST)
    # under auto a parallel grammar also takes one bare call, and text may end in calls on a
    # line of their own (a text line opening with a brace is where both must reject)
    mixed = st.builds(lambda t, o: f"{t}\n{o}", free, output)
    return st.one_of(output, output, free, mixed, *([call] if parallel else []))


# ---- walking both parsers ----------------------------------------------------------------------
def _stop_allowed(matcher: xgr.GrammarMatcher, stop: int, bitmask: Any) -> bool:
    matcher.fill_next_token_bitmask(bitmask)
    return bool((int(bitmask[0, stop // 32]) >> (stop % 32)) & 1)


def walk(model: str, config: str, text: str) -> tuple[int | None, int | None]:
    """Feed ``text`` to both; return the token index where each rejected (None: accepted).

    Asserts completion agreement after every token both accepted.
    """
    tokenizer, _, stop = _toolkit(model)
    grammar = _grammar(model, config)
    matcher = grammar.matcher()
    tagger = FunctionCallTagger.from_grammar(grammar)
    bitmask = xgr.allocate_token_bitmask(1, VOCAB_SIZES[model])
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    pieces = token_texts(tokenizer, ids)
    # Text the tokenizer cannot spell (SmolLM2 drops some UTF-8 lead bytes) or spells with
    # special tokens ("<|im_end|>" typed as free text) is no output the model could produce.
    assume("".join(pieces) == text and not _specials(model).intersection(ids))
    x_reject = t_reject = None
    for i, (token, piece) in enumerate(zip(ids, pieces, strict=True)):
        if x_reject is None and not matcher.accept_token(token):
            x_reject = i
        if t_reject is None:
            try:
                tagger.feed(piece).validate("function_calling")
            except GrammarRejectedError:
                t_reject = i
        if x_reject is None and t_reject is None:
            assert tagger.is_complete == _stop_allowed(matcher, stop, bitmask), (text, i)
            continue
        if x_reject is not None and t_reject is None and not piece:
            # A token that only starts a multi-byte character has no text for the tagger yet;
            # the tagger rejects the token that completes the character instead.
            continue
        break
    return x_reject, t_reject


def _agree(x_reject: int | None, t_reject: int | None, pieces_empty_until: int) -> bool:
    if x_reject == t_reject:
        return True
    return (
        x_reject is not None and t_reject is not None and x_reject < t_reject <= pieces_empty_until
    )


_SETTINGS = fuzz_settings(12)


@pytest.mark.parametrize("model", list(VOCAB_SIZES))
@pytest.mark.parametrize("config", list(CONFIGS))
@_SETTINGS
@given(data=st.data())
def test_valid_outputs_are_tagged_and_completion_agrees(model: str, config: str, data: Any) -> None:
    text = data.draw(output_text(config), label="output")
    x_reject, t_reject = walk(model, config, text)
    assert x_reject is None, f"xgrammar rejected a schema-valid output at token {x_reject}"
    assert t_reject is None, f"the tagger rejected a token xgrammar accepted: {t_reject}"


_MUTATION_CHARS = st.sampled_from(list('{}[]",: 0123456789.-+eE\\/abnultrfxé'))


@pytest.mark.parametrize("model", list(VOCAB_SIZES))
@pytest.mark.parametrize("config", list(CONFIGS))
@_SETTINGS
@given(data=st.data())
def test_mutated_outputs_are_rejected_at_the_same_token(model: str, config: str, data: Any) -> None:
    text = data.draw(output_text(config), label="output")
    pos = data.draw(st.integers(0, len(text) - 1), label="position")
    op = data.draw(st.sampled_from(["insert", "delete", "replace"]), label="op")
    ch = data.draw(_MUTATION_CHARS, label="char")
    if op == "insert":
        text = text[:pos] + ch + text[pos:]
    elif op == "delete":
        text = text[:pos] + text[pos + 1 :]
    else:
        text = text[:pos] + ch + text[pos + 1 :]
    assume(text)
    tokenizer = _toolkit(model)[0]
    pieces = token_texts(tokenizer, tokenizer(text, add_special_tokens=False)["input_ids"])
    x_reject, t_reject = walk(model, config, text)
    empty_until = x_reject if x_reject is not None else -1
    while empty_until is not None and 0 <= empty_until < len(pieces) and not pieces[empty_until]:
        empty_until += 1
    assert _agree(x_reject, t_reject, empty_until), (text, x_reject, t_reject)


def test_bfcl_ground_truths_agree_with_xgrammar_token_by_token() -> None:
    """A sample of real answers (the full 1000 are tagged in test_fc_tagger)."""
    from pask_agent.eval.bfcl import ground_truth_text

    tokenizer, compiler, stop = _toolkit("default")
    bitmask = xgr.allocate_token_bitmask(1, VOCAB_SIZES["default"])
    for category in ("simple_python", "multiple", "parallel", "parallel_multiple"):
        for case in load_bfcl(category, limit=8):
            grammar = compile_tool_grammar(compiler, case.functions, parallel=case.parallel)
            matcher, tagger = grammar.matcher(), FunctionCallTagger.from_grammar(grammar)
            ids = tokenizer(ground_truth_text(case), add_special_tokens=False)["input_ids"]
            for token, piece in zip(ids, token_texts(tokenizer, ids), strict=True):
                assert matcher.accept_token(token)
                tagger.feed(piece)
                assert tagger.is_complete == _stop_allowed(matcher, stop, bitmask)
            assert tagger.is_complete and json.loads(ground_truth_text(case))


# ---- random token walks: tokenizations the tokenizer never makes, but a model can ---------------
_STRUCTURE = frozenset('{}[]",: 0123456789.-+eE\\')


@cache
def _walk_ids(model: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ids a walk may take (no special or stop tokens), those whose text is JSON structure or
    digits (to drive calls forward), and those safe to inject (whole characters on their own)."""
    tokenizer, _, stop = _toolkit(model)
    n = min(len(tokenizer), VOCAB_SIZES[model])
    texts = tokenizer.batch_decode([[i] for i in range(n)])
    banned = _specials(model) | {stop}
    ok = np.array([i for i in range(n) if i not in banned])
    structural = np.array([i for i in ok if texts[i] and set(texts[i]) <= _STRUCTURE])
    whole = np.array([i for i in ok if texts[i] and "\ufffd" not in texts[i]])
    return ok, structural, whole


@cache
def _openers(model: str) -> np.ndarray:
    """Ids whose text starts a JSON value: ``{`` or ``[``."""
    tokenizer = _toolkit(model)[0]
    ids = _walk_ids(model)[1]
    return np.array([i for i in ids if tokenizer.decode([int(i)])[:1] in "{["])


def _allowed(matcher: xgr.GrammarMatcher, bitmask: Any, vocab: int) -> np.ndarray:
    matcher.fill_next_token_bitmask(bitmask)
    return np.unpackbits(bitmask.numpy().view(np.uint8), bitorder="little")[:vocab].astype(bool)


@pytest.mark.parametrize("model", list(VOCAB_SIZES))
@pytest.mark.parametrize("config", list(CONFIGS))
@fuzz_settings(6)
@given(data=st.data())
def test_random_token_walks_agree(model: str, config: str, data: Any) -> None:
    """Walk random tokens xgrammar's mask allows (half the time among structural tokens, so
    walks reach nested arguments and later calls), maybe end with one it forbids; the tagger,
    fed the same tokens' text, must accept exactly what xgrammar accepted, agree on
    completion after every token, and reject the forbidden token."""
    tokenizer, _, stop = _toolkit(model)
    vocab = VOCAB_SIZES[model]
    ok, structural, whole = _walk_ids(model)
    openers = _openers(model)
    matcher = _grammar(model, config).matcher()
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    steps = data.draw(st.integers(1, 40), label="steps")
    ids: list[int] = []
    complete: list[bool] = []  # xgrammar allows the stop token after ids[: i + 1]
    for _ in range(steps):
        allowed = _allowed(matcher, bitmask, vocab)
        pool = ok[allowed[ok]]
        # structure half the time, so walks reach arguments and later calls; under "auto"
        # most first tokens start free text, so a structural first token opens JSON
        choice = structural if ids else structural[np.isin(structural, openers)]
        if data.draw(st.booleans(), label="structural") and allowed[choice].any():
            pool = choice[allowed[choice]]
        if not len(pool):
            break  # only the stop token is left: the output is complete
        token = int(pool[data.draw(st.integers(0, len(pool) - 1), label="token")])
        assert matcher.accept_token(token)
        ids.append(token)
        complete.append(_stop_allowed(matcher, stop, bitmask))
    forbidden = whole[~_allowed(matcher, bitmask, vocab)[whole]]  # free text may forbid none
    injected = bool(len(forbidden)) and not data.draw(st.booleans(), label="end_valid")
    if injected:
        token = int(forbidden[data.draw(st.integers(0, len(forbidden) - 1), label="forbidden")])
        assert not matcher.accept_token(token)
        ids.append(token)
    pieces = token_texts(tokenizer, ids)
    tagger = FunctionCallTagger.from_grammar(_grammar(model, config))
    accepted = len(ids) - injected
    for i in range(accepted):
        tagger.feed(pieces[i]).validate("function_calling")
        assert tagger.is_complete == complete[i], (ids[: i + 1], pieces[: i + 1])
    if injected:
        # A forbidden token whose text only completes in context (a split character) says
        # nothing about the tagger: the model could never have produced it there anyway.
        assume(pieces[-1] and "\ufffd" not in pieces[-1])
        with pytest.raises(GrammarRejectedError):
            tagger.feed(pieces[-1]).validate("function_calling")
