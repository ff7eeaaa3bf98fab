"""llama.cpp as a BFCL peer (``python -m pask_agent.eval.llamacpp_bfcl``): our grammar in
llama.cpp's GBNF spelling, the prompt and grammar each case gets, the rows it writes, and its
typed errors. The run itself needs ``llama-server`` from ``make peer-llamacpp``, which CI never
builds; these tests check what surrounds it with the real tokenizer, grammar builder, xgrammar
and BFCL checker."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import xgrammar
from xgrammar.testing import _is_grammar_accept_string

from pask_agent.errors import ConfigError
from pask_agent.eval.bfcl import load_bfcl
from pask_agent.eval.bfcl_eval import load_split
from pask_agent.eval.harness import Config, Row
from pask_agent.eval.llamacpp_bfcl import (
    CONTINUE_AT,
    KV_BYTES,
    PREFIX,
    LlamacppWorkload,
    case_prompt,
    continue_share,
    evaluate,
    gbnf,
    rest_of_calls,
    score,
)
from pask_agent.grammars.json.tool_grammar import tool_call_ebnf
from pask_agent.runtime.models.loading import load_tokenizer
from pask_agent.runtime.turns.outputs import OutputCompiler
from pask_agent.runtime.turns.prompting import prepare_turn

PER_TOKEN = 24 * 2 * 64 * 2 * 2  # the default model's K and V at f16


def _rule_names(grammar: str) -> list[str]:
    return [line.split("::=")[0].strip() for line in grammar.splitlines() if "::=" in line]


def test_gbnf_renames_rules_and_keeps_literals_and_classes() -> None:
    cases = load_split("test", 3)
    for case in cases:
        r = case.request()
        ebnf = tool_call_ebnf(r["tools"], tool_choice="required", parallel=True)
        grammar = gbnf(ebnf)
        # llama.cpp reads rule names of letters, digits and dashes only
        assert all(re.fullmatch(r"[A-Za-z0-9-]+", n) for n in _rule_names(grammar))
        assert grammar.replace("-", "_") == ebnf.replace("-", "_")
        # a literal keeps its underscores: parameter names are written as they are
        for name in r["tools"][0].parameters["properties"]:
            if "_" in name:
                assert f'"\\"{name}\\": "' in grammar


def test_gbnf_accepts_what_our_grammar_accepts() -> None:
    case = load_bfcl("simple_python", limit=2)[1]  # math.factorial(number)
    ebnf = tool_call_ebnf(case.request()["tools"], tool_choice="required", parallel=False)
    ours, theirs = xgrammar.Grammar.from_ebnf(ebnf), xgrammar.Grammar.from_ebnf(gbnf(ebnf))
    for text, ok in [
        ('{"name": "math.factorial", "arguments": {"number": 5}}', True),
        ('{"name": "math.factorial", "arguments": {"number": "5"}}', False),
        ('{"name": "math_factorial", "arguments": {"number": 5}}', False),
    ]:
        assert _is_grammar_accept_string(ours, text) is ok
        assert _is_grammar_accept_string(theirs, text) is ok


def test_each_case_gets_the_prompt_our_runtime_builds() -> None:
    tokenizer = load_tokenizer("default")
    outputs = OutputCompiler(tokenizer, 151936)
    workload = LlamacppWorkload("test", 1)
    for case in load_split("test", 1):
        ids, grammar = case_prompt(workload, tokenizer, outputs, case)
        r = case.request()
        turn = prepare_turn(
            tokenizer, outputs, r["messages"], r["tools"], "required",
            r["parallel_tool_calls"], labels=False,
        )  # fmt: skip
        assert ids == list(turn.prompt_ids)
        assert grammar.startswith("root ::= ")
        assert ("calls ::= " in grammar) is r["parallel_tool_calls"]


def _record(text: str, stop: str = "eos") -> dict:
    return {
        "text": text, "token_ids": list(range(12)), "prompt_tokens": 100, "stop_type": stop,
        "reason": "length" if stop == "limit" else "stop", "ttft_s": 0.6, "tpot_s": 0.03,
        "seconds": 1.0,
    }  # fmt: skip


def test_answers_are_scored_by_the_bfcl_checker_at_the_kv_types_bytes() -> None:
    workload = LlamacppWorkload("test", 1)
    case = load_bfcl("simple_python", limit=2)[1]
    right = '{"name": "math.factorial", "arguments": {"number": 5}}'
    wrong = '{"name": "math.factorial", "arguments": {"number": 6}}'
    broken = '{"name": "math.factorial", "arguments": {"number": "five"}}'
    ok = score(workload, case, _record(right), "q4_0", PER_TOKEN)
    bad = score(workload, case, _record(wrong), "f16", PER_TOKEN)
    invalid = score(workload, case, _record(broken, "limit"), "f16", PER_TOKEN)
    assert (ok.correct, ok.valid_call, ok.detail["kv_type"]) == (True, True, "q4_0")
    assert ok.measured.measured_b == pytest.approx(18 / 64)  # q4_0: 18 bytes per 32 values
    assert (bad.correct, bad.valid_call) == (False, True) and "value_error" in bad.error
    assert (invalid.correct, invalid.valid_call) == (False, False)
    assert invalid.error.startswith("ToolCallError")
    assert invalid.detail["finish_reason"] == "length"
    row = Row.of(workload, case, PREFIX + "q4_0", Config(PREFIX + "q4_0", 0.28125), ok, 1.0, {})
    assert row.config == "llama.cpp:q4_0" and row.measured.full_kv_bytes == 112 * PER_TOKEN


def test_without_the_server_or_with_unknown_kv_types_nothing_runs(tmp_path: Path) -> None:
    workload = LlamacppWorkload("test", 1)
    with pytest.raises(ConfigError, match="make peer-llamacpp"):
        evaluate(workload, ["f16"], tmp_path / "x", binary=tmp_path / "llama-server")
    fake = tmp_path / "bin" / "llama-server"
    fake.parent.mkdir()
    fake.write_text("")
    with pytest.raises(ConfigError, match="q2_k"):
        evaluate(workload, ["q2_k"], tmp_path / "x", binary=fake)
    assert set(KV_BYTES) == {"f16", "q8_0", "q4_0"}
    assert not (tmp_path / "x.jsonl").exists()


def _step(**logprobs: float) -> dict:
    return {"token": "]", "top_logprobs": [{"id": i, "token": t, "logprob": lp}
            for i, (t, lp) in enumerate(logprobs.items())]}  # fmt: skip


def test_a_closed_array_continues_when_another_call_has_its_share() -> None:
    import math

    # parallel_0 on f16: `]` -0.043, `,` -4.10 (1.7 % of the two), tokens the grammar
    # forbids in between; `,\n` is not a prefix of the separator and does not count
    step = _step(**{"]": -0.043, ",": -4.098, "]\n": -5.2, ",\n": -5.6, "]}": -6.5})
    share, comma = continue_share(step)
    p_close, p_comma = math.exp(-0.043), math.exp(-4.098)
    assert share == pytest.approx(p_comma / (p_close + p_comma))
    assert share >= CONTINUE_AT and comma is not None and comma["token"] == ","
    # parallel_5: `,` at -6.82 is 0.11 %: the array stays closed
    assert continue_share(_step(**{"]": -0.035, ",": -6.82}))[0] < CONTINUE_AT
    assert continue_share(_step(**{"]": -0.01})) == (0.0, None)


def _add(a: int, b: str) -> str:
    """Add.

    Args:
        a: A number.
        b: A label.
    """
    return b


def test_the_rest_of_the_array_is_what_our_grammar_accepts_after_a_call() -> None:
    grammar = gbnf(tool_call_ebnf([_add], tool_choice="required", parallel=True))
    one = '{"name": "_add", "arguments": {"a": 1, "b": "x"}}'
    two = '{"name": "_add", "arguments": {"a": 2, "b": "y"}}'
    accepts = _is_grammar_accept_string
    assert accepts(xgrammar.Grammar.from_ebnf(grammar), f"[{one}, {two}]")
    after_comma = xgrammar.Grammar.from_ebnf(rest_of_calls(grammar, ","))
    after_separator = xgrammar.Grammar.from_ebnf(rest_of_calls(grammar, ", "))
    assert accepts(after_comma, f" {two}]") and accepts(after_comma, f" {two}, {one}]")
    assert accepts(after_separator, f"{two}]")
    for wrong in ("]", f"{two}]", f" {two}"):
        assert not accepts(after_comma, wrong)
    single = gbnf(tool_call_ebnf([_add], tool_choice="required"))
    with pytest.raises(ValueError, match="parallel"):
        rest_of_calls(single, ",")
