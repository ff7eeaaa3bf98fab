"""The SQL structural tagger: hand-checked tags, rollback, and agreement with xgrammar."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import xgrammar as xgr

from pask_agent.errors import GrammarRejectedError
from pask_agent.eval.sql_data import load_sample_questions, sample_data_dir
from pask_agent.grammars.sql.grammar import compile_sql_grammar
from pask_agent.grammars.sql.schema import SqlSchema
from pask_agent.grammars.sql.tagger import SqlTagger
from pask_agent.grammars.tags import Tag
from pask_agent.runtime.models.loading import load_tokenizer

DATA = sample_data_dir()
QWEN_SPECIAL_START = 151643


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer("default")


@pytest.fixture(scope="module")
def schemas() -> dict[str, SqlSchema]:
    return {path.stem: SqlSchema.from_sqlite(path) for path in sorted(DATA.glob("*.sqlite"))}


@pytest.fixture(scope="module")
def grammars(tokenizer: Any, schemas: dict[str, SqlSchema]) -> dict[str, Any]:
    """Per database: (bound grammar, unbound grammar). The tagger reads the unbound language:
    which table a column belongs to is the grammar's business, not a structural role."""
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    compiler = xgr.GrammarCompiler(info)
    return {
        db: tuple(
            compiler.compile_grammar(compile_sql_grammar(s, bind_columns=bind))
            for bind in (True, False)
        )
        for db, s in schemas.items()
    }


def _tags(schema: SqlSchema, pieces: list[str]) -> list[str]:
    tagger = SqlTagger(schema)
    return [tagger.feed(p).key() for p in pieces]


# (token text, expected tag) pairs, checked by hand against the mapping in grammars/sql/tagger.py.
HAND_CHECKED = [
    ("SELECT", "pure_scaffold/outside_schema/boundary/lookahead_critical"),
    (" first", "schema_bearing/projection/critical/lookahead_critical"),
    ("_name", "schema_bearing/projection/critical/lookahead_critical"),
    (",", "pure_scaffold/projection/boundary/lookahead_critical"),
    (" COUNT", "pure_scaffold/projection/stable/no_lookahead"),
    ("(*)", "pure_scaffold/projection/boundary/no_lookahead"),
    (" FROM", "pure_scaffold/outside_schema/boundary/lookahead_critical"),
    (" students", "schema_bearing/relation/critical/lookahead_critical"),
    (" AS", "pure_scaffold/relation/stable/no_lookahead"),
    (" T1", "free_generation/relation/stable/no_lookahead"),
    (" WHERE", "pure_scaffold/outside_schema/boundary/lookahead_critical"),
    (" T1", "schema_bearing/predicate/critical/lookahead_critical"),
    (".city", "schema_bearing/predicate/critical/lookahead_critical"),
    (" =", "pure_scaffold/predicate/stable/lookahead_critical"),
    (" 'Spring", "free_generation/predicate/critical/lookahead_critical"),
    ("field'", "free_generation/predicate/critical/lookahead_critical"),
    (" AND", "pure_scaffold/predicate/boundary/lookahead_critical"),
    (' "grade level"', "schema_bearing/predicate/critical/lookahead_critical"),
    (" >=", "pure_scaffold/predicate/stable/lookahead_critical"),
    (" 11", "free_generation/predicate/critical/lookahead_critical"),
    (" GROUP", "pure_scaffold/outside_schema/boundary/no_lookahead"),
    (" BY", "pure_scaffold/outside_schema/boundary/lookahead_critical"),
    (" first_name", "schema_bearing/projection/critical/lookahead_critical"),
    (" ORDER", "pure_scaffold/outside_schema/boundary/no_lookahead"),
    (" BY", "pure_scaffold/outside_schema/boundary/lookahead_critical"),
    (" 2", "free_generation/outside_schema/stable/no_lookahead"),
    (" DESC", "pure_scaffold/projection/stable/no_lookahead"),
    (" LIMIT", "pure_scaffold/outside_schema/boundary/no_lookahead"),
    (" 5", "free_generation/outside_schema/stable/no_lookahead"),
    (";", "pure_scaffold/outside_schema/boundary/no_lookahead"),
]


def test_hand_checked_tags(schemas: dict[str, SqlSchema]) -> None:
    pieces = [p for p, _ in HAND_CHECKED]
    assert _tags(schemas["school"], pieces) == [t for _, t in HAND_CHECKED]


def test_join_condition_and_subquery_roles(schemas: dict[str, SqlSchema]) -> None:
    pieces = [
        "SELECT",
        " name",
        " FROM",
        " departments",
        " AS",
        " d",
        " JOIN",
        " teachers",
        " AS",
        " t",
        " ON",
        " t",
        ".dept",
        "_id",
        " =",
        " d",
        ".dept_id",
        " WHERE",
        " salary",
        " >",
        " (SELECT",
        " AVG",
        "(salary",
        ")",
        " FROM",
        " teachers",
        ")",
    ]
    tags = dict(zip(range(len(pieces)), _tags(schemas["school"], pieces), strict=True))
    assert tags[7] == "schema_bearing/relation/critical/lookahead_critical"  # joined table
    assert tags[13] == "schema_bearing/relation/critical/lookahead_critical"  # ON column
    assert tags[18] == "schema_bearing/predicate/critical/lookahead_critical"  # WHERE column
    # "(" in WHERE (predicate, boundary) + the subquery's SELECT (outside_schema, boundary).
    assert tags[20] == "pure_scaffold/predicate/boundary/lookahead_critical"
    assert tags[22] == "schema_bearing/projection/critical/lookahead_critical"  # subquery list
    assert tags[26] == "pure_scaffold/predicate/boundary/no_lookahead"  # back in WHERE


def test_a_token_across_a_boundary_takes_the_conservative_tag(
    schemas: dict[str, SqlSchema],
) -> None:
    # "_id =" ends a column (schema_bearing, critical) and holds an operator (scaffold, stable).
    tags = _tags(
        schemas["shop"], ["SELECT", " *", " FROM", " orders", " WHERE", " customer", "_id =", " 7"]
    )
    assert tags[5] == "schema_bearing/predicate/critical/lookahead_critical"
    assert tags[6] == "schema_bearing/predicate/critical/lookahead_critical"
    assert tags[7] == "free_generation/predicate/critical/lookahead_critical"
    # ") AS" closes a call (projection, boundary) and starts an alias keyword.
    tags = _tags(schemas["shop"], ["SELECT", " SUM", "(price", ") AS", " total"])
    assert tags[3] == "pure_scaffold/projection/boundary/no_lookahead"
    assert tags[4] == "free_generation/projection/stable/no_lookahead"


def test_all_tags_are_in_the_sql_vocabulary(tokenizer: Any, schemas: dict[str, SqlSchema]) -> None:
    for q in load_sample_questions().questions:
        tagger = SqlTagger(schemas[q.db])
        for token in tokenizer.encode(q.gold_sql, add_special_tokens=False):
            tag = tagger.feed(tokenizer.decode([token]))
            assert isinstance(tag, Tag)
            tag.validate("sql")


def test_tagger_completes_exactly_when_the_matcher_does_on_gold_queries(
    tokenizer: Any, schemas: dict[str, SqlSchema], grammars: dict[str, Any]
) -> None:
    for q in load_sample_questions().questions:
        bound, unbound = (xgr.GrammarMatcher(g) for g in grammars[q.db])
        tagger = SqlTagger(schemas[q.db])
        for i, token in enumerate(tokenizer.encode(q.gold_sql, add_special_tokens=False)):
            assert bound.accept_token(token) and unbound.accept_token(token)
            tagger.feed(tokenizer.decode([token]))
            assert tagger.is_complete == unbound.is_completed(), (q.id, i)
            # Binding only narrows: a prefix the bound grammar could end is complete to both.
            assert tagger.is_complete or not bound.is_completed(), (q.id, i)
        assert tagger.is_complete and bound.is_completed()


def test_rollback_restores_state(tokenizer: Any, schemas: dict[str, SqlSchema]) -> None:
    rng = random.Random(3)
    for q in load_sample_questions().questions:
        pieces = [
            tokenizer.decode([t]) for t in tokenizer.encode(q.gold_sql, add_special_tokens=False)
        ]
        tagger = SqlTagger(schemas[q.db])
        first = [tagger.feed(p) for p in pieces]
        k = rng.randint(1, len(pieces))
        tagger.rollback(k)
        assert tagger.num_tokens == len(pieces) - k
        again = [tagger.feed(p) for p in pieces[len(pieces) - k :]]
        assert again == first[len(pieces) - k :], q.id
        assert tagger.is_complete
    tagger = SqlTagger(schemas["shop"])
    with pytest.raises(GrammarRejectedError, match="cannot roll back 1"):
        tagger.rollback(1)


@pytest.mark.parametrize(
    ("pieces", "bad"),
    [
        (["DELETE"], 0),
        (["SELECT", " *", " FROM", " students", ";", " DROP"], 5),
        (["SELECT", " (1", "))"], 2),
        (["SELECT", " nickname", " FROM"], 2),
        (["SELECT", " *", " FROM", " pupils"], 3),  # no table starts with "p"
        (["SELECT", " 1", " @"], 2),
    ],
)
def test_text_outside_the_grammar_raises_and_keeps_state(
    pieces: list[str], bad: int, schemas: dict[str, SqlSchema]
) -> None:
    tagger = SqlTagger(schemas["school"])
    for piece in pieces[:bad]:
        tagger.feed(piece)
    with pytest.raises(GrammarRejectedError) as info:
        tagger.feed(pieces[bad])
    assert info.value.token_index == bad
    assert tagger.num_tokens == bad  # the failed token left no trace


def test_state_stays_bounded_on_long_outputs(schemas: dict[str, SqlSchema]) -> None:
    tagger = SqlTagger(schemas["shop"])
    tagger.feed("SELECT * FROM orders WHERE status = '")
    for _ in range(2000):
        tagger.feed("very long literal ")
    tagger.feed("' AND order_id > 1")
    for _ in range(500):
        tagger.feed(" AND order_id > 1")
    state = tagger._state  # a frozen value: its size is what a snapshot costs
    assert len(state.frames) == 1 and len(state.buf) <= 64
    assert tagger.is_complete


def _allowed(bitmask: Any) -> np.ndarray:
    bits = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")
    ids = np.nonzero(bits)[0]
    return ids[ids < QWEN_SPECIAL_START]


@pytest.mark.parametrize("bound", [True, False])
@pytest.mark.parametrize("db", ["shop", "school"])
def test_random_grammar_walks_agree_with_xgrammar(
    db: str, bound: bool, tokenizer: Any, schemas: dict[str, SqlSchema], grammars: dict[str, Any]
) -> None:
    """Uniformly random legal tokens: the tagger never rejects; it agrees on completion with the
    unbound grammar, and whatever the bound grammar could end, the tagger calls complete."""
    rng = random.Random(db)
    bitmask = xgr.allocate_token_bitmask(1, len(tokenizer))
    for walk in range(12):
        matcher = xgr.GrammarMatcher(grammars[db][0 if bound else 1])
        tagger = SqlTagger(schemas[db])
        text = ""
        for _ in range(40):
            matcher.fill_next_token_bitmask(bitmask)
            allowed = _allowed(bitmask)
            if len(allowed) == 0:
                break
            token = int(rng.choice(list(allowed)))
            assert matcher.accept_token(token)
            piece = tokenizer.decode([token])
            text += piece
            tagger.feed(piece).validate("sql")
            if bound:
                assert tagger.is_complete or not matcher.is_completed(), (walk, text)
            else:
                assert tagger.is_complete == matcher.is_completed(), (walk, text)
