"""Execution-guided selection: result digests, votes, and SmolLM2 candidates on real SQLite.

The vote is plain arithmetic, checked on hand-made results; the batch test runs SmolLM2 with
three candidates on the sample shop database and checks what only a real batch can show: the
greedy candidate equals a one-candidate ask, the samples differ from it, and the answer is the
majority result, never a failed candidate while another ran. (Samples are seeded, but a
second ask reuses the schema's KV instead of recomputing it, and that rounding can flip a
near-tie draw, so sampled SQL is not compared across asks.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from pask_agent.errors import ConfigError, RequestTooLargeError
from pask_agent.integrations.sql import DEFAULT_CANDIDATES, MAX_QUESTION_CHARS, SQLiteAssistant
from pask_agent.integrations.sql_db import QueryResult
from pask_agent.integrations.sql_vote import is_empty, result_digest, tally
from pask_agent.package_data import sample_data_dir
from pask_agent.runtime.runtime import Runtime


def result(rows: list[tuple[Any, ...]], truncated: bool = False) -> QueryResult:
    return QueryResult(("a",), tuple(rows), truncated, 0.0)


def test_digest_is_a_set_of_rows_with_rounded_floats() -> None:
    assert result_digest(result([(1, "x"), (2, "y")])) == result_digest(
        result([(2, "y"), (1, "x"), (1, "x")])
    )
    assert result_digest(result([(1 / 3,)])) == result_digest(result([(0.3333333333,)]))
    assert result_digest(result([(1,)])) != result_digest(result([(2,)]))
    assert result_digest(result([(1,)])) != result_digest(result([(1,)], truncated=True))
    assert result_digest(result([])) != result_digest(result([(None,)]))


def test_tally_majority_ties_to_the_earliest_and_never_a_failure() -> None:
    assert tally(["a", "b", "b"]) == ([1, 2, 2], 1)
    assert tally(["a", "b"]) == ([1, 1], 0)  # a tie keeps greedy
    assert tally([None, "b", "c", "c", None]) == ([0, 1, 2, 2, 0], 2)
    assert tally([None, "b"]) == ([0, 1], 1)  # a lone runner beats a failed greedy
    assert tally([None, None]) == ([0, 0], None)
    assert tally(["x"]) == ([1], 0)


def test_an_empty_result_wins_only_when_nothing_else_ran() -> None:
    assert is_empty(result([])) and is_empty(result([(None,), (None,)]))
    assert not is_empty(result([(0,)])) and not is_empty(result([(None,), (3,)]))
    # two empty results outvoted a lone non-empty one before; now the rows win
    assert tally(["e", "e", "r"], [True, True, False]) == ([2, 2, 1], 2)
    # among non-empty results the majority and the greedy tie-break hold as before
    assert tally(["e", "a", "b", "b"], [True, False, False, False]) == ([1, 1, 2, 2], 2)
    assert tally(["a", "e", "b"], [False, True, False]) == ([1, 1, 1], 0)
    # nothing but empty results (or failures): the empty majority answers
    assert tally([None, "e", "f", "f"], [False, True, True, True]) == ([0, 1, 2, 2], 2)
    with pytest.raises(ValueError, match="3 digests but 2"):
        tally(["a", "b", "c"], [False, False])


def test_bad_arguments_are_refused_before_any_model(tmp_path: Path) -> None:
    shop = sample_data_dir() / "shop.sqlite"
    with pytest.raises(ConfigError, match="candidates"):
        SQLiteAssistant(shop, candidates=0)
    with pytest.raises(ConfigError, match="temperature"):
        SQLiteAssistant(shop, temperature=0.0)
    assistant = SQLiteAssistant(shop)
    with pytest.raises(ConfigError, match="at most 4000"):
        anyio.run(lambda: assistant.ask("x" * (MAX_QUESTION_CHARS + 1)))
    with pytest.raises(ConfigError, match="candidates"):
        anyio.run(lambda: assistant.ask("How many customers?", candidates=0))
    assistant.close()


def test_a_refused_request_raises_its_own_typed_error_not_a_group(smollm2: Any) -> None:
    """Every candidate's request is refused (past the context): ``ask`` raises the runtime's
    ``RequestTooLargeError`` as such, so callers catch what the runtime documents."""
    shop = sample_data_dir() / "shop.sqlite"

    async def main() -> None:
        async with Runtime.open(smollm2) as rt:
            assistant = SQLiteAssistant(shop, runtime=rt, candidates=3, max_new_tokens=10**6)
            try:
                await assistant.ask("How many customers are there?")
            finally:
                assistant.close()

    with pytest.raises(RequestTooLargeError):
        anyio.run(main)


QUESTIONS = [
    "How many customers live in Germany?",
    "List the names of products that cost more than 100.",
    "Which supplier has the most products?",
]


def test_smollm2_candidates_vote_in_one_batch(smollm2: Any) -> None:
    shop = sample_data_dir() / "shop.sqlite"

    async def main() -> tuple[list[Any], list[Any]]:
        async with Runtime.open(smollm2) as rt:
            voting = SQLiteAssistant(shop, runtime=rt, candidates=3, max_new_tokens=32)
            greedy = SQLiteAssistant(shop, runtime=rt, candidates=1, max_new_tokens=32)
            try:
                first = [await voting.ask(q) for q in QUESTIONS]
                plain = [await greedy.ask(q) for q in QUESTIONS]
                return first, plain
            finally:
                voting.close()
                greedy.close()

    first, plain = anyio.run(main)
    sampled_differ = False
    for a, g in zip(first, plain, strict=True):
        assert len(a.candidates) == 3 and a.usage.candidates == 3
        assert [c.seed for c in a.candidates] == [None, 1, 2]
        assert a.candidates[0].sql == g.sql  # candidate 0 is greedy decoding
        sampled_differ |= len({c.sql for c in a.candidates}) > 1
        ran = [c for c in a.candidates if c.error is None]
        assert (a.error is None) == bool(ran)
        if ran:
            top = max(c.votes for c in ran)
            assert top == max(c.votes for c in a.candidates)
            winner = next(c for c in a.candidates if c.sql == a.sql and c.error is None)
            assert winner.votes == top
            assert a.rows == voting_rows(a.sql)[: len(a.rows)]
            assert sum(c.votes > 0 for c in a.candidates) == len(ran)
        else:
            assert a.rows == () and a.error == a.candidates[0].error
        assert a.usage.completion_tokens == sum(c.usage.completion_tokens for c in a.candidates)
        assert a.usage.max_measured_b >= a.usage.measured_b - 1e-9
    assert sampled_differ, "three seeded samples at T=0.7 wrote the same SQL on every question"


def voting_rows(sql: str) -> tuple[tuple[Any, ...], ...]:
    from pask_agent.integrations.sql_db import ReadOnlyDatabase

    db = ReadOnlyDatabase(sample_data_dir() / "shop.sqlite")
    try:
        return db.query(sql).rows
    finally:
        db.close()


@pytest.mark.slow
def test_default_model_votes_over_linked_prompts_and_answers_right(default_model: Any) -> None:
    """The bundled model with its defaults (k candidates, linked prompt with values): the
    answers equal the gold rows, the winner holds the most votes, and every candidate that
    ran was read-only SQL over the database."""
    cases = [
        ("shop", "How many customers live in Germany?",
         "SELECT COUNT(*) FROM customers WHERE country = 'Germany'"),
        ("shop", "Which products are supplied by suppliers based in Japan?",
         "SELECT T1.name FROM products AS T1 INNER JOIN suppliers AS T2 ON T1.supplier_id = "
         "T2.supplier_id WHERE T2.country = 'Japan'"),
    ]  # fmt: skip

    async def main() -> list[tuple[Any, Any]]:
        async with Runtime.open(default_model) as rt:
            out = []
            for db, question, gold in cases:
                assistant = SQLiteAssistant(sample_data_dir() / f"{db}.sqlite", runtime=rt)
                try:
                    out.append((await assistant.ask(question), assistant.run_sql(gold)))
                finally:
                    assistant.close()
            return out

    for answer, gold in anyio.run(main):
        assert answer.error is None and set(answer.rows) == set(gold.rows), answer.sql
        assert len(answer.candidates) == DEFAULT_CANDIDATES
        winner = max(c.votes for c in answer.candidates)
        assert [c for c in answer.candidates if c.sql == answer.sql][0].votes == winner
        assert all(c.sql.upper().startswith("SELECT") for c in answer.candidates)
        assert answer.usage.candidates == DEFAULT_CANDIDATES and answer.usage.seconds > 0
