"""Scoring an extraction: field-level precision, recall and F1, and the exact-record rate.

Why fields and not whole answers: a 60-record answer is almost never exact, so a right/wrong
verdict per document hides whether a KV policy lost one digit or half the table. Predicted
records are matched one-to-one to the truth by greedy maximum agreement (pairs sorted by how
many fields agree, ties in document order; a pair with no agreeing field is no match), which
neither rewards a duplicated record nor punishes a record written out of order. A field is
right when it equals the truth after normalisation: numbers as numbers (``"$84,500"`` ==
``84500``; prices within half a cent), text case- and space-insensitive, ``9:30`` == ``09:30``.

* precision = right fields / fields predicted, recall = right fields / fields in the truth;
* exact-record rate = records matched with every field right / max(truth, predicted records),
  so padding an answer with extra records lowers it;
* a malformed answer (``None``: no JSON, or not a ``records`` list of objects) scores 0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

_NUMBER = re.compile(r"^[-+]?\d[\d,]*(\.\d+)?$")
_TIME = re.compile(r"^(\d{1,2}):(\d{2})$")


@dataclass(frozen=True, slots=True)
class ExtractScore:
    """One answer's scores (all 0 for a malformed answer)."""

    precision: float
    recall: float
    f1: float
    exact_rate: float
    right_fields: int
    predicted_records: int
    truth_records: int
    exact_records: int

    @property
    def perfect(self) -> bool:
        """Every record right and none extra."""
        return self.exact_records == self.truth_records == self.predicted_records

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_answer(text: str) -> list[dict[str, Any]] | None:
    """The records of a raw answer ``{"records": [...]}`` (or a bare list); ``None`` when it is
    not JSON of that shape."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, dict):
        value = value.get("records")
    if not isinstance(value, list) or not all(isinstance(r, dict) for r in value):
        return None
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        text = value.strip().removeprefix("$").removesuffix("USD").strip()
        if _NUMBER.match(text):
            return float(text.replace(",", ""))
    return None


def _text(value: Any) -> str:
    text = " ".join(str(value).split()).casefold().rstrip(".")
    time = _TIME.match(text)
    return f"{int(time.group(1)):02d}:{time.group(2)}" if time else text


def field_equal(truth: Any, predicted: Any) -> bool:
    """Whether a predicted field value equals the truth after normalisation (the truth's type
    decides: a number is compared as a number, anything else as text)."""
    if predicted is None:
        return False
    if isinstance(truth, int | float) and not isinstance(truth, bool):
        got = _number(predicted)
        return got is not None and abs(got - float(truth)) < 0.005
    return _text(truth) == _text(predicted)


def match_records(
    truth: Sequence[Mapping[str, Any]],
    predicted: Sequence[Mapping[str, Any]],
    fields: Sequence[str],
) -> list[tuple[int, int, int]]:
    """One-to-one ``(truth index, predicted index, agreeing fields)`` pairs, greedy by
    agreement; pairs with no agreeing field are left out."""
    pairs = []
    for i, t in enumerate(truth):
        for j, p in enumerate(predicted):
            agree = sum(field_equal(t.get(f), p.get(f)) for f in fields)
            if agree:
                pairs.append((-agree, i, j))
    pairs.sort()
    used_t: set[int] = set()
    used_p: set[int] = set()
    out = []
    for neg, i, j in pairs:
        if i not in used_t and j not in used_p:
            used_t.add(i)
            used_p.add(j)
            out.append((i, j, -neg))
    return out


def score_records(
    truth: Sequence[Mapping[str, Any]],
    predicted: Sequence[Mapping[str, Any]] | None,
    fields: Sequence[str],
) -> ExtractScore:
    """Field-level P/R/F1 and the exact-record rate of ``predicted`` against ``truth``
    (``None``: a malformed answer, which scores 0)."""
    if predicted is None:
        return ExtractScore(0.0, 0.0, 0.0, 0.0, 0, 0, len(truth), 0)
    matches = match_records(truth, predicted, fields)
    right = sum(n for _, _, n in matches)
    exact = sum(n == len(fields) for _, _, n in matches)
    precision = right / (len(predicted) * len(fields)) if predicted else 0.0
    recall = right / (len(truth) * len(fields)) if truth else float(not predicted)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    most = max(len(truth), len(predicted))
    exact_rate = exact / most if most else 1.0
    return ExtractScore(precision, recall, f1, exact_rate, right, len(predicted), len(truth), exact)
