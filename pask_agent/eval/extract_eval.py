"""Long structured outputs: extract every record of a document with ``runtime.call`` (issue 31
item 2).

Why: BFCL calls and SQL queries are short answers, so they say little about what a KV policy
does to a long answer, where the model must keep copying exact values from a prompt whose keys
are compressed while its own earlier output is compressed too. Here each case is one generated
document (``extract_docs.py``: an invoice, a server log, an employee roster in prose, a week's
schedule) from the fixed split ``calibration_data/splits/extract.jsonl`` (``extract_split.py``;
40 dev and 60 test documents, reference answers of 300-3,000 tokens, median in the file's
header). The model answers ``await rt.call(kind.answer(n), prompt)``: a Pydantic model with
one field, ``records: list[Record]`` (``Runtime.call`` takes a model class or a JSON Schema
dict, not ``list[Record]``), bounded to the document's ``n`` records, which the prompt
states. Why the count: asked for an open list, the 0.5B default model answered one log with no
records and kept writing records past the end of a roster until the answer was cut; stating
and bounding the count keeps the eval about copying values out of a compressed prompt
(``--no-count`` runs the open variant).

A row's score is field-level F1 (``field_f1``, with ``field_precision``/``field_recall``) and
the exact-record rate (``exact_match``) from ``extract_scoring.py``; ``correct`` means every
record exact and none extra. An answer that does not validate (cut by ``--max-new-tokens``,
or not JSON) scores 0 and is not ``valid_call``. The report adds mean F1 and exact-record rate
per configuration and kind, and the paired F1 difference against each reference with a
bootstrap interval.

Usage::

    python -m pask_agent.eval.extract_eval --split dev --limit 8 --policies full,pask \\
        --budgets 0.33 --out results/extract_dev

writes ``<out>.{jsonl,json,md,png}`` with provenance through the harness (``eval/harness.py``),
which also resumes, shards (``--shard``, ``--workers``) and merges (``--merge``).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pask_agent.errors import ConfigError, ValidationFailedError
from pask_agent.eval.extract_docs import KINDS, Document, kind_of
from pask_agent.eval.extract_scoring import ExtractScore, score_records
from pask_agent.eval.extract_split import load_split
from pask_agent.eval.harness import Config, Measured, Row, Scored, Workload
from pask_agent.eval.harness_args import Defaults, main_of, names, run_eval
from pask_agent.eval.harness_args import add_arguments as add_shared
from pask_agent.eval.harness_report import summarize_rows

# the longest reference answer is about 2,100 tokens; leave room for looser JSON spacing
DEFAULTS = Defaults(out="results/extract_dev", max_new_tokens=4096, splits=("dev", "test"))
_TYPES = {int: "whole number", float: "number", str: "text"}


def extraction_prompt(doc: Document, *, count_hint: bool = True) -> str:
    """The request: the document, then what to extract and how to write values (the small
    default model follows instructions best after the text), and with ``count_hint`` how many
    records there are (the schema then bounds the list to that many). ``Runtime.call``
    appends its field list (``records: list of object``) after this."""
    kind = kind_of(doc.kind)
    fields, shape = [], []
    for name, info in kind.record.model_fields.items():
        what = _TYPES.get(info.annotation, "text")  # type: ignore[arg-type]
        fields.append(f"{name} ({what}{', ' + info.description if info.description else ''})")
        shape.append(f'"{name}": <{what}>')
    count = f" It lists {len(doc.records)} {kind.plural}." if count_hint else ""
    return (
        f"Here is the {kind.document}:\n\n{doc.text}\n\n"
        f"Extract every {kind.noun} of the {kind.document} above, in the order it appears, as "
        f"one record each in the list `records`.{count} Each record has the fields: "
        f"{'; '.join(fields)}. Copy each value exactly as the text writes it; write numbers "
        "without currency signs or thousands separators. The answer looks like "
        f'{{"records": [{{{", ".join(shape)}}}, ...]}} with one record per {kind.noun}.'
    )


@dataclass(frozen=True, slots=True)
class Answer:
    """What ``run`` hands the scorer: the records (``None`` if the answer did not validate),
    the request's usage (``None`` then too) and the validation error's text."""

    records: list[dict[str, Any]] | None
    usage: Any = None
    error: str = ""


def _detail(score: ExtractScore, doc: Document, records: Any) -> dict[str, Any]:
    return {
        "field_precision": score.precision, "field_recall": score.recall,
        "field_f1": score.f1, "exact_match": score.exact_rate,
        "exact_records": score.exact_records, "right_fields": score.right_fields,
        "predicted_records": score.predicted_records, "truth_records": len(doc.records),
        "records": records,
    }  # fmt: skip


@dataclass(frozen=True)
class ExtractWorkload(Workload):
    """The split's documents (the first ``limit`` of the kinds named; kinds alternate, so a
    prefix covers them all) asked through ``Runtime.call`` and scored field by field."""

    split: str = "dev"
    limit: int | None = None
    kinds: tuple[str, ...] = tuple(KINDS)
    max_new_tokens: int = DEFAULTS.max_new_tokens
    count_hint: bool = True  # say how many records and bound the list to that many

    name: ClassVar[str] = "extract"
    title: ClassVar[str] = (
        "Long structured outputs (record extraction, runtime.call): exact documents and "
        "measured KV budget"
    )
    group_key: ClassVar[str] = "kind"
    groups: ClassVar[tuple[str, ...]] = tuple(KINDS)
    failed_detail: ClassVar[dict[str, Any]] = {
        "field_precision": 0.0, "field_recall": 0.0, "field_f1": 0.0, "exact_match": 0.0,
        "exact_records": 0, "right_fields": 0, "predicted_records": 0, "truth_records": 0,
        "records": None,
    }  # fmt: skip

    def cases(self) -> Sequence[Document]:
        for k in self.kinds:
            kind_of(k)
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be >= 1, got {self.limit}")
        docs = [d for d in load_split().partition(self.split) if d.kind in self.kinds]
        return docs[: self.limit] if self.limit else docs

    def group(self, doc: Document) -> str:
        return doc.kind

    def settings(self) -> dict[str, Any]:
        header = load_split().header
        return {**Workload.settings(self), "split_version": header["version"],
                "split_seed": header["seed"]}  # fmt: skip

    async def run(self, rt: Any, doc: Document, config: Config) -> Answer:
        try:
            count = len(doc.records) if self.count_hint else None
            prompt = extraction_prompt(doc, count_hint=self.count_hint)
            value, usage = await rt.call(
                kind_of(doc.kind).answer(count), prompt, policy=config.policy,
                budget=config.budget, max_new_tokens=self.max_new_tokens, with_usage=True,
            )  # fmt: skip
        except ValidationFailedError as exc:  # cut or malformed: scored 0, with the truth's size
            return Answer(None, None, f"{type(exc).__name__}: {str(exc)[:300]}")
        return Answer([r.model_dump() for r in value.records], usage)

    def score(self, doc: Document, answer: Answer) -> Scored:
        s = score_records(doc.records, answer.records, kind_of(doc.kind).fields)
        measured = Measured.of([answer.usage]) if answer.usage is not None else Measured.values()
        error = answer.error or (
            "" if s.perfect else f"field F1 {s.f1:.3f}, {s.exact_records}/{s.truth_records} "
            f"records exact, {s.predicted_records} predicted"
        )  # fmt: skip
        valid = answer.records is not None
        return Scored(s.perfect, valid, error, measured, _detail(s, doc, answer.records))

    def note(self, cases: int) -> str:
        return (
            f"{cases} generated documents (split {self.split!r} of "
            f"calibration_data/splits/extract.jsonl, kinds {', '.join(self.kinds)}), each "
            "answered by runtime.call(<Record>Records, prompt) (the document, then what to "
            "extract, then Runtime.call's field list), "
            + (
                "with the record count stated and the list bounded to it, "
                if self.count_hint
                else "as an open list (no count stated), "
            )
            + "greedy, "
            f"max_new_tokens={self.max_new_tokens}. Accuracy = documents whose every record "
            "is exact and none extra; field F1 = F1 of field-level precision and recall after "
            "greedy one-to-one record matching and normalisation (numbers as numbers, text "
            "case- and space-insensitive); exact-record rate = exact records / max(truth, "
            "predicted). An answer that does not validate scores 0. measured B = live KV "
            "bytes / Full-KV bytes at the end of each request (prompt + generated)."
        )

    def report(self, rows: Sequence[Row]) -> tuple[dict[str, Any], str]:
        scores = field_scores(rows)
        md = [
            "## Field-level scores (mean over documents)",
            "",
            "| configuration | documents | valid | field P | field R | field F1 | exact records "
            "| " + " | ".join(f"F1 {k}" for k in self.groups) + " |",
            "|---" * (7 + len(self.groups)) + "|",
        ]
        for label, s in scores.items():
            kinds = " | ".join(f"{s['f1_by_kind'].get(k, float('nan')):.3f}" for k in self.groups)
            md.append(
                f"| {label} | {s['documents']} | {s['valid']} | {s['precision']:.3f} | "
                f"{s['recall']:.3f} | {s['f1']:.3f} | {s['exact_match']:.3f} | {kinds} |"
            )
        paired = {ref: f1_against(rows, ref) for ref in ("full",)}
        md += ["", "## Field F1 against full on the same documents (paired bootstrap, 95%)", ""]
        md += ["| configuration | documents | mean ΔF1 | interval |", "|---|---|---|---|"]
        md += [
            f"| {n} | {d['documents']} | {d['mean_delta']:+.3f} | "
            f"[{d['low']:+.3f}, {d['high']:+.3f}] |"
            for n, d in paired["full"].items()
        ]
        return {"field_scores": scores, "f1_paired": paired}, "\n".join(md) + "\n"


def field_scores(rows: Sequence[Row]) -> dict[str, dict[str, Any]]:
    """Mean field P/R/F1 and exact-record rate per configuration, and F1 per kind."""
    out: dict[str, dict[str, Any]] = {}
    for s in summarize_rows(rows):
        mine = [r for r in rows if (r.config, r.budget) == (s.config, s.budget)]

        def mean(key: str, rs: Sequence[Row] = mine) -> float:
            return sum(float(r.detail.get(key, 0.0)) for r in rs) / len(rs)

        kinds = sorted({r.group for r in mine})
        out[s.label] = {
            "documents": len(mine), "valid": sum(r.valid_call for r in mine),
            "precision": mean("field_precision"), "recall": mean("field_recall"),
            "f1": mean("field_f1"), "exact_match": mean("exact_match"),
            "f1_by_kind": {k: mean("field_f1", [r for r in mine if r.group == k]) for k in kinds},
        }  # fmt: skip
    return out


def f1_against(
    rows: Sequence[Row], reference: str, *, resamples: int = 5000, seed: int = 0
) -> dict[str, dict[str, float]]:
    """Each configuration's mean field-F1 difference from ``reference`` over the documents
    both answered, with a seeded paired-bootstrap 95% interval."""
    ref = {r.id: float(r.detail.get("field_f1", 0.0)) for r in rows if r.label == reference}
    labels = dict.fromkeys(r.label for r in rows if r.label != reference)
    out: dict[str, dict[str, float]] = {}
    for label in labels:
        deltas = [float(r.detail.get("field_f1", 0.0)) - ref[r.id]
                  for r in rows if r.label == label and r.id in ref]  # fmt: skip
        if not deltas:
            continue
        rng = random.Random(seed)
        n = len(deltas)
        means = sorted(sum(rng.choices(deltas, k=n)) / n for _ in range(resamples))
        low, high = means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]
        out[label] = {"documents": n, "mean_delta": sum(deltas) / n, "low": low, "high": high}
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_shared(p, DEFAULTS)
    p.add_argument(
        "--limit", "--documents", dest="limit", type=int, default=None,
        help="the first N documents of the split (kinds alternate; default all)",
    )  # fmt: skip
    p.add_argument("--kinds", default=",".join(KINDS), help="comma-separated document kinds")
    p.add_argument(
        "--no-count", dest="count_hint", action="store_false",
        help="ask for an open list: no record count in the prompt or the schema (the default "
        "model then tends to write records until --max-new-tokens cuts the answer)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    workload = ExtractWorkload(
        args.split, args.limit, tuple(names(args.kinds)), args.max_new_tokens, args.count_hint
    )
    return run_eval(args, workload, module=__spec__.name)


def main(argv: list[str] | None = None) -> int:
    return main_of(add_arguments, run, "python -m pask_agent.eval.extract_eval", __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
