"""Structured outputs are tagged like tool arguments, and usage shows where tokens went.

``runtime.call(Schema, ...)`` used to decode with no tagger, so every token fell into PASK's
default bucket; now keys, enum values, free values and scaffold land in their own buckets, and
a token the tagger cannot place is counted (``tagger_fallback``), never silently defaulted."""

from __future__ import annotations

from typing import Literal

import anyio
import pytest
from pydantic import BaseModel

from pask_agent.grammars.json.schema import normalize_schema
from pask_agent.grammars.json.tagger import FunctionCallTagger
from pask_agent.runtime.runtime import Runtime


class Flight(BaseModel):
    origin: str
    destination: str
    passengers: int
    cabin: Literal["economy", "business"]


def test_schema_tagger_spreads_a_structured_answer_over_buckets() -> None:
    tagger = FunctionCallTagger.for_schema(normalize_schema(Flight.model_json_schema()))
    text = '{"origin": "Boston", "destination": "Denver", "passengers": 2, "cabin": "economy"}'
    tags = tagger.feed_all(list(text))
    assert tagger.is_complete
    by_char = {ch: tag for ch, tag in zip(text, tags, strict=True)}
    assert by_char["{"].cls == "pure_scaffold"
    assert tags[text.index("origin")].cls == "schema_bearing"  # a key
    assert tags[text.index("Boston")].cls == "free_generation"  # a free value's first char
    assert tags[text.index("economy")].cls == "schema_bearing"  # an enum value
    assert not tagger.between_calls()


@pytest.mark.slow
def test_call_with_schema_reports_tag_buckets(default_model) -> None:
    async def main() -> tuple:
        async with Runtime.open(default_model, policy="pask", budget=0.5) as rt:
            return await rt.call(
                Flight, "Two of us fly business from Boston to Denver.", with_usage=True
            )

    flight, usage = anyio.run(main)
    assert isinstance(flight, Flight) and flight.passengers == 2
    assert usage.tagger_fallbacks == 0 and "untagged" not in usage.tag_counts
    assert len(usage.tag_counts) >= 4, usage.tag_counts
    assert sum(usage.tag_counts.values()) == usage.completion_tokens
