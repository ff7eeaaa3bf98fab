"""Structured calls on the default model: Pydantic schemas and BFCL tool calls, batched."""

from __future__ import annotations

import enum

import anyio
import jsonschema
import pytest
from pydantic import BaseModel, Field

from pask_agent.eval.bfcl import load_bfcl
from pask_agent.runtime.runtime import Runtime


class Address(BaseModel):
    street: str
    city: str
    zip_code: str


class Person(BaseModel):  # nested object
    name: str
    age: int
    address: Address


class Priority(enum.StrEnum):
    low = "low"
    medium = "medium"
    high = "high"


class Ticket(BaseModel):  # enum
    title: str
    priority: Priority


class ShoppingList(BaseModel):  # array
    items: list[str] = Field(min_length=2, max_length=6)


class Movie(BaseModel):  # optional fields
    title: str
    year: int
    director: str | None = None
    sequel_title: str | None = None


class Measurement(BaseModel):  # numbers
    temperature_c: float
    humidity_percent: float
    station_id: int


CASES = [
    (Person, "Alice is 34 and lives at 12 Oak Street, Springfield, zip 49007."),
    (Ticket, "The login page crashes for every user; this blocks all work."),
    (ShoppingList, "I need milk, eggs and bread for breakfast."),
    (Movie, "Inception came out in 2010, directed by Christopher Nolan."),
    (Measurement, "Station 17 reported 21.5 degrees Celsius at 63.2% humidity."),
]


@pytest.mark.slow
def test_pydantic_schemas_and_bfcl_calls(default_model) -> None:
    cases = [
        c
        for cat in ("simple_python", "multiple", "parallel", "parallel_multiple")
        for c in load_bfcl(cat, limit=1)
    ]

    async def main() -> None:
        async with Runtime.open(default_model) as rt:
            values: list = [None] * len(CASES)
            calls: list = [None] * len(cases)

            async def schema_call(i: int) -> None:
                values[i] = await rt.call(CASES[i][0], CASES[i][1], max_new_tokens=96)

            async def bfcl_call(i: int) -> None:
                calls[i] = await rt.chat(**cases[i].request(), max_new_tokens=160)

            async with anyio.create_task_group() as tg:  # all 9 requests batched together
                for i in range(len(CASES)):
                    tg.start_soon(schema_call, i)
                for i in range(len(cases)):
                    tg.start_soon(bfcl_call, i)
            for (cls, _), value in zip(CASES, values, strict=True):
                assert isinstance(value, cls)
                jsonschema.validate(value.model_dump(mode="json"), cls.model_json_schema())
            assert values[0].address.city == "Springfield"
            assert values[1].priority is Priority.high
            for case, result in zip(cases, calls, strict=True):
                assert result.tool_calls, (case.id, result.text)
                specs = {t.name: t for t in case.tools()}
                for call in result.tool_calls:
                    jsonschema.validate(call.arguments, dict(specs[call.name].parameters))
                    assert result.message["tool_calls"]
            assert rt.engine.store.live_bytes() == 0

    anyio.run(main)


def test_a_call_turn_is_reused_whole_by_the_next_turn(default_model) -> None:
    """The history writes an earlier call back as the model generated it (not in the chat
    template's <tool_call> markup), so the next turn of the conversation reuses every token of
    the call turn: the prompt, and the call with the KV actions PASK gave it."""
    weather = {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }

    async def main() -> None:
        async with Runtime.open(default_model) as rt:
            conv = rt.conversation("weather")
            messages = [{"role": "user", "content": "What is the weather in Paris?"}]
            first = await rt.chat(
                messages, tools=[weather], tool_choice="required", parallel_tool_calls=False,
                max_new_tokens=40, conversation=conv, policy="pask", budget=0.33,
            )  # fmt: skip
            assert first.tool_calls and first.tool_calls[0].name == "get_weather"
            in_store = conv.tokens_in_store
            call = first.tool_calls[0]
            messages = [
                *messages,
                first.message,
                {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'},
            ]
            second = await rt.chat(
                messages, tools=[weather], tool_choice="auto", parallel_tool_calls=False,
                max_new_tokens=24, conversation=conv, policy="pask", budget=0.33,
            )  # fmt: skip
            reused = second.usage.prompt_tokens - second.usage.prefilled_tokens
            assert in_store - 2 <= reused <= in_store, (in_store, reused)
            assert reused >= first.usage.prompt_tokens + first.usage.completion_tokens - 2

    anyio.run(main)
