"""The values a policy table holds (paper App. A.4): per-bucket decode entries, per-label prompt
entries, the reserve, and the prompt plans for several budgets. ``table.py`` is the file around
them (validation across fields, checksum, load and save).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

NUM_GROUPS = 3
ActionName = Literal["H", "L", "R"]
UpMove = Literal["R->L", "L->H"]
DownMove = Literal["H->L", "L->R"]
UP_MOVES: tuple[str, ...] = ("R->L", "L->H")
DOWN_MOVES: tuple[str, ...] = ("H->L", "L->R")
MOVES: tuple[str, ...] = UP_MOVES + DOWN_MOVES
QUANTIZER = "int4-symmetric-rowwise-fp16-scale"


def tie_key(group: int, move: str) -> str:
    """Serialized name of one candidate move in the tie order, e.g. ``"2:L->H"``."""
    return f"{group}:{move}"


ALL_TIE_KEYS: frozenset[str] = frozenset(tie_key(c, m) for c in range(NUM_GROUPS) for m in MOVES)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class DecodeEntry(_Frozen):
    """One decode bucket × layer group: base action, floor and adjacent-move scores.

    ``upgrade`` holds the stored distortion-reduction score of each adjacent promotion (higher
    is promoted first); ``downgrade`` the score of each adjacent demotion (lower is demoted
    first). A missing ``downgrade`` mirrors ``upgrade``: demoting H→L loses what L→H gains.
    """

    base: ActionName
    floor: ActionName
    upgrade: dict[UpMove, float]
    downgrade: dict[DownMove, float]

    @model_validator(mode="before")
    @classmethod
    def _mirror_downgrade(cls, data: Any) -> Any:
        if (
            isinstance(data, dict)
            and "downgrade" not in data
            and isinstance(data.get("upgrade"), dict)
        ):
            up = data["upgrade"]
            data = {**data, "downgrade": {"H->L": up.get("L->H"), "L->R": up.get("R->L")}}
        return data

    @model_validator(mode="after")
    def _complete(self) -> DecodeEntry:
        if set(self.upgrade) != set(UP_MOVES) or set(self.downgrade) != set(DOWN_MOVES):
            raise ValueError("upgrade needs 'R->L' and 'L->H'; downgrade needs 'H->L' and 'L->R'")
        return self


class PrefillEntry(_Frozen):
    """One prefill bucket (span label × layer group): base, floor and upgrade priorities."""

    base: ActionName
    floor: ActionName
    priority: dict[UpMove, float]

    @model_validator(mode="after")
    def _complete(self) -> PrefillEntry:
        if set(self.priority) != set(UP_MOVES):
            raise ValueError("priority needs both 'R->L' and 'L->H'")
        return self


class ReserveRow(_Frozen):
    """``Γ(s; B_D)`` for one decode budget, in units of ``C_full`` (Full-KV bytes per token)."""

    budget: float = Field(ge=0.0, le=1.0)
    by_state: dict[str, float]
    pooled: float = Field(ge=0.0, description="quantile over all states; used for unseen ones")

    @model_validator(mode="after")
    def _non_negative(self) -> ReserveRow:
        bad = {s: v for s, v in self.by_state.items() if v < 0}
        if bad:
            raise ValueError(f"reserves must be >= 0, got {bad}")
        return self


class Reserve(_Frozen):
    """The reserve ``Γ(s; B_D) = Q_β(S^(K))`` per parser state (§3.5, App. B.6, E.4)."""

    beta: float = Field(gt=0.0, le=1.0)
    horizon: int = Field(ge=0)
    unit: Literal["c_full"] = "c_full"
    rows: list[ReserveRow] = Field(min_length=1)

    @model_validator(mode="after")
    def _sorted(self) -> Reserve:
        budgets = [row.budget for row in self.rows]
        if any(nxt <= cur for cur, nxt in zip(budgets, budgets[1:], strict=False)):
            raise ValueError(f"reserve rows must have strictly increasing budgets, got {budgets}")
        return self


class BudgetPlan(_Frozen):
    """The prompt side of a table for one total budget ``B``: the floors and priorities
    calibration selected at the ``B_P`` that ``B`` leaves the prompt. The decode side (buckets,
    ``B_D``, reserve) does not depend on ``B`` and is shared by every plan of a table."""

    budget_total: float = Field(gt=0.0, le=1.0)
    budget_prefill: float = Field(ge=0.0, le=1.0)
    prefill: dict[str, list[PrefillEntry]]
    prefill_default: list[PrefillEntry]
    choice: str = ""  # the prefill candidate calibration selected, for the record
