"""Prompt rendering with tools and Table-6 span labels on rendered BFCL prompts (App. A.3)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from pask_agent.cli import main
from pask_agent.errors import ConfigError, SchemaError
from pask_agent.eval.bfcl import BfclCase, load_bfcl
from pask_agent.grammars.prompt import render_tool_prompt
from pask_agent.grammars.span_labels import (
    LABEL_PRIORITY,
    find_tool_spans,
    label_prompt_spans,
    label_prompt_tokens,
    labels_for_tokens,
    token_label_candidates,
)
from pask_agent.grammars.tags import SPAN_LABELS
from pask_agent.grammars.tool_spec import ToolSpec
from pask_agent.runtime.models.loading import load_tokenizer

SCHEMA_KEYS = (
    "type",
    "description",
    "properties",
    "required",
    "enum",
    "items",
    "additionalProperties",
    "function",
    "name",
    "parameters",
    "default",
)


@pytest.fixture(scope="module")
def qwen() -> Any:
    return load_tokenizer("default")


@pytest.fixture(scope="module")
def smol() -> Any:
    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="module")
def case() -> BfclCase:
    # Two tools, each with an enum under array items, descriptions and a required list.
    (found,) = [c for c in load_bfcl("multiple") if c.id == "multiple_48"]
    return found


def char_labels(text: str, tools: list[ToolSpec]) -> list[str]:
    spans = label_prompt_spans(text, tools)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))  # a partition
    out = []
    for start, end, label in spans:
        out.extend([label] * (end - start))
    return out


def expect(labels: list[str], start: int, end: int, label: str, what: str) -> None:
    got = set(labels[start:end])
    assert got == {label}, f"{what!r} at {start}:{end} labelled {got}, expected {label}"


def test_every_schema_element_gets_its_label(qwen: Any, case: BfclCase) -> None:
    tools = list(case.tools())
    text = render_tool_prompt(qwen, case.messages, tools)
    labels = char_labels(text, tools)
    checked = {label: 0 for label in SPAN_LABELS}
    for tool in tools:
        line = json.dumps(tool.to_openai(), ensure_ascii=False)
        base = text.index(line)  # Qwen renders each tool as one json.dumps line
        assert labels[base - 1] == "protected_content" == labels[base + len(line)]
        name_at = line.index('"name": ' + json.dumps(tool.name)) + len('"name": "')
        expect(labels, base + name_at, base + name_at + len(tool.name), "function_name", tool.name)
        checked["function_name"] += 1
        for m in re.finditer(r'"type": "([a-z]+)"', line):
            want = "schema_scaffold" if m.group(1) == "function" else "type_constraint"
            expect(labels, base + m.start(1), base + m.end(1), want, m.group(0))
            checked[want] += 1
        for m in re.finditer(r'"description": "((?:[^"\\]|\\.)*)"', line):
            expect(labels, base + m.start(1), base + m.end(1), "schema_description", m.group(1))
            checked["schema_description"] += 1
        for key, label in (("enum", "enum_constraint"), ("required", "parameter_key")):
            for m in re.finditer(rf'"{key}": \[([^\]]*)\]', line):
                for item in re.finditer(r'"([^"]+)"', m.group(1)):
                    s = base + m.start(1) + item.start(1)
                    expect(labels, s, s + len(item.group(1)), label, item.group(1))
                    checked[label] += 1
        for m in re.finditer(r'"([A-Za-z_]+)": \{"type"', line):
            if m.group(1) in tool.parameters["properties"]:
                expect(labels, base + m.start(1), base + m.end(1), "parameter_key", m.group(1))
                checked["parameter_key"] += 1
        for m in re.finditer(r'"(' + "|".join(SCHEMA_KEYS) + r')": ', line):
            expect(labels, base + m.start(), base + m.end(), "schema_scaffold", m.group(0))
    # The request and the chat scaffolding stay protected.
    question = case.messages[0]["content"]
    q = text.index(question)
    expect(labels, q, q + len(question), "protected_content", "question")
    expect(labels, 0, text.index("<tools>") + len("<tools>\n"), "protected_content", "system")
    # template_text comes from the messages (chat_spans), not from the tool schemas, and
    # unlinked_schema from the SQL helper's question linking
    schema_labels = set(SPAN_LABELS) - {"protected_content", "template_text", "unlinked_schema"}
    assert all(checked[label] > 0 for label in schema_labels)
    assert checked["enum_constraint"] == 8 and checked["function_name"] == 2
    assert checked["parameter_key"] == 8  # 2 tools x (2 properties + 2 required entries)


def test_token_labels_follow_offsets_and_priority(qwen: Any, case: BfclCase) -> None:
    tools = list(case.tools())
    text = render_tool_prompt(qwen, case.messages, tools)
    ids = qwen(text, add_special_tokens=False)["input_ids"]
    labels = label_prompt_tokens(text, qwen, tools)
    candidates = token_label_candidates(text, label_prompt_spans(text, tools), qwen)
    assert len(labels) == len(ids) == len(candidates)
    assert set(labels) == set(SPAN_LABELS) - {"template_text", "unlinked_schema"}
    rank = LABEL_PRIORITY.index
    mixed = [(c, lab) for c, lab in zip(candidates, labels, strict=True) if len(c) > 1]
    assert mixed, "some tokens straddle a label boundary (e.g. '.\",')"
    for cands, label in zip(candidates, labels, strict=True):
        assert label == min(cands, key=rank)
    name_tokens = [
        qwen.decode([i]) for i, lab in zip(ids, labels, strict=True) if lab == "function_name"
    ]
    assert "".join(name_tokens).replace('"', "") == "".join(t.name for t in tools)


def test_smollm2_gets_tools_in_its_system_message(smol: Any, case: BfclCase) -> None:
    tools = list(case.tools())
    plain = render_tool_prompt(smol, case.messages, None)
    text = render_tool_prompt(smol, case.messages, tools)
    assert "<tools>" not in plain and "<tools>" in text
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.")
    assert [t.name for _, _, t in find_tool_spans(text, tools)] == [t.name for t in tools]
    labels = label_prompt_tokens(text, smol, tools)
    assert labels.count("function_name") >= 2 and labels.count("enum_constraint") >= 4
    with_system = render_tool_prompt(
        smol, [{"role": "system", "content": "Be brief."}, *case.messages], tools
    )
    assert with_system.startswith("<|im_start|>system\nBe brief.\n\n# Tools")


def test_qwen_prompt_uses_its_own_template(qwen: Any, case: BfclCase) -> None:
    tools = list(case.tools())
    text = render_tool_prompt(qwen, case.messages, tools)
    assert "You are Qwen" in text and text.endswith("<|im_start|>assistant\n")
    no_gen = render_tool_prompt(qwen, case.messages, tools, add_generation_prompt=False)
    assert not no_gen.endswith("<|im_start|>assistant\n")
    with pytest.raises(ConfigError, match="non-empty"):
        render_tool_prompt(qwen, [], tools)
    with pytest.raises(ConfigError, match="role"):
        render_tool_prompt(qwen, [{"content": "hi"}], tools)


def test_unvalidated_json_stays_protected(qwen: Any, case: BfclCase) -> None:
    tools = list(case.tools())
    known = json.dumps(tools[0].to_openai())
    unknown = known.replace(json.dumps(tools[0].name), '"someone_else"')
    broken_schema = known.replace('"type": "object"', '"type": "objet"', 1)
    truncated = known[:-5]
    for text in (unknown, broken_schema, truncated, "a {} b [1, 2]"):
        assert set(char_labels(text, tools)) == {"protected_content"}, text[:60]
    assert set(char_labels(known, [])) == {"protected_content"}  # no tools, nothing to validate
    assert {lab for _, _, lab in label_prompt_spans(known, tools)} == set(SPAN_LABELS) - {
        "protected_content",
        "template_text",
        "unlinked_schema",
    }


def test_labels_for_tokens_combines_conservatively(qwen: Any) -> None:
    text = "hello world"  # tokens: "hello" (0-5), " world" (5-11)
    spans = [(0, 3, "function_name"), (3, 11, "schema_scaffold")]
    assert labels_for_tokens(text, spans, qwen) == ["function_name", "schema_scaffold"]
    assert labels_for_tokens(text, [(6, 11, "enum_constraint")], qwen) == [
        "protected_content",
        "protected_content",  # " world" touches uncovered text (its space)
    ]
    overlap = [(0, 11, "schema_description"), (0, 5, "schema_scaffold")]  # later wins
    assert token_label_candidates(text, overlap, qwen) == [
        ("schema_scaffold",),
        ("schema_description",),
    ]
    with pytest.raises(SchemaError, match="unknown span label"):
        labels_for_tokens(text, [(0, 1, "keyword")], qwen)
    with pytest.raises(SchemaError, match="outside"):
        labels_for_tokens(text, [(0, 99, "schema_scaffold")], qwen)


def test_spans_cli(tmp_path, capsys, case: BfclCase) -> None:
    tools_file = tmp_path / "tools.json"
    tools_file.write_text(json.dumps(list(case.functions)))
    question = case.messages[0]["content"]
    assert main(["spans", "--tools", str(tools_file), "--prompt", question]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\s+\d+\s+'store'\s+function_name$", out, re.M)
    assert "enum_constraint" in out and out.splitlines()[0].split() == ["index", "token", "label"]
    tools_file.write_text("[]")
    assert main(["spans", "--tools", str(tools_file), "--prompt", question]) == 2
    assert "tool list is empty" in capsys.readouterr().err
