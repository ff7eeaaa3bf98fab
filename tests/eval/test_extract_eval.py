"""The long-output extraction eval: generated documents state exactly their truth records and
regenerate to the committed split byte for byte; the scorer gives 1 for a perfect answer and
the expected partial or zero scores for missing records, wrong fields and malformed answers;
and a SmolLM2 run through the harness writes rows whose stored records re-score to what they
recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import ValidationError

from pask_agent.errors import ConfigError
from pask_agent.eval.extract_docs import KINDS, Document, generate, generate_split, surface_forms
from pask_agent.eval.extract_eval import ExtractWorkload, extraction_prompt, main
from pask_agent.eval.extract_scoring import field_equal, parse_answer, score_records
from pask_agent.eval.extract_split import (
    COUNTS,
    MIN_MEDIAN,
    build_lines,
    load_split,
    split_file,
)
from pask_agent.eval.harness import Run, configurations, evaluate
from pask_agent.policy.pask import PaskPolicy


# -- the generator ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(KINDS))
def test_generator_is_deterministic_and_states_every_truth_value(kind: str) -> None:
    for seed in range(12):
        doc = generate(kind, seed)
        assert doc == generate(kind, seed)
        fields = KINDS[kind].fields
        keys = [r[KINDS[kind].key] for r in doc.records]
        assert len(set(keys)) == len(keys), "the key field is unique within a document"
        for record in doc.records:
            assert tuple(record) == fields
            KINDS[kind].record.model_validate(record)  # the truth fits the asked schema
            for value in record.values():
                assert any(f in doc.text for f in surface_forms(value)), (kind, seed, value)
    assert generate(kind, 1).text != generate(kind, 2).text
    assert len(generate(kind, 3, records=2).records) == 2


def test_answer_model_bounds_the_list_to_the_count() -> None:
    kind = KINDS["log"]
    bounded = kind.answer(3).model_json_schema()["properties"]["records"]
    assert (bounded["minItems"], bounded["maxItems"]) == (3, 3)
    open_list = kind.answer().model_json_schema()["properties"]["records"]
    assert open_list["minItems"] == 1 and "maxItems" not in open_list
    records = list(generate("log", 0, records=3).records)
    assert kind.answer(3).model_validate({"records": records}).records[0].code == records[0]["code"]
    with pytest.raises(ValidationError):
        kind.answer(3).model_validate({"records": records[:2]})


def test_unknown_kind_and_empty_document_are_refused() -> None:
    with pytest.raises(ConfigError, match="invoice"):
        generate("memo", 0)
    with pytest.raises(ConfigError, match="at least one record"):
        generate("log", 0, records=0)


def test_committed_split_regenerates_byte_for_byte() -> None:
    from pask_agent.runtime.models.loading import load_tokenizer

    split = load_split()
    header = split.header
    lines = build_lines(header["seed"], load_tokenizer(header["answer_tokens_by"]))
    assert split_file().read_text(encoding="utf-8") == "\n".join(lines) + "\n"
    assert header["counts"] == COUNTS and COUNTS["dev"] >= 40 and COUNTS["test"] >= 60
    assert header["answer_tokens"]["all"]["median"] >= MIN_MEDIAN
    assert all(300 <= n <= 3000 for n in split.answer_tokens.values())
    dev, test = split.partition("dev"), split.partition("test")
    assert not {d.id for d in dev} & {d.id for d in test}
    assert list(dev) == generate_split(header["seed"], "dev", len(dev))
    with pytest.raises(ConfigError, match="unknown split"):
        split.partition("calibration")


# -- the scorer ---------------------------------------------------------------------------------
TRUTH = (
    {"sku": "KX-4821", "description": "Brushed steel hinge", "quantity": 12, "unit_price": 4.35},
    {"sku": "KX-1002", "description": "Oak panel", "quantity": 3, "unit_price": 120.0},
    {"sku": "PT-5550", "description": "Nylon spacer", "quantity": 250, "unit_price": 0.5},
)
FIELDS = KINDS["invoice"].fields


def test_perfect_answer_scores_one_in_any_order_and_surface() -> None:
    answer = [dict(r) for r in reversed(TRUTH)]
    answer[0] = {**answer[0], "description": " nylon  SPACER ", "unit_price": "$0.50"}
    s = score_records(TRUTH, answer, FIELDS)
    assert (s.precision, s.recall, s.f1, s.exact_rate) == (1.0, 1.0, 1.0, 1.0) and s.perfect
    assert field_equal(84500, "84,500") and field_equal("09:30", "9:30")
    assert not field_equal(12, "12a") and not field_equal(4.35, 4.36)


def test_missing_record_lowers_recall_not_precision() -> None:
    s = score_records(TRUTH, [dict(r) for r in TRUTH[:2]], FIELDS)
    assert s.precision == 1.0 and s.recall == pytest.approx(2 / 3)
    assert s.f1 == pytest.approx(0.8) and s.exact_rate == pytest.approx(2 / 3)
    assert not s.perfect
    # a near-duplicate finds no truth record left to match: all four of its fields count wrong
    extra = score_records(TRUTH, [*TRUTH, {**TRUTH[0], "sku": "ZZ-0000"}], FIELDS)
    assert extra.recall == 1.0 and extra.precision == pytest.approx(12 / 16)
    assert extra.exact_rate == pytest.approx(3 / 4)


def test_wrong_field_costs_one_field_and_the_record() -> None:
    answer = [dict(r) for r in TRUTH]
    answer[1]["quantity"] = 4
    s = score_records(TRUTH, answer, FIELDS)
    assert s.right_fields == 11 and s.precision == s.recall == pytest.approx(11 / 12)
    assert s.exact_records == 2 and s.exact_rate == pytest.approx(2 / 3)


def test_malformed_answer_scores_zero() -> None:
    assert parse_answer('{"records": [{"sku": "KX-4821"') is None
    assert parse_answer('{"records": "none"}') is None
    assert parse_answer('{"records": [1, 2]}') is None
    assert parse_answer('{"records": [{"sku": "KX-4821"}]}') == [{"sku": "KX-4821"}]
    s = score_records(TRUTH, None, FIELDS)
    assert (s.precision, s.recall, s.f1, s.exact_rate, s.truth_records) == (0, 0, 0, 0, 3)
    assert score_records(TRUTH, [], FIELDS).f1 == 0.0


# -- the workload -------------------------------------------------------------------------------
def test_cases_are_a_prefix_with_kinds_alternating() -> None:
    docs = ExtractWorkload("dev", limit=8).cases()
    assert [d.kind for d in docs] == list(KINDS) * 2
    assert ExtractWorkload("test").cases()[0].id.startswith("test-")
    logs = ExtractWorkload("dev", kinds=("log",)).cases()
    assert len(logs) == COUNTS["dev"] // len(KINDS) and {d.kind for d in logs} == {"log"}
    prompt = extraction_prompt(docs[0])
    assert docs[0].text in prompt and "unit_price (number" in prompt
    assert f"It lists {len(docs[0].records)} line items." in prompt
    assert "It lists" not in extraction_prompt(docs[0], count_hint=False)
    with pytest.raises(ConfigError, match="unknown document kind"):
        ExtractWorkload(kinds=("memo",)).cases()
    assert main(["--policies", "nope", "--out", "/nonexistent/x"]) == 2


class TinyDocuments(ExtractWorkload):
    """Two short documents (two events, one log entry) instead of the split (the loading hook
    only), so SmolLM2 on a CPU finishes both policies in seconds."""

    def cases(self) -> list[Document]:
        return [generate("schedule", 1, records=2, doc_id="tiny-schedule"),
                generate("log", 1, records=1, doc_id="tiny-log")]  # fmt: skip


def test_smollm2_run_writes_rows_that_rescore(smollm2: Any, tmp_path: Path) -> None:
    from pask_agent.runtime.config import RuntimeConfig

    out = tmp_path / "extract"
    workload = TinyDocuments("dev", max_new_tokens=64)
    # the shipped table names the default model; PASK's mechanics still run on SmolLM2
    configs = configurations(["full", PaskPolicy(allow_transfer=True)], [0.33])
    small = RuntimeConfig(max_batch=4, kv_capacity_bytes=32 * 2**20)
    anyio.run(lambda: evaluate(workload, configs, Run(out), model=smollm2,
                               runtime_config=small, log=lambda _: None))  # fmt: skip
    rows = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert [(r["policy"], r["kind"]) for r in rows] == [
        (p, k) for p in ("full", "pask") for k in ("schedule", "log")
    ]
    docs = {d.id: d for d in workload.cases()}
    for r in rows:
        assert {"field_f1", "exact_match", "field_precision", "field_recall"} <= set(r)
        assert 0.0 <= r["field_f1"] <= 1.0 and 0.0 <= r["exact_match"] <= 1.0
        doc = docs[r["id"]]
        again = score_records(doc.records, r["records"], KINDS[doc.kind].fields)
        assert again.f1 == pytest.approx(r["field_f1"]) and again.perfect == r["correct"]
        assert r["valid_call"] == (r["records"] is not None)
        if r["valid_call"]:
            assert r["tagger_fallbacks"] == 0
            assert (r["measured_b"] == 1.0) == (r["policy"] == "full")
        else:
            assert r["field_f1"] == 0.0 and "ValidationFailedError" in r["error"]
    # SmolLM2 answers the one-entry log and runs out of tokens on the schedule: both branches
    assert {r["valid_call"] for r in rows} == {True, False}
    summary = json.loads(out.with_suffix(".json").read_text())
    assert {"command", "git_commit", "machine", "field_scores", "f1_paired"} <= set(summary)
    assert set(summary["field_scores"]) == {"full", "pask @ 0.33"}
    assert set(summary["f1_paired"]["full"]) == {"pask @ 0.33"}
    assert summary["settings"]["split_seed"] == load_split().header["seed"]
    md = out.with_suffix(".md").read_text()
    assert "Field-level scores" in md and "ΔF1" in md and "Command:" in md
