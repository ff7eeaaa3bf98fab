"""Tool results in the history are labelled by their JSON structure (``result_spans``): keys,
values and scaffold; prose and broken JSON keep their ordinary label; and the prompt the
runtime builds carries those labels on a real model's template."""

from __future__ import annotations

import json

import pytest

from pask_agent.grammars.json.result_spans import json_structure_spans, tool_result_spans
from pask_agent.grammars.tool_spec import ToolSpec

FLIGHTS = json.dumps(
    {
        "flights": [
            {"id": "FL-204", "price": 129.5, "direct": True, "note": 'say "hi"\\n'},
            {"id": "FL-311", "price": 98, "direct": False, "note": None},
        ],
        "count": 2,
    }
)


def _by_text(body: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for a, b, label in json_structure_spans(body):
        out.setdefault(body[a:b], set()).add(label)
    return out


def test_keys_values_and_scaffold_of_a_result() -> None:
    got = _by_text(FLIGHTS)
    assert got["flights"] == got["id"] == got["price"] == got["count"] == {"parameter_key"}
    for value in ("FL-204", "FL-311", "129.5", "98", "true", "false", "null", "2"):
        assert got[value] == {"protected_content"}, value
    assert got['say \\"hi\\"\\\\n'] == {"protected_content"}  # escapes stay inside the string
    assert {"schema_scaffold"} == got['": [{"'] == got['", "']
    spans = json_structure_spans(FLIGHTS, 100)
    # every character has exactly one label, in order, shifted by the offset
    assert spans[0][0] == 100 and spans[-1][1] == 100 + len(FLIGHTS)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))


@pytest.mark.parametrize(
    "body", ["It is 21 degrees and sunny.", '{"id": "FL-2', "[1, 2,]", "", "{} {}", "NaN x"]
)
def test_prose_or_broken_json_is_left_to_the_ordinary_labels(body: str) -> None:
    assert json_structure_spans(body) == []
    assert tool_result_spans(f"<tool_response>\n{body}\n</tool_response>", [body]) == []


def test_a_result_is_found_where_it_was_rendered_not_earlier() -> None:
    """A short result whose text also occurs earlier (a system prompt's example) is labelled
    at its own, later place."""
    text = 'example: {"n": 3}\n...\n<tool_response>\n{"n": 3}\n</tool_response>\n{"n": 4}'
    spans = tool_result_spans(text, ['{"n": 3}', '{"n": 4}'])
    starts = sorted({a for a, _, _ in spans})
    assert starts[0] == text.index("<tool_response>") + len("<tool_response>\n")
    assert {text[a:b] for a, b, label in spans if label == "protected_content"} == {"3", "4"}


def test_runtime_prompt_labels_a_json_result_by_structure(smollm2) -> None:
    from pask_agent.runtime.turns.outputs import OutputCompiler
    from pask_agent.runtime.turns.prompting import prepare_turn

    search = ToolSpec.from_any(
        {
            "name": "search_flights",
            "description": "Flights between two cities.",
            "parameters": {"type": "object", "properties": {"to": {"type": "string"}}},
        }
    )
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "search_flights", "arguments": {"to": "Oslo"}},
    }  # noqa: E501

    def labels(result: str) -> tuple[list[int], list[str]]:
        messages = [
            {"role": "user", "content": "Flights to Oslo?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": result},
            {"role": "user", "content": "Book the cheapest."},
        ]
        outputs = OutputCompiler(smollm2.tokenizer, smollm2.model.config.vocab_size)
        turn = prepare_turn(
            smollm2.tokenizer, outputs, messages, [search], "auto", True, labels=True
        )  # noqa: E501
        assert turn.labels is not None
        return turn.prompt_ids, turn.labels

    ids, got = labels(FLIGHTS)
    text = smollm2.tokenizer.decode(ids)
    start = text.index(FLIGHTS)
    # the result's tokens: keys and scaffold are labelled; the ids a later call copies are kept
    offsets = smollm2.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    inside = [
        label
        for (a, b), label in zip(offsets["offset_mapping"], got, strict=True)
        if start <= a and b <= start + len(FLIGHTS)
    ]
    assert {"parameter_key", "schema_scaffold", "protected_content"} <= set(inside)
    for value in ("FL-204", "FL-311", "129.5"):
        at = start + FLIGHTS.index(value)
        covering = [
            label
            for (a, b), label in zip(offsets["offset_mapping"], got, strict=True)
            if a < at + len(value) and b > at
        ]
        assert covering and set(covering) == {"protected_content"}, value
    # the same turn with a prose result: nothing in it is labelled
    prose_ids, prose = labels("Two flights: FL-204 at 129.5 and FL-311 at 98.")
    assert set(prose) <= set(got) and prose.count("parameter_key") < got.count("parameter_key")
