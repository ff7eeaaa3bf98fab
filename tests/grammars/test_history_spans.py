"""Earlier calls in a prompt's history are labelled by structure (``history_spans``), and the
prompt the runtime builds carries those labels on the default model's own template."""

from __future__ import annotations

from pask_agent.grammars.json.history_spans import history_call_spans
from pask_agent.grammars.tool_spec import ToolSpec

WEATHER = ToolSpec.from_any(
    {
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
        },
    }
)
CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
ARGS = {"city": "Paris", "unit": "c"}


def _labelled(text: str) -> dict[str, str]:
    return {text[a:b]: label for a, b, label in history_call_spans(text, [WEATHER])}


def test_a_rendered_call_is_labelled_by_structure() -> None:
    text = f"user: weather?\nassistant: Let me check.\n<tool_call>\n{CALL}\n</tool_call>\nok"
    got = _labelled(text)
    assert got["get_weather"] == "function_name"
    assert got["city"] == got["unit"] == "parameter_key"
    assert got["Paris"] == "protected_content"  # a later turn may need the value itself
    assert got["c"] == "enum_constraint"
    assert got['", "arguments": {"'] == "schema_scaffold"
    assert got["<tool_call>\n"] == got["\n</tool_call>"] == "schema_scaffold"
    covered = sum(b - a for a, b, _ in history_call_spans(text, [WEATHER]))
    assert covered == len(CALL) + len("<tool_call>\n") + len("\n</tool_call>")  # prose untouched


def test_only_whole_calls_of_known_tools_count() -> None:
    unknown = CALL.replace("get_weather", "get_time")
    broken = CALL[:-2]  # the arguments never close
    off_layout = CALL.replace('": "', '":"')
    for text in (unknown, broken, off_layout, f"say {CALL[:20]}", ""):
        assert history_call_spans(text, [WEATHER]) == [], text
    assert history_call_spans(CALL, []) == []
    two = f"{CALL}\n{CALL.replace('Paris', 'Tokyo')}"
    assert sum(label == "function_name" for *_, label in history_call_spans(two, [WEATHER])) == 2


def test_runtime_prompt_labels_the_previous_call(default_model) -> None:
    from pask_agent.runtime.turns.outputs import OutputCompiler
    from pask_agent.runtime.turns.prompting import prepare_turn

    tokenizer = default_model.tokenizer
    messages = [
        {"role": "user", "content": "Weather in Paris in celsius?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ARGS},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "21 degrees"},  # prose: no labels
        {"role": "user", "content": "And Tokyo?"},
    ]
    outputs = OutputCompiler(default_model.tokenizer, default_model.model.config.vocab_size)
    turn = prepare_turn(tokenizer, outputs, messages, [WEATHER], "auto", True, labels=True)
    assert turn.labels is not None
    text = tokenizer.decode(turn.prompt_ids)
    # The earlier call is written back as the grammar made the model write it, not in the
    # template's <tool_call> markup (grammars/prompt.py).
    assert f"Let me check.\n{CALL}<|im_end|>" in text
    assert '<tool_call>\n{"name": "get_weather"' not in text
    # Without the history labels (schema and template labels only) the call is all content.
    from pask_agent.grammars.chat_spans import template_spans
    from pask_agent.grammars.span_labels import label_prompt_spans

    def schema_and_template(t: str) -> list:
        schema = label_prompt_spans(t, [WEATHER])
        return [*schema, *template_spans(t, messages, schema)]

    plain = prepare_turn(
        tokenizer, outputs, messages, [WEATHER], "auto", True, labels=True,
        label_spans=schema_and_template,
    )  # fmt: skip
    assert plain.prompt_ids == turn.prompt_ids and plain.labels is not None
    changed = [i for i, (a, b) in enumerate(zip(turn.labels, plain.labels, strict=True)) if a != b]
    assert changed and {plain.labels[i] for i in changed} == {"protected_content"}
    now = {turn.labels[i] for i in changed}
    assert {"function_name", "parameter_key", "schema_scaffold"} <= now
    region = tokenizer.decode([turn.prompt_ids[i] for i in range(changed[0], changed[-1] + 1)])
    assert region.strip() in CALL  # only the call's own tokens changed label
