"""The frozen policy table: a versioned, checksummed JSON file (paper §3.4, App. A.2, A.4).

Calibration writes one table per model; serving only reads it. The file records everything
needed to reproduce a controller (App. A.4): the model and tokenizer it was calibrated for, the
layer groups and payload conventions, the tag vocabularies, per-bucket base actions, protection
floors and adjacent-move scores for decode (tag key × layer group) and prefill (span label ×
layer group), fallback maps, the tie order, the reserve ``Γ(s; B_D)`` with ``β`` and ``K``, the
stage budgets, sink and window sizes and the selection tolerances ``α``.

Keys of ``decode`` are fallback keys of :meth:`pask_agent.grammars.tags.Tag.parents`:
``"cls/role/state/next"``, ``"cls/role/state"``, ``"cls/role"`` or ``"cls"``. Every bucket holds
one entry per layer group (lower, middle, upper).

The ``checksum`` field is the SHA-256 of the canonical JSON body (all other fields, keys sorted,
no whitespace), so a torn write or a hand edit is caught on load.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from pask_agent.errors import PolicyTableError
from pask_agent.grammars.tags import SPAN_LABELS, VOCABULARIES, TagFamily
from pask_agent.policy.actions import LayerGroups
from pask_agent.policy.table_entries import (
    ALL_TIE_KEYS,
    NUM_GROUPS,
    QUANTIZER,
    BudgetPlan,
    DecodeEntry,
    PrefillEntry,
    Reserve,
    _Frozen,
)

SCHEMA_VERSION = 1

# Labels added after tables were calibrated, planned by a label a table of that time has: a
# SQL table the question never mentions is planned like sample rows (illustration the query
# does not copy), not like the protected content of ``prefill_default``.
LATER_LABEL_FALLBACK: dict[str, str] = {"unlinked_schema": "schema_description"}


class PolicyTable(_Frozen):
    """A frozen PASK policy (schema version 1). Load with :meth:`load`, write with :meth:`save`."""

    schema_version: Literal[1] = SCHEMA_VERSION
    source: str = Field(min_length=1, description="'hand-written' or 'calibrated'")
    model_id: str = Field(min_length=1)
    tokenizer_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    num_layers: int = Field(ge=3)
    layer_boundaries: tuple[int, int]
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    quantizer: Literal["int4-symmetric-rowwise-fp16-scale"] = QUANTIZER
    families: list[TagFamily] = Field(min_length=1)
    vocabularies: dict[str, dict[str, list[str]]]
    span_labels: list[str]
    decode: dict[str, list[DecodeEntry]]
    decode_default: list[DecodeEntry]
    decode_fallback: dict[str, str] = {}
    prefill: dict[str, list[PrefillEntry]]
    prefill_default: list[PrefillEntry]
    prefill_fallback: dict[str, str] = {}
    tie_order: list[str]
    reserve: Reserve
    budget_decode: float = Field(ge=0.0, le=1.0)
    budget_prefill: float = Field(ge=0.0, le=1.0)
    sink_tokens: int = Field(ge=0)
    window_tokens: int = Field(ge=0)
    alpha_decode: float = Field(ge=0.0)
    alpha_prefill: float = Field(ge=0.0)
    # Optional (absent from hand-written tables; None fields are left out of the file and the
    # checksum, so older tables still verify):
    # the total budget B the stage budgets were chosen for,
    budget_total: float | None = Field(default=None, gt=0.0, le=1.0)
    # how many tokens an answer has on the development traces (sizes the prompt's share of B),
    expected_output_tokens: float | None = Field(default=None, ge=0.0)
    # and how the table was made: command, trace files with hashes, wall time, CPUs, commit.
    calibration: dict[str, Any] | None = None
    # one prompt plan per calibrated total budget, increasing (``pask-agent calibrate --budget
    # 0.1,0.2,0.33``); None: the top-level prefill fields are the only plan
    plans: list[BudgetPlan] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> PolicyTable:
        groups = LayerGroups.for_layers(self.num_layers)
        if tuple(self.layer_boundaries) != (groups.b1, groups.b2):
            raise ValueError(
                f"layer_boundaries {list(self.layer_boundaries)} do not match App. A.2 for "
                f"{self.num_layers} layers: expected [{groups.b1}, {groups.b2}]"
            )
        for family in self.families:
            expected = {k: list(v) for k, v in VOCABULARIES[family].items()}
            if self.vocabularies.get(family) != expected:
                raise ValueError(
                    f"vocabularies[{family!r}] differs from the tagger's vocabulary {expected}; "
                    "the table was calibrated for another tag vocabulary: recalibrate"
                )
        known = list(SPAN_LABELS)
        if not self.span_labels or list(self.span_labels) != known[: len(self.span_labels)]:
            # a prefix: a table from before the later labels, which plan by prefill_default
            raise ValueError(f"span_labels must be (a prefix of) {known}, got {self.span_labels}")
        for key, entries in self.decode.items():
            self._check_key(key)
            _check_groups(f"decode[{key!r}]", entries)
        _check_groups("decode_default", self.decode_default)
        for key, target in self.decode_fallback.items():
            self._check_key(key)
            if target not in self.decode:
                raise ValueError(f"decode_fallback[{key!r}] -> {target!r}: no such decode bucket")
        for where, plan in [
            ("", self),
            *((f"plans[{p.budget_total}].", p) for p in self.plans or ()),
        ]:
            for label, pentries in plan.prefill.items():
                if label not in SPAN_LABELS:
                    raise ValueError(f"{where}prefill label {label!r} is not a span label")
                _check_groups(f"{where}prefill[{label!r}]", pentries)
            _check_groups(f"{where}prefill_default", plan.prefill_default)
        budgets = [plan.budget_total for plan in self.plans or ()]
        if budgets != sorted(set(budgets)):
            raise ValueError(f"plans must have strictly increasing budgets, got {budgets}")
        for label, target in self.prefill_fallback.items():
            if label not in SPAN_LABELS or target not in self.prefill:
                raise ValueError(f"prefill_fallback[{label!r}] -> {target!r}: unknown label")
        if len(self.tie_order) != len(ALL_TIE_KEYS) or set(self.tie_order) != ALL_TIE_KEYS:
            raise ValueError(f"tie_order must list each of {sorted(ALL_TIE_KEYS)} exactly once")
        states = {s for f in self.families for s in VOCABULARIES[f]["state"]}
        for row in self.reserve.rows:
            unknown = set(row.by_state) - states
            if unknown:
                raise ValueError(f"reserve row B_D={row.budget}: unknown states {sorted(unknown)}")
        return self

    def _check_key(self, key: str) -> None:
        parts = key.split("/")
        fields = ("cls", "role", "state", "next")
        ok = 1 <= len(parts) <= 4 and any(
            all(p in VOCABULARIES[f][fields[i]] for i, p in enumerate(parts)) for f in self.families
        )
        if not ok:
            raise ValueError(
                f"decode key {key!r} is not 'cls[/role[/state[/next]]]' in the vocabularies of "
                f"{self.families}"
            )

    def decode_measured(self, family: str) -> bool:
        """Whether calibration measured any of ``family``'s decode buckets (a key whose role
        belongs to the family and is not in ``calibration.carried_over``). A hand-written
        table, or a family carried over from the prior, was never measured."""
        if self.source != "calibrated" or family not in self.families:
            return False
        roles = set(VOCABULARIES[family]["role"])
        carried = set((self.calibration or {}).get("carried_over", ()))
        return any(
            len(parts := key.split("/")) > 1 and parts[1] in roles and key not in carried
            for key in self.decode
        )

    def prefill_entries(self, label: str) -> list[PrefillEntry]:
        """The per-group prompt rule for ``label``: its own entries, else the table's
        ``prefill_fallback``, else ``LATER_LABEL_FALLBACK`` (a label newer than the table),
        else ``prefill_default``."""
        entries = self.prefill.get(label)
        for fallback in (self.prefill_fallback, LATER_LABEL_FALLBACK):
            if entries is None and fallback.get(label) in self.prefill:
                entries = self.prefill[fallback[label]]
        return entries or self.prefill_default

    def at_budget(self, budget: float) -> PolicyTable:
        """This table with the prompt plan that serves total budget ``budget``: the plan
        calibrated for it, else the next stricter one (a plan made for less memory never plans
        more than asked). A table without plans serves every budget with its one plan.

        Raises
        ------
        PolicyTableError
            The table has plans, none at or below ``budget``.
        """
        if not self.plans:
            return self
        fitting = [p for p in self.plans if p.budget_total <= budget + 1e-9]
        if not fitting:
            raise PolicyTableError(
                f"no plan for budget {budget:g}: this table has plans for "
                f"{[p.budget_total for p in self.plans]} and none stricter; ask for one of "
                "them or above, or calibrate with this budget (pask-agent calibrate --budget)"
            )
        plan = fitting[-1]
        return self.model_copy(
            update={
                "prefill": plan.prefill,
                "prefill_default": plan.prefill_default,
                "budget_prefill": plan.budget_prefill,
                "budget_total": plan.budget_total,
            }
        )

    # ------------------------------------------------------------------ files

    def body(self) -> dict[str, Any]:
        """The JSON body without the checksum (unset optional fields left out)."""
        return self.model_dump(mode="json", exclude_none=True)

    def checksum(self) -> str:
        """SHA-256 of the canonical body (sorted keys, no whitespace)."""
        canonical = json.dumps(self.body(), sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def to_json(self) -> str:
        """The file text: the body in field order plus ``checksum``, innermost values inline."""
        return _format({**self.body(), "checksum": self.checksum()}, depth=0) + "\n"

    def save(self, path: str | Path) -> None:
        """Write the table; ``load`` of the result gives an equal table and the same text."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(self.to_json(), encoding="utf-8")
        tmp.replace(target)  # atomic: a reader never sees half a table

    @classmethod
    def from_json(cls, text: str, *, origin: str = "<string>") -> PolicyTable:
        """Parse and validate table text (no model check); see :meth:`load`."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PolicyTableError(
                f"{origin}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
                "the file is truncated or corrupt: restore it or rerun calibration"
            ) from exc
        if not isinstance(raw, dict):
            raise PolicyTableError(f"{origin}: expected a JSON object, got {type(raw).__name__}")
        stored = raw.pop("checksum", None)
        if not isinstance(stored, str):
            raise PolicyTableError(
                f"{origin}: missing 'checksum' field; write tables with PolicyTable.save()"
            )
        if raw.get("schema_version") != SCHEMA_VERSION:
            raise PolicyTableError(
                f"{origin}: schema_version {raw.get('schema_version')!r} is not supported "
                f"(this pask-agent reads version {SCHEMA_VERSION}); recalibrate the table"
            )
        try:
            table = cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
                for err in exc.errors()[:5]
            )
            raise PolicyTableError(
                f"{origin}: schema violation ({exc.error_count()} problem(s)): {problems}; "
                "fix the file or rerun calibration"
            ) from exc
        actual = table.checksum()
        if actual != stored:
            raise PolicyTableError(
                f"{origin}: checksum mismatch (file says {stored[:12]}…, content hashes to "
                f"{actual[:12]}…): the file was edited or corrupted; restore it, or re-save it "
                "with PolicyTable.save() if the edit was intended"
            )
        return table

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        model_id: str,
        tokenizer_hash: str,
        allow_transfer: bool = False,
    ) -> PolicyTable:
        """Load and check a table for the model that will use it.

        Raises
        ------
        PolicyTableError
            Unreadable file, bad JSON, schema violation, checksum mismatch, or a table made for
            another model or tokenizer while ``allow_transfer`` is False.
        """
        table = cls.read(path)
        if not allow_transfer:
            table.check_model(model_id=model_id, tokenizer_hash=tokenizer_hash, origin=str(path))
        return table

    @classmethod
    def read(cls, path: str | Path) -> PolicyTable:
        """Read and validate a table file without the model check (see :meth:`load`).

        Raises
        ------
        PolicyTableError
            Unreadable file, bad JSON, schema violation or checksum mismatch.
        """
        source = Path(path)
        try:
            text = source.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyTableError(f"{source}: cannot read policy table ({exc})") from exc
        table = cls.from_json(text, origin=str(source))
        return table

    def check_model(self, *, model_id: str, tokenizer_hash: str, origin: str = "table") -> None:
        """Refuse to serve a model or tokenizer this table was not calibrated for.

        Raises
        ------
        PolicyTableError
            ``model_id`` or ``tokenizer_hash`` differs from the table's.
        """
        if self.model_id != model_id or self.tokenizer_hash != tokenizer_hash:
            raise PolicyTableError(
                f"{origin}: table was calibrated for model {self.model_id!r} (tokenizer "
                f"{self.tokenizer_hash[:12]}…), not {model_id!r} (tokenizer "
                f"{tokenizer_hash[:12]}…); calibrate for this model, or pass allow_transfer=True "
                "to reuse it on purpose (paper §4.5)"
            )


def _check_groups(where: str, entries: list[Any]) -> None:
    if len(entries) != NUM_GROUPS:
        raise ValueError(f"{where} needs {NUM_GROUPS} entries (one per layer group)")


def _format(value: Any, *, depth: int) -> str:
    # Two levels of indentation, then compact: one bucket per line keeps diffs readable.
    if depth >= 2 or not isinstance(value, dict) or not value:
        return json.dumps(value, separators=(", ", ": "), allow_nan=False)
    pad = " " * (depth + 1)
    items = [f"{pad}{json.dumps(k)}: {_format(v, depth=depth + 1)}" for k, v in value.items()]
    return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}"
