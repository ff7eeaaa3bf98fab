"""The chat template's own text is labelled ``template_text``; what the messages say is not."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pask_agent.eval.bfcl import load_bfcl
from pask_agent.grammars.chat_spans import content_ranges, template_spans
from pask_agent.grammars.prompt import render_tool_prompt
from pask_agent.grammars.span_labels import label_prompt_spans, labels_for_tokens
from pask_agent.policy.actions import Action
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.default_table import build_default_table
from pask_agent.policy.planner import PrefillPlanner
from pask_agent.runtime.models.loading import load_tokenizer


@pytest.fixture(scope="module")
def qwen() -> Any:
    return load_tokenizer("default")


def char_labels(text: str, spans: list) -> list[str]:
    out = ["protected_content"] * len(text)
    for start, end, label in spans:
        out[start:end] = [label] * (end - start)
    return out


def labelled(text: str, messages: list[dict[str, Any]], tools: Any) -> list:
    schema = label_prompt_spans(text, tools)
    return [*schema, *template_spans(text, messages, schema)]


def test_template_text_is_what_no_message_says(qwen: Any) -> None:
    (case,) = [c for c in load_bfcl("multiple") if c.id == "multiple_48"]
    tools, messages = list(case.tools()), list(case.messages)
    text = render_tool_prompt(qwen, messages, tools)
    schema = label_prompt_spans(text, tools)
    before, after = char_labels(text, schema), char_labels(text, labelled(text, messages, tools))
    question = messages[0]["content"]
    q = text.index(question)
    assert set(after[q : q + len(question)]) == {"protected_content"}  # the request stays
    preamble = text.index("<tools>") + len("<tools>")
    assert set(after[:preamble]) == {"template_text"}  # role markers, system line, preamble
    assert set(after[q + len(question) :]) == {"template_text"}  # <|im_end|> ... assistant\n
    # Only protected characters outside the messages changed; every schema label stayed.
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert changed and {before[i] for i in changed} == {"protected_content"}
    assert not any(q <= i < q + len(question) for i in changed)
    assert {after[i] for i in changed} == {"template_text"}
    tokens = labels_for_tokens(text, labelled(text, messages, tools), qwen)
    assert {"template_text", "protected_content", "function_name"} <= set(tokens)


def test_calls_and_results_of_earlier_turns_are_content() -> None:
    text = "<s>user: Paris?</s><s>assistant: CALL get_weather(Paris)</s><s>tool: 21C</s>"
    messages = [
        {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "content": "21C"},
    ]
    ranges = content_ranges(text, messages)
    assert ranges is not None
    call = text.index("CALL")
    assert any(a <= call and text.index("21C") <= b for a, b in ranges)  # call through result
    labels = char_labels(text, template_spans(text, messages, []))
    assert labels[call] == labels[text.index("21C")] == "protected_content"
    assert labels[0] == "template_text"


def test_a_rewritten_message_relabels_nothing() -> None:
    text = "<s>user: PARIS?</s>"  # the template upper-cased the content
    assert content_ranges(text, [{"role": "user", "content": "Paris?"}]) is None
    assert template_spans(text, [{"role": "user", "content": "Paris?"}], []) == []


def test_below_the_int4_floor_the_template_goes_before_the_request(qwen: Any) -> None:
    """On the hand-written table, a prompt planned at B_P = 0.15 (every unprotected token INT4
    would cost 0.27) releases template text first and keeps the request."""
    (case,) = [c for c in load_bfcl("simple_python") if c.id == "simple_python_0"]
    tools, messages = list(case.tools()), list(case.messages)
    text = render_tool_prompt(qwen, messages, tools)
    labels = labels_for_tokens(text, labelled(text, messages, tools), qwen)
    table = build_default_table()
    planner = PrefillPlanner(table, PayloadCosts.from_dims(24, 2, 64), budget=0.15)
    plan = planner.plan(labels)
    acts = np.asarray(plan.actions)
    n = len(labels)
    settled = np.arange(n) >= table.sink_tokens
    settled &= np.arange(n) < n - table.window_tokens
    template = settled & (np.array(labels) == "template_text")
    request = settled & (np.array(labels) == "protected_content")
    assert template.any() and request.any()
    assert (acts[request] >= Action.L).all()  # the request keeps every group
    assert (acts[template] == Action.R).mean() > 0.9
    assert plan.planned_bytes <= plan.target_bytes
