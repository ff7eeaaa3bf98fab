"""Random JSON Schemas → compile → generate → validate (issue 14, item 4).

Why: a structured-output grammar must be sound: whatever path the model takes through it,
the answer validates against the schema it came from. A random-weight model is the harshest
user of a grammar (it has no idea what JSON looks like and goes wherever the mask lets it), so
hypothesis draws schemas from the subset the grammar enforces (objects with required and
optional properties, arrays with bounds, tuples, enums and consts of mixed literals,
``anyOf``, type lists, ``$ref`` into ``$defs``, names and values with quotes, backslashes,
non-ASCII text and emoji), and each one goes through the real ``Runtime.call`` on a tiny
random Qwen2 over the default tokenizer, greedy and sampled in one batch. Strings carry a
``maxLength`` so every answer ends within the token cap; the only failure mode left is an
answer the schema rejects, and ``jsonschema`` checks it independently of the runtime's own
validation. Numeric bounds are left out: the grammar documents them as prompt-only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.models.loading import LoadedModel, load_tokenizer
from pask_agent.runtime.runtime import Runtime

MAX_NEW_TOKENS = 640  # worst case of the schemas below: ~5 leaves of <= 45 tokens + structure
_CHARS = st.sampled_from(list('abz_ 09"\\/\n\té東🙂'))
NAMES = st.text(_CHARS, min_size=1, max_size=5)
TEXT = st.text(_CHARS, max_size=4)
LITERALS = st.one_of(st.none(), st.booleans(), st.integers(-(10**6), 10**6), TEXT)


@st.composite
def _string(draw: st.DrawFn) -> dict[str, Any]:
    hi = draw(st.integers(1, 6))
    node: dict[str, Any] = {"type": "string", "maxLength": hi}
    if draw(st.booleans()):
        node["minLength"] = draw(st.integers(0, hi))
    return node


LEAVES = st.one_of(
    _string(),
    st.sampled_from([{"type": t} for t in ("integer", "number", "boolean", "null")]),
    st.lists(LITERALS, min_size=1, max_size=4, unique_by=repr).map(lambda v: {"enum": v}),
    LITERALS.map(lambda v: {"const": v}),
    st.integers(1, 5).map(lambda n: {"type": ["string", "null"], "maxLength": n}),
)


@st.composite
def _object(draw: st.DrawFn, inner: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    props = draw(st.dictionaries(NAMES, inner, min_size=1, max_size=3))
    required = [n for n in props if draw(st.booleans())]
    node: dict[str, Any] = {"type": "object", "properties": props, "required": required}
    if draw(st.booleans()):
        node["description"] = draw(TEXT)
    return node


@st.composite
def _array(draw: st.DrawFn, inner: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    hi = draw(st.integers(0, 2))
    return {"type": "array", "items": draw(inner), "minItems": draw(st.integers(0, hi)),
            "maxItems": hi}  # fmt: skip


def _compound(inner: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        _object(inner),
        _array(inner),
        st.lists(inner, min_size=1, max_size=2).map(
            lambda xs: {"type": "array", "prefixItems": xs, "items": False}  # a closed tuple
        ),
        st.lists(inner, min_size=2, max_size=2).map(lambda xs: {"anyOf": xs}),
    )


NODES = st.recursive(LEAVES, _compound, max_leaves=5)


@st.composite
def schemas(draw: st.DrawFn) -> dict[str, Any]:
    """A root schema: usually an object, sometimes any node, sometimes through ``$ref``."""
    shape = draw(st.sampled_from(["object", "object", "any", "ref"]))
    if shape == "any":
        return draw(NODES)
    if shape == "object":
        return draw(_object(NODES))
    shared = draw(NODES)
    return {
        "type": "object",
        "properties": {"first": {"$ref": "#/$defs/T"}, "second": {"$ref": "#/$defs/T"}},
        "required": ["first"],
        "$defs": {"T": shared},
    }


@pytest.fixture(scope="module")
def runtime() -> Iterator[tuple[BlockingPortal, Runtime]]:
    """One runtime on a tiny random Qwen2 over the default tokenizer, open for the module."""
    from tiny_models import tiny_qwen2

    loaded = LoadedModel("tiny-qwen2", Path("."), tiny_qwen2(151936), load_tokenizer("default"))
    with start_blocking_portal() as portal:
        config = RuntimeConfig(sinks=2, window=8)
        with portal.wrap_async_context_manager(Runtime.open(loaded, config=config)) as rt:
            yield portal, rt


@fuzz_settings(10)
@given(schema=schemas(), seed=st.integers(0, 2**16))
def test_random_schemas_generate_valid_answers(
    runtime: tuple[BlockingPortal, Runtime], schema: dict[str, Any], seed: int
) -> None:
    portal, rt = runtime
    answers: list[Any] = [None, None]

    async def one(i: int, temperature: float) -> None:
        answers[i] = await rt.call(
            schema,
            "Fill in the answer.",
            max_new_tokens=MAX_NEW_TOKENS,
            temperature=temperature,
            seed=seed,
        )

    async def both() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 0, 0.0)
            tg.start_soon(one, 1, 1.0)

    portal.call(both)
    for answer in answers:
        jsonschema.validate(answer, schema)
    assert rt.engine.store.live_bytes() == 0
