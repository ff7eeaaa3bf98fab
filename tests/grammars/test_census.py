"""The tag census on a small BFCL subset, and the ``census`` and ``tags`` commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pask_agent.cli import main
from pask_agent.errors import ConfigError, ToolChoiceError
from pask_agent.eval.bfcl import ground_truth_text, load_bfcl
from pask_agent.grammars.census import TagCensus, tag_census, write_census
from pask_agent.grammars.json.tagger import FunctionCallTagger
from pask_agent.grammars.tags import Tag
from pask_agent.grammars.token_text import token_texts
from pask_agent.policy.actions import LayerGroups
from pask_agent.runtime.models.loading import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def cases() -> list[Any]:
    subset = list(load_bfcl("simple_python", limit=5)) + list(load_bfcl("parallel", limit=3))
    bad = [c for c in load_bfcl("parallel_multiple", limit=22) if c.id == "parallel_multiple_21"]
    return subset + bad  # parallel_multiple_21's answer contradicts its own schema


def _census(
    tokenizer: Any, cases: Any, *, groups: LayerGroups, model: str = "m", tool_choice: str = "auto"
) -> TagCensus:
    ranges = [groups.layers_of(g) for g in range(groups.count)]
    return tag_census(
        tokenizer,
        cases,
        answer_text=ground_truth_text,
        model=model,
        layer_ranges=ranges,
        tool_choice=tool_choice,
    )


def test_census_counts_every_token_of_the_accepted_answers(tokenizer: Any, cases: Any) -> None:
    groups = LayerGroups.for_layers(30)
    census = _census(tokenizer, cases, model="smollm2-135m", groups=groups)
    expected: dict[str, int] = {}
    for case in cases[:-1]:
        ids = tokenizer(ground_truth_text(case), add_special_tokens=False)["input_ids"]
        tagger = FunctionCallTagger(case.functions, parallel=case.parallel)
        for piece in token_texts(tokenizer, ids):
            key = tagger.feed(piece).key()
            expected[key] = expected.get(key, 0) + 1
    assert dict(census.buckets) == expected
    assert census.tokens == sum(expected.values())
    assert census.distinct_buckets == len(expected)
    assert census.cases == 8
    assert [r[0] for r in census.rejected] == ["parallel_multiple_21"]
    assert census.categories == (
        ("simple_python", 5, sum(_tokens(tokenizer, c) for c in cases[:5])),
        ("parallel", 3, sum(_tokens(tokenizer, c) for c in cases[5:8])),
        ("parallel_multiple", 0, 0),
    )
    for key, _ in census.buckets:
        Tag(*key.split("/")).validate("function_calling")
    rows = census.group_rows()
    assert [r["layers"] for r in rows] == [[0, 9], [10, 19], [20, 29]]
    assert all(r["buckets"] == expected and r["tokens"] == census.tokens for r in rows)
    marginals = census.marginals()
    assert all(sum(v.values()) == census.tokens for v in marginals.values())
    assert marginals["role"]["dispatch_key"] > 0 and marginals["cls"]["free_generation"] > 0


def _tokens(tokenizer: Any, case: Any) -> int:
    return len(tokenizer(ground_truth_text(case), add_special_tokens=False)["input_ids"])


def test_tool_choice_changes_only_the_deciding_first_token(tokenizer: Any, cases: Any) -> None:
    groups = LayerGroups.for_layers(30)
    auto = _census(tokenizer, cases[:5], groups=groups)
    required = _census(tokenizer, cases[:5], groups=groups, tool_choice="any")
    first_auto = "pure_scaffold/scaffold_separator/critical/no_lookahead"
    assert dict(auto.buckets)[first_auto] == 5
    assert first_auto not in dict(required.buckets)
    assert auto.tokens == required.tokens
    with pytest.raises(ToolChoiceError, match="auto, required, any"):
        _census(tokenizer, cases, groups=groups, tool_choice="none")


def test_layer_ranges_must_cover_three_contiguous_groups(tokenizer: Any, cases: Any) -> None:
    with pytest.raises(ConfigError, match="3 contiguous ranges"):
        tag_census(
            tokenizer,
            cases[:1],
            answer_text=ground_truth_text,
            model="m",
            layer_ranges=[range(0, 5), range(6, 10), range(10, 12)],
        )


def test_written_files_round_trip(tokenizer: Any, cases: Any, tmp_path: Path) -> None:
    census = _census(tokenizer, cases, groups=LayerGroups.for_layers(24))
    json_path, md_path = write_census(census, tmp_path / "out" / "census.json")
    payload = json.loads(json_path.read_text())
    assert payload["distinct_buckets"] == census.distinct_buckets
    assert payload["distinct_bucket_group_keys"] == 3 * census.distinct_buckets
    assert sum(payload["buckets"].values()) == payload["tokens"] == census.tokens
    assert payload["rejected"][0]["id"] == "parallel_multiple_21"
    assert payload["git_commit"] and payload["command"] and payload["machine"]  # provenance
    text = md_path.read_text()
    assert f"at commit `{payload['git_commit']}`" in text
    assert f"**{census.distinct_buckets} distinct buckets**" in text
    assert "| lower | 0–7 |" in text and "parallel_multiple_21" in text


def test_census_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "census.json"
    argv = ["census", "--model", "smollm2-135m", "--limit", "2", "--out", str(out)]
    assert main(argv) == 0
    payload = json.loads(out.read_text())
    assert payload["cases"] == 8 and payload["num_layers"] == 30
    assert out.with_suffix(".md").is_file()
    assert f"{payload['distinct_buckets']} distinct buckets" in capsys.readouterr().out


def test_census_of_mixed_turns_covers_prose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mixed.json"
    argv = ["census", "--model", "smollm2-135m", "--limit", "2", "--mixed", "--out", str(out)]
    assert main(argv) == 0
    buckets = dict(json.loads(out.read_text())["buckets"])
    prose = {k: n for k, n in buckets.items() if k.startswith("text/")}
    assert any("/text_body/" in k for k in prose) and any("/text_boundary/" in k for k in prose)
    # the newline after the prose looks ahead to the call that turns the turn into calls
    assert prose.get("text/text_boundary/boundary/lookahead_critical", 0) >= 8
    capsys.readouterr()
    assert main([*argv[:-2], "--tool-choice", "required", "--out", str(out)]) != 0
    assert "only tool_choice auto allows" in capsys.readouterr().err


TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "dict",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    }
]


def test_tags_command_prints_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    output = '[{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}]'
    argv = ["tags", "--model", "smollm2-135m", "--tools", str(tools), "--output", output]
    assert main(argv) == 0  # an array is read as parallel calls
    out = capsys.readouterr().out
    assert "schema_bearing   dispatch_key" in out and "the output is complete" in out
    assert main([*argv, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert "".join(r["text"] for r in rows) == output
    assert {r["role"] for r in rows} >= {"dispatch_key", "required", "optional"}


def test_tags_command_rejects_with_the_token_and_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    bad = '{"name": "get_weather", "arguments": {"town": "Oslo"}}'
    argv = ["tags", "--model", "smollm2-135m", "--tools", str(tools), "--output", bad]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "rejected" in err and "'t'" in err and 'allowed here: "city"' in err
    short = '{"name": "get_weather", "arguments": {"city": "Oslo"'
    assert main([*argv[:-1], short]) == 1
    assert "incomplete" in capsys.readouterr().err
