"""The bad-input matrix (issue 14 item 2): each bad input gets a typed error naming the problem.

One row per input a caller can get wrong, each through the public entry point a user would
hit (``Runtime.call``/``chat``, ``PolicyTable.load``, ``SqlSchema.from_ddl``,
``SQLiteAssistant``), asserting the exception type and what its message says. Inputs that are
unusual but legal (a 1,000-value enum, a schema nested 40 deep, Unicode and emoji in names,
schemas and prompts) must work, and their rows check the answer.

The runtime rows use a random-weight 6-layer Qwen2 over the default model's real tokenizer,
with the default model's 32k context: every check before decoding is the real one, and where
an answer is decoded the grammar alone makes it valid, which is what the rows assert.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import xgrammar as xgr

from pask_agent.errors import (
    ConfigError,
    DDLError,
    PaskError,
    PolicyTableError,
    RequestTooLargeError,
    SchemaError,
    ToolChoiceError,
)
from pask_agent.grammars.sql.schema import SqlSchema
from pask_agent.integrations.sql import SQLiteAssistant
from pask_agent.policy.default_table import build_default_table
from pask_agent.policy.table import PolicyTable
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.models.loading import LoadedModel, load_tokenizer
from pask_agent.runtime.runtime import Runtime

CONTEXT = 32768  # the default model's max_position_embeddings
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    """A random 6-layer Qwen2 over the default tokenizer, with the default model's context."""
    from tiny_models import tiny_qwen2

    model = tiny_qwen2(151936)
    model.config.max_position_embeddings = CONTEXT
    return LoadedModel("tiny-qwen2", Path("."), model, load_tokenizer("default"))


def _run(loaded: LoadedModel, body: Callable[[Runtime], Awaitable[Any]], **open_kw: Any) -> Any:
    async def main() -> Any:
        async with Runtime.open(loaded, **open_kw) as rt:
            return await body(rt)

    return anyio.run(main)


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _nested(levels: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "boolean"}
    for _ in range(levels):
        node = {"type": "object", "properties": {"x": node}, "required": ["x"]}
    return node


def _depth(value: Any) -> int:
    return 1 + _depth(value["x"]) if isinstance(value, dict) else 0


# (row id, what the runtime is asked, error type, regex the message must match)
RUNTIME_ROWS: list[tuple[str, Callable[[Runtime], Awaitable[Any]], type[PaskError], str]] = [
    (
        "unsupported-json-schema",
        lambda rt: rt.call({"type": "object", "properties": {"a": {"pattern": "^x"}}}, "hi"),
        SchemaError,
        r"\$\.properties\.a\.pattern: unsupported JSON Schema keyword 'pattern'",
    ),
    (
        "invalid-json-schema",
        lambda rt: rt.call({"type": "objekt"}, "hi"),
        SchemaError,
        r"\$\.type: unknown type 'objekt'; use one of object, array",
    ),
    (
        "empty-tool-list-call",
        lambda rt: rt.call([], "hi"),
        SchemaError,
        r"the tool list is empty; give at least one tool",
    ),
    (
        "empty-tool-list-chat",
        lambda rt: rt.chat(_user("hi"), tools=[]),
        SchemaError,
        r"the tool list is empty",
    ),
    (
        "duplicate-tool-names",
        lambda rt: rt.call([WEATHER, WEATHER], "hi"),
        SchemaError,
        r"\$\[1\]\.name: duplicate tool name 'get_weather' \(also tool 0\)",
    ),
    (
        "unknown-tool-choice",
        lambda rt: rt.chat(_user("hi"), tools=[WEATHER], tool_choice="get_wether"),
        ToolChoiceError,
        r"tool_choice 'get_wether' is neither one of auto.*tools are: get_weather",
    ),
    (
        "prompt-longer-than-context",
        lambda rt: rt.chat(_user("hello " * (CONTEXT + 100)), max_new_tokens=8),
        RequestTooLargeError,
        rf"the prompt has \d+ tokens but the model's context is {CONTEXT} tokens; shorten",
    ),
    (
        "prompt-plus-max-new-tokens-over-context",
        lambda rt: rt.chat(_user("hello " * (CONTEXT - 500)), max_new_tokens=1000),
        RequestTooLargeError,
        rf"max_new_tokens=1000, more than the model's context of {CONTEXT} tokens; pass "
        r"max_new_tokens <= \d+",
    ),
    (
        "max-new-tokens-above-context",
        lambda rt: rt.chat(_user("hi"), max_new_tokens=CONTEXT + 1),
        RequestTooLargeError,
        rf"max_new_tokens={CONTEXT + 1} is above the model's context of {CONTEXT} tokens",
    ),
    (
        "ref-cycle",
        lambda rt: rt.call(
            {
                "type": "object",
                "properties": {"head": {"$ref": "#/$defs/Node"}},
                "$defs": {
                    "Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}
                },
            },
            "hi",
        ),
        SchemaError,
        r"\$\.properties\.head\.properties\.next\.\$ref: recursive \$ref '#/\$defs/Node'",
    ),
    (
        "schema-nested-past-the-limit",
        lambda rt: rt.call(_nested(65), "hi"),
        SchemaError,
        r"objects and arrays nest 65 levels deep, more than the limit of 64; flatten",
    ),
    (
        "tool-schema-nested-past-the-limit",
        lambda rt: rt.call([{"name": "deep", "parameters": _nested(300)}], "hi"),
        SchemaError,
        r"\$\[0\]\.parameters: objects and arrays nest (\d+|hundreds of) levels deep, more "
        r"than the limit of 64",
    ),
]

BUDGETS = [0.0, -0.25, 1.5, float("nan")]


@pytest.fixture(scope="module")
def refusals(tiny: LoadedModel) -> dict[str, BaseException | None]:
    """Every runtime row asked of one runtime (each request a fresh check of the same store);
    each row's test then checks what its request raised."""

    async def body(rt: Runtime) -> dict[str, BaseException | None]:
        out: dict[str, BaseException | None] = {}
        for row_id, ask, _, _ in RUNTIME_ROWS:
            try:
                await ask(rt)
                out[row_id] = None
            except Exception as exc:  # noqa: BLE001 - the row's test checks type and message
                out[row_id] = exc
        assert not rt.engine.inbox and not rt.engine.live  # nothing was queued
        return out

    return _run(tiny, body)


@pytest.mark.parametrize(
    ("row_id", "error", "message"),
    [(row[0], row[2], row[3]) for row in RUNTIME_ROWS],
    ids=[row[0] for row in RUNTIME_ROWS],
)
def test_runtime_rejects(
    refusals: dict[str, BaseException | None], row_id: str, error: type, message: str
) -> None:
    raised = refusals[row_id]
    assert isinstance(raised, error), repr(raised)
    assert re.search(message, str(raised)), str(raised)


def test_errors_leave_runtime_open_unwrapped(tiny: LoadedModel) -> None:
    """A typed error escaping ``async with Runtime.open(...)`` is itself, not an
    ``ExceptionGroup`` from the runtime's task group."""
    with pytest.raises(SchemaError, match="the tool list is empty"):
        _run(tiny, lambda rt: rt.call([], "hi"))


def test_request_that_never_fits_the_kv_capacity_is_refused_not_queued(tiny: LoadedModel) -> None:
    """The README's admission promise: a request that fits alone waits; one that can never
    fit raises at once (before this, it queued and failed inside the engine)."""
    config = RuntimeConfig(kv_capacity_bytes=64 << 10)  # 64 KiB: ~80 tokens of this model

    async def body(rt: Runtime) -> None:
        with pytest.raises(RequestTooLargeError, match=r"could never be admitted; shorten"):
            await rt.chat(_user("hello " * 200), max_new_tokens=8)
        assert not rt.engine.inbox and not rt.engine.live
        small = await rt.chat(_user("hi"), max_new_tokens=2)  # still serving
        assert small.usage.completion_tokens >= 1

    _run(tiny, body, config=config)


@pytest.mark.parametrize("budget", BUDGETS, ids=[str(b) for b in BUDGETS])
def test_budget_outside_zero_one(tiny: LoadedModel, budget: float) -> None:
    expected = rf"budget {re.escape(repr(budget))} is outside \(0, 1\]: B is the fraction"
    with pytest.raises(ConfigError, match=expected):
        Runtime(tiny, budget=budget)
    with pytest.raises(ConfigError, match=expected):
        anyio.run(_open_with_budget, budget)  # refused before a model would load


async def _open_with_budget(budget: float) -> None:
    async with Runtime.open("no-such-model", budget=budget):
        pass


def test_per_call_budget_outside_zero_one(tiny: LoadedModel) -> None:
    async def body(rt: Runtime) -> None:
        for budget in BUDGETS:
            expected = rf"budget {re.escape(repr(budget))} is outside \(0, 1\]"
            with pytest.raises(ConfigError, match=expected):
                await rt.chat(_user("hi"), policy="pask", budget=budget)
            with pytest.raises(ConfigError, match=expected):
                await rt.call([WEATHER], "hi", budget=budget)
        assert not rt.engine.inbox and not rt.engine.live

    _run(tiny, body)


def test_conversation_reused_across_models(tiny: LoadedModel) -> None:
    from tiny_models import tiny_qwen2

    other = LoadedModel("tiny-qwen2-b", Path("."), tiny_qwen2(151936), tiny.tokenizer)

    async def main() -> None:
        async with Runtime.open(tiny) as rt_a, Runtime.open(other) as rt_b:
            conversation = rt_a.conversation("user-42")
            await rt_a.chat(_user("hi"), conversation=conversation, max_new_tokens=2)
            with pytest.raises(ConfigError, match="belongs to another runtime.*tiny-qwen2'"):
                await rt_b.chat(_user("hi"), conversation=conversation, max_new_tokens=2)
            # the owner keeps serving it; the other runtime's own id is a separate conversation
            await rt_a.chat(_user("hi again"), conversation=conversation, max_new_tokens=2)
            assert rt_b.conversation("user-42") is not conversation

    anyio.run(main)


# ---------------------------------------------------------------- files: tables, DDL, databases


@pytest.fixture
def table_file(tmp_path: Path) -> Path:
    path = tmp_path / "table.json"
    build_default_table().save(path)
    return path


def _load(path: Path, model_id: str = "Qwen2.5-Coder-0.5B-Instruct") -> PolicyTable:
    table = build_default_table()
    return PolicyTable.load(path, model_id=model_id, tokenizer_hash=table.tokenizer_hash)


def test_policy_table_truncated(table_file: Path) -> None:
    text = table_file.read_text()
    table_file.write_text(text[: len(text) // 2])
    with pytest.raises(PolicyTableError, match=r"not valid JSON .*truncated or corrupt"):
        _load(table_file)


def test_policy_table_corrupt(table_file: Path) -> None:
    raw = json.loads(table_file.read_text())
    raw["budget_decode"] = 0.5  # a hand edit the checksum no longer covers
    table_file.write_text(json.dumps(raw))
    with pytest.raises(PolicyTableError, match=r"checksum mismatch .* edited or corrupted"):
        _load(table_file)
    table_file.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    with pytest.raises(PolicyTableError, match=r"cannot read policy table|not valid JSON"):
        _load(table_file)


def test_policy_table_for_another_model(table_file: Path) -> None:
    with pytest.raises(PolicyTableError, match=r"calibrated for model 'Qwen2.5-Coder-0.5B"):
        _load(table_file, model_id="SmolLM2-135M-Instruct")


@pytest.mark.parametrize(
    ("ddl", "message"),
    [
        ("CREATE TABLE (id INTEGER)", r"could not parse the DDL as SQLite \(Expected table name"),
        ("CREATE TABLE t (a INT", r"could not parse the DDL .* balanced parentheses"),
        ("SELECT 1", r"the DDL defines no table"),
        ("CREATE TABLE t (a INT, PRIMARY KEY (b))", r"PRIMARY KEY names unknown columns \['b'\]"),
    ],
)
def test_malformed_ddl(ddl: str, message: str) -> None:
    with pytest.raises(DDLError, match=message):
        SqlSchema.from_ddl(ddl)


def test_missing_database_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.sqlite"
    with pytest.raises(ConfigError, match=r"nope\.sqlite does not exist; pass the path"):
        SQLiteAssistant(missing)


def test_file_that_is_not_sqlite(tmp_path: Path) -> None:
    fake = tmp_path / "notes.sqlite"
    fake.write_text("these are notes, not a database\n" * 50)
    before = fake.read_bytes()
    with pytest.raises(DDLError, match=r"notes\.sqlite is not a readable SQLite database"):
        SQLiteAssistant(fake)
    assert fake.read_bytes() == before


# ---------------------------------------------------------------- legal but unusual: must work


def test_thousand_value_enum_works(tiny: LoadedModel) -> None:
    values = [f"v{i:04d}" for i in range(1000)]
    schema = {
        "type": "object",
        "properties": {"code": {"type": "string", "enum": values}},
        "required": ["code"],
    }
    tool = {"name": "pick_code", "parameters": schema}

    async def body(rt: Runtime) -> tuple[Any, Any]:
        value = await rt.call(schema, "Pick a code.", max_new_tokens=32)
        result = await rt.chat(
            _user("Pick a code."), tools=[tool], tool_choice="required",
            parallel_tool_calls=False, max_new_tokens=48,
        )  # fmt: skip
        return value, result.tool_calls

    value, calls = _run(tiny, body)
    assert value["code"] in values
    assert [c.name for c in calls] == ["pick_code"] and calls[0].arguments["code"] in values


def test_schema_nested_forty_deep_works(tiny: LoadedModel) -> None:
    schema = _nested(40)

    async def body(rt: Runtime) -> tuple[Any, Any]:
        value = await rt.call(schema, "Fill it in.", max_new_tokens=400)
        result = await rt.chat(
            _user("Fill it in."), tools=[{"name": "deep", "parameters": schema}],
            tool_choice="required", parallel_tool_calls=False, max_new_tokens=400,
        )  # fmt: skip
        return value, result.tool_calls

    value, calls = _run(tiny, body)
    assert _depth(value) == 40 and isinstance(_leaf(value), bool)
    assert len(calls) == 1 and _depth(calls[0].arguments) == 40


def _leaf(value: Any) -> Any:
    return _leaf(value["x"]) if isinstance(value, dict) else value


def test_unicode_and_emoji_in_names_schemas_and_prompts_work(tiny: LoadedModel) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "météo_☀️",
            "description": "Wetter 天气 🌦 für eine Stadt",
            "parameters": {
                "type": "object",
                "properties": {"ville_🏙": {"type": "string", "enum": ["Zürich", "東京", "🌍"]}},
                "required": ["ville_🏙"],
            },
        },
    }
    schema = {
        "type": "object",
        "properties": {"名前": {"type": "string", "enum": ["🍣", "Ünïcødé"]}},
        "required": ["名前"],
    }

    async def body(rt: Runtime) -> tuple[Any, Any, Any]:
        answer = await rt.chat(
            _user("天气 in 東京? 🌧"), tools=[tool], tool_choice="required",
            parallel_tool_calls=False, max_new_tokens=60,
        )  # fmt: skip
        calls = answer.tool_calls
        value = await rt.call(schema, "Quel plat ? 🍱", max_new_tokens=20)
        text = await rt.chat(_user("Say «héllo» 👋 in 日本語"), max_new_tokens=8)
        return calls, value, text

    calls, value, text = _run(tiny, body)
    assert [c.name for c in calls] == ["météo_☀️"]
    assert calls[0].arguments["ville_🏙"] in ("Zürich", "東京", "🌍")
    assert value["名前"] in ("🍣", "Ünïcødé")
    assert text.usage.prompt_tokens > 0 and text.usage.completion_tokens >= 1


def test_unicode_sql_names_values_and_path_work(tmp_path: Path) -> None:
    path = tmp_path / "menü 🍽.sqlite"
    con = sqlite3.connect(path)
    con.execute('CREATE TABLE "café_☕" ("名前" TEXT, "prix €" REAL)')
    con.executemany('INSERT INTO "café_☕" VALUES (?, ?)', [("寿司🍣", 9.5), ("Crème brûlée", 7.0)])
    con.commit()
    con.close()
    assistant = SQLiteAssistant(path)
    assert (
        'CREATE TABLE "café_☕"' in assistant.system_prompt
        and "'寿司🍣'" in assistant.system_prompt
    )
    sql = 'SELECT "prix €" FROM "café_☕" WHERE "名前" = \'寿司🍣\''
    tokenizer = load_tokenizer("default")
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_grammar(assistant.grammar))
    assert all(matcher.accept_token(t) for t in tokenizer.encode(sql, add_special_tokens=False))
    assert matcher.is_completed()
    assert assistant.run_sql(sql).rows == ((9.5,),)
    assistant.close()


def test_conversation_id_reused_across_models_in_langchain() -> None:
    """Caller-chosen ids are bound to a model; refused before any model is loaded."""
    import uuid

    from pask_agent.integrations._portal import runtime_registry
    from pask_agent.integrations.langchain import PaskChatModel

    cid = f"user-{uuid.uuid4().hex}"
    runtime_registry().bind_conversation(cid, "default")
    runtime_registry().bind_conversation(cid, "default")  # same model: the same conversation
    with pytest.raises(ConfigError, match=rf"'{cid}' is already used with model 'default'"):
        PaskChatModel(model="smollm2-135m", conversation_id=cid).invoke("hi")
    with pytest.raises(ConfigError, match="pass another conversation_id"):
        PaskChatModel(model="smollm2-135m").invoke("hi", conversation_id=cid)
