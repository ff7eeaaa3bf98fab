"""The function-calling tagger: the Table-5 mapping, conservative combination across boundaries,
rejection with a reason, completion, rollback, and every BFCL non-live ground truth on both
bundled tokenizers."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import jsonschema
import pytest

from pask_agent.errors import GrammarRejectedError, SchemaError, ToolChoiceError
from pask_agent.eval.bfcl import NON_LIVE_CATEGORIES, ground_truth_calls, load_bfcl
from pask_agent.eval.bfcl import ground_truth_text as bfcl_text
from pask_agent.grammars.json.tagger import FunctionCallTagger
from pask_agent.grammars.tags import Tag
from pask_agent.grammars.token_text import TokenTextStream, token_texts
from pask_agent.runtime.models.loading import load_tokenizer

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"},
            "where": {
                "type": "object",
                "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                "required": ["lat"],
            },
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}
TIME = {
    "name": "get_time",
    "description": "Time in a zone.",
    "parameters": {
        "type": "object",
        "properties": {"zone": {"anyOf": [{"enum": ["UTC", "CET"]}, {"type": "string"}]}},
        "required": [],
        "additionalProperties": False,
    },
}
TOOLS = [WEATHER, TIME]


def tag(cls: str, role: str, state: str, nxt: str) -> Tag:
    return Tag(cls, role, state, nxt)


def feed_pieces(tagger: FunctionCallTagger, pieces: list[str]) -> list[Tag]:
    tags = [tagger.feed(piece) for piece in pieces]
    for t in tags:
        t.validate("function_calling")
    return tags


def call_text(name: str, **arguments: Any) -> str:
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def test_table5_mapping_on_a_hand_tokenized_call() -> None:
    pieces = ['{"', "name", '":', ' "', "get", "_weather", '",', ' "', "arguments", '":', " {"]
    pieces += ['"', "city", '":', ' "', "Par", "is", '",', ' "', "unit", '":', ' "', "celsius"]
    pieces += ['",', ' "', "days", '":', " ", "3", "}}"]
    assert "".join(pieces) == call_text("get_weather", city="Paris", unit="celsius", days=3)
    tagger = FunctionCallTagger(TOOLS, parallel=False, tool_choice="required")
    tags = dict(zip(range(len(pieces)), feed_pieces(tagger, pieces), strict=True))
    scaffold = ("pure_scaffold", "scaffold_separator", "boundary")
    assert tags[0] == tag(*scaffold, "no_lookahead")  # '{"' : the fixed "name" key follows
    assert tags[1] == tag("pure_scaffold", "dispatch_key", "boundary", "no_lookahead")
    assert tags[3] == tag(*scaffold, "lookahead_critical")  # ' "' before the tool name
    assert tags[4] == tag("schema_bearing", "dispatch_key", "critical", "lookahead_critical")
    assert tags[5] == tag("schema_bearing", "dispatch_key", "critical", "no_lookahead")
    assert tags[8] == tag("pure_scaffold", "scaffold_separator", "boundary", "no_lookahead")
    assert tags[10] == tag(*scaffold, "lookahead_critical")  # ' {' opens the arguments
    assert tags[12] == tag("schema_bearing", "required", "critical", "no_lookahead")  # city
    assert tags[13] == tag(*scaffold, "lookahead_critical")  # '":' then a string value
    assert tags[15] == tag("free_generation", "required", "critical", "no_lookahead")  # Par
    assert tags[16] == tag("free_generation", "required", "boundary", "no_lookahead")  # is
    assert tags[17] == tag(*scaffold, "lookahead_critical")  # '",' then the next key
    assert tags[19] == tag("schema_bearing", "optional", "critical", "no_lookahead")  # unit
    assert tags[22] == tag("schema_bearing", "optional", "critical", "no_lookahead")  # celsius
    assert tags[27] == tag(*scaffold, "lookahead_critical")  # ' ' before the number
    assert tags[28] == tag("free_generation", "required", "critical", "no_lookahead")  # 3
    assert tags[29] == tag(*scaffold, "no_lookahead")
    assert tagger.is_complete


def test_a_token_across_a_boundary_takes_the_most_protective_components() -> None:
    tagger = FunctionCallTagger(TOOLS, parallel=False, tool_choice="required")
    prefix = '{"name": "get_weather", "arguments": {"city": "Paris'
    assert tagger.feed(prefix).key() == "schema_bearing/dispatch_key/critical/no_lookahead"
    # closing quote (scaffold) + separator + an optional key + part of its value
    mixed = tagger.feed('", "unit": "cel')
    assert mixed == tag("schema_bearing", "optional", "critical", "lookahead_critical")
    mixed = tagger.feed('sius", "days": 1')
    assert mixed == tag("schema_bearing", "required", "critical", "no_lookahead")


def test_nested_keys_take_their_own_objects_required_split() -> None:
    tagger = FunctionCallTagger([WEATHER], parallel=False, tool_choice="required")
    tagger.feed('{"name": "get_weather", "arguments": {"city": "x", "days": 1, "where": {"')
    assert tagger.feed("lat").role == "required"
    tagger.feed('": 1.5, "')
    assert tagger.feed("lon").role == "optional"
    assert tagger.feed('": -2e3').cls == "free_generation"
    assert not tagger.is_complete
    tagger.feed("}}}")
    assert tagger.is_complete


def test_ambiguous_any_of_keeps_the_most_protective_candidate() -> None:
    tagger = FunctionCallTagger([TIME], parallel=False, tool_choice="required")
    tagger.feed('{"name": "get_time", "arguments": {"zone": "')
    # "U" may start the enum value "UTC" or a free string: schema_bearing wins.
    assert tagger.feed("U").cls == "schema_bearing"
    assert tagger.feed("TC").cls == "schema_bearing"
    assert tagger.feed("x").cls == "free_generation"  # only the free string is left
    tagger.feed('"}}')
    assert tagger.is_complete


def test_auto_free_text_and_the_deciding_first_token() -> None:
    tagger = FunctionCallTagger(TOOLS, parallel=False)
    assert not tagger.is_complete  # the grammar needs at least one character
    first = tagger.feed("Hello")
    assert first == tag("text", "text_body", "critical", "no_lookahead")
    assert tagger.is_complete
    assert tagger.feed(" {there}") == tag("text", "text_body", "boundary", "no_lookahead")
    call = FunctionCallTagger(TOOLS, parallel=False).feed("{")
    assert call.state == "critical" and call.cls == "pure_scaffold"
    none = FunctionCallTagger(TOOLS, parallel=False, tool_choice="none")
    with pytest.raises(GrammarRejectedError, match="must not start"):
        none.feed('{"name"')


def test_auto_text_then_calls_is_one_turn() -> None:
    """Under auto, prose may end in calls on a line of their own (a mixed turn): the prose gets
    text tags, the newline before a possible call looks ahead to a decision, and the `{` that
    turns text into a call is that decision."""
    tagger = FunctionCallTagger(TOOLS, parallel=True)
    assert tagger.feed("I will check") == tag("text", "text_body", "critical", "no_lookahead")
    assert tagger.feed(" the time.") == tag("text", "text_boundary", "boundary", "no_lookahead")
    newline = tagger.feed("\n")
    assert newline == tag("text", "text_boundary", "boundary", "lookahead_critical")
    assert tagger.is_complete  # prose alone is a whole answer
    opener = tagger.feed("[")
    assert opener == tag("pure_scaffold", "scaffold_separator", "critical", "no_lookahead")
    assert not tagger.is_complete
    tagger.feed(call_text("get_time", zone="UTC") + "]")
    assert tagger.is_complete
    with pytest.raises(GrammarRejectedError, match="already complete"):
        tagger.feed("\n")  # the calls end the turn
    # A text line can no longer open with a brace once calls may follow it...
    mixed = FunctionCallTagger(TOOLS, parallel=False)
    mixed.feed("Sure.\n")
    with pytest.raises(GrammarRejectedError):
        mixed.feed("{oops")
    # ...but without calls (tool_choice none) any line may.
    prose = FunctionCallTagger(TOOLS, parallel=False, tool_choice="none")
    prose.feed("Sure.\n")
    assert prose.feed("{ok}").cls == "text" and prose.is_complete


def test_parallel_array_completion() -> None:
    tagger = FunctionCallTagger(TOOLS, parallel=True, tool_choice="required")
    one = call_text("get_time", zone="UTC")
    tagger.feed("[" + one)
    assert not tagger.is_complete
    tagger.feed(", " + call_text("get_weather", city="a", days=2))
    tagger.feed("]")
    assert tagger.is_complete
    with pytest.raises(GrammarRejectedError, match="already complete"):
        tagger.feed(" ")
    single = FunctionCallTagger(TOOLS, parallel=False, tool_choice="required")
    with pytest.raises(GrammarRejectedError):
        single.feed("[")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"name": "get_wind', "no allowed key continues|must be one of"),
        ('{"name": "get_weather", "arguments": {"town', "allowed here"),
        (
            '{"name": "get_weather", "arguments": {"city": "a"}',
            r"missing required key\(s\) \['days'\]",
        ),
        ('{"name": "get_weather", "arguments": {"city": "a", "unit": "kelvin', "must be one of"),
        ('{"name": "get_weather", "arguments": {"days": 1', "allowed here"),  # order is fixed
        ('{"name":"get_weather"', "expected ' '"),  # the layout is json.dumps's
        ('{"name": "get_weather", "arguments": {"city": "a\nb', "control characters"),
        ('{"name": "get_weather", "arguments": {"city": "a", "days": 1.5', "integer"),
        ('{"name": "get_weather", "arguments": {"city": "a", "days": 01', "expected ', '"),
        ('{"name": "get_weather", "arguments": {"city": "a", "days": 12345678901234567', "digits"),
        ('{"name": "get_weather", "arguments": {"city": "\\x', "invalid escape"),
    ],
)
def test_rejections_say_where_and_why(text: str, reason: str) -> None:
    tagger = FunctionCallTagger(TOOLS, parallel=False, tool_choice="required")
    tagger.feed("{")
    with pytest.raises(GrammarRejectedError, match=reason) as info:
        tagger.feed(text[1:])
    assert info.value.token_index == 1
    # A rejected feed leaves the tagger as it was.
    assert tagger.num_tokens == 1
    tagger.feed('"name": "get_time", "arguments": {}}')
    assert tagger.is_complete


def test_named_tool_choice_and_bad_inputs() -> None:
    tagger = FunctionCallTagger(TOOLS, parallel=False, tool_choice="get_time")
    with pytest.raises(GrammarRejectedError):
        tagger.feed('{"name": "get_weather"')
    with pytest.raises(ToolChoiceError, match="neither"):
        FunctionCallTagger(TOOLS, parallel=False, tool_choice="get_date")
    with pytest.raises(SchemaError, match="empty"):
        FunctionCallTagger([], parallel=False)


def test_rollback_restores_state_and_tags() -> None:
    pieces = ['{"', "name", '": "', "get_weather", '", "arguments": {"', "city", '": "', "Rome"]
    tagger = FunctionCallTagger(TOOLS, parallel=False, max_rollback=4)
    tags = [tagger.feed(p) for p in pieces]
    tagger.rollback(3)
    assert tagger.num_tokens == len(pieces) - 3
    assert [tagger.feed(p) for p in pieces[-3:]] == tags[-3:]
    tagger.rollback(0)
    with pytest.raises(ValueError, match="can be undone"):
        tagger.rollback(5)  # the undo log is bounded by max_rollback
    tagger.rollback(4)
    with pytest.raises(GrammarRejectedError):
        tagger.feed('"}}')  # back inside the "arguments" key's tail: '"}}' is not allowed
    fresh = tagger.fresh()
    assert fresh.num_tokens == 0 and [fresh.feed(p) for p in pieces] == tags


def test_partial_characters_and_token_text_stream() -> None:
    tokenizer = load_tokenizer("default")
    text = call_text("get_weather", city="東京 🌧", days=1)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    texts = token_texts(tokenizer, ids)
    assert "".join(texts) == text
    assert "" in texts  # the emoji's bytes span several tokens
    tagger = FunctionCallTagger(TOOLS, parallel=False)
    tags = [tagger.feed(piece) for piece in texts]
    empty = texts.index("")
    assert tags[empty].cls == "free_generation" and tags[empty].role == "required"
    assert tagger.is_complete
    stream = TokenTextStream(tokenizer)
    assert [stream.push(i) for i in ids] == texts


@pytest.mark.parametrize("model", ["default", "smollm2-135m"])
def test_a_written_replacement_character_completes_the_output(model: str) -> None:
    """U+FFFD is also a character a model can write (the grammar may end on it): decoded text
    that ends in one is a half-written character only when the bytes say so. Found by the
    tagger agreement fuzz: xgrammar allowed a stop after prose ``}\ufffd`` that the tagger
    still called incomplete."""
    tokenizer = load_tokenizer(model)
    for text in ("}\ufffd", "ok \ufffd\ufffd", "日本語\ufffd"):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        texts = token_texts(tokenizer, ids)
        assert "".join(texts) == text and texts[-1].endswith("\ufffd"), texts
        tagger = FunctionCallTagger([WEATHER], parallel=False, tool_choice="auto")
        for piece in texts:
            tagger.feed(piece)
        assert tagger.is_complete, (model, text, texts)


def test_memory_per_token_does_not_grow_with_the_output() -> None:
    tagger = FunctionCallTagger([WEATHER], parallel=False, tool_choice="required", max_rollback=8)
    tagger.feed('{"name": "get_weather", "arguments": {"city": "')
    chunk = "abcdefgh" * 8
    for _ in range(100):
        tagger.feed(chunk)
    tracemalloc.start()
    try:
        for _ in range(100):
            tagger.feed(chunk)
        early, _ = tracemalloc.get_traced_memory()
        for _ in range(1500):  # 96k characters later
            tagger.feed(chunk)
        late, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert late - early < 4096  # bytes: the state is a bounded stack plus a bounded undo log
    tagger.feed('", "days": 1}}')
    assert tagger.is_complete


@pytest.mark.parametrize("model", ["default", "smollm2-135m"])
def test_every_bfcl_non_live_ground_truth_is_tagged(model: str) -> None:
    tokenizer = load_tokenizer(model)
    tagged = rejected = 0
    counts: dict[str, int] = {}
    for category in NON_LIVE_CATEGORIES:
        for case in load_bfcl(category):
            text = bfcl_text(case)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            texts = token_texts(tokenizer, ids)
            assert "".join(texts) == text
            tagger = FunctionCallTagger(case.functions, parallel=case.parallel)
            if not _schema_valid(case):
                # BFCL answers that contradict their own schema must be rejected, as the
                # grammar rejects them.
                with pytest.raises(GrammarRejectedError):
                    tagger.feed_all(texts)
                rejected += 1
                continue
            for i, piece in enumerate(texts):
                t = tagger.feed(piece)
                assert tagger.is_complete == (i == len(texts) - 1), (case.id, i)
                counts[t.key()] = counts.get(t.key(), 0) + 1
            tagged += 1
    assert tagged + rejected == 1000 and rejected == 2
    assert counts["schema_bearing/dispatch_key/critical/no_lookahead"] >= 1000
    assert counts["schema_bearing/required/critical/no_lookahead"] > 1000


def _schema_valid(case: Any) -> bool:
    specs = {spec.name: spec for spec in case.tools()}
    return all(
        jsonschema.Draft202012Validator(specs[c["name"]].parameters).is_valid(c["arguments"])
        for c in ground_truth_calls(case)
    )


def test_between_calls_marks_only_the_top_level_call_boundary() -> None:
    """The decoder's how-many-calls decision happens right after a call inside the array of
    parallel calls; ``]`` of an argument array or a bare single call are not that point."""
    tool = {
        "name": "f",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "array", "items": {"type": "integer"}}},
        },
    }
    out = '[{"name": "f", "arguments": {"a": [1, 2]}}, {"name": "f", "arguments": {}}]'
    tagger = FunctionCallTagger([tool], parallel=True, tool_choice="required")
    marks = []
    for ch in out:
        tagger.feed(ch)
        marks.append(tagger.between_calls())
    ends = [i for i, m in enumerate(marks) if m]
    assert ends == [out.index("}}, {") + 1, len(out) - 2]
    single = FunctionCallTagger([tool], parallel=False, tool_choice="required")
    single.feed_all(list('{"name": "f", "arguments": {}}'))
    assert single.is_complete and not single.between_calls()
