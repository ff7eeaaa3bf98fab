"""Write the selected candidate as a frozen ``PolicyTable``, and the App. D.7 mismatch check.

Calibration on tool-calling traces measures the function-calling buckets and the prompt
labels. Buckets it has no traces for (the SQL family's own roles and states, prose when the
traces hold only calls, labels that never occurred) keep the hand-written entries, and the
table's ``calibration.carried_over`` names every one of them, so nobody mistakes a prior for a
measurement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pask_agent.calibration.frontier import Candidate, Sensitivity
from pask_agent.calibration.teacher import H, L, R
from pask_agent.grammars.tags import SPAN_LABELS, VOCABULARIES
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.default_table import build_default_table
from pask_agent.policy.table import PolicyTable
from pask_agent.policy.table_entries import BudgetPlan, DecodeEntry, PrefillEntry, Reserve
from pask_agent.policy.tokenizer_hash import tokenizer_hash

if TYPE_CHECKING:
    from pask_agent.calibration.buckets import DecodeKeys
    from pask_agent.calibration.calibrate import CalibrationConfig

_NAMES = {H: "H", L: "L", R: "R"}


def _scaled(scores: np.ndarray) -> np.ndarray:
    top = float(np.abs(scores).max()) if scores.size else 0.0
    return np.round(scores / top, 6) if top > 0 else np.zeros_like(scores)


def _valid_in(key: str, family: str) -> bool:
    vocab = VOCABULARIES[family]
    fields = ("cls", "role", "state", "next")
    return all(p in vocab[fields[i]] for i, p in enumerate(key.split("/")))


@dataclass(frozen=True)
class PromptChoice:
    """The prompt candidate calibration selected for one total budget (None: no target ``B``,
    the level was chosen within ``α_P``): its floors and priorities, the mean ``B_P`` it was
    replayed at, and its name for the record."""

    budget_total: float | None
    budget_prefill: float
    floors: np.ndarray  # int8 [labels, 3]
    priority: np.ndarray  # [labels, 3, 2]
    name: str


def _prefill_entries(
    prefill: Sensitivity, choice: PromptChoice, prior: PolicyTable, carried: list[str]
) -> dict[str, list[PrefillEntry]]:
    pri = _scaled(choice.priority)
    out = {}
    for i, label in enumerate(SPAN_LABELS):
        if prefill.tokens[i] == 0:
            out[label] = prior.prefill[label]
            if f"prefill:{label}" not in carried:
                carried.append(f"prefill:{label}")
            continue
        out[label] = [
            PrefillEntry(
                base=_NAMES[int(choice.floors[i, c])],
                floor=_NAMES[int(choice.floors[i, c])],
                priority={"R->L": float(pri[i, c, 0]), "L->H": float(pri[i, c, 1])},
            )
            for c in range(3)
        ]
    return out


def assemble_table(
    *,
    model_name: str,
    tokenizer: Any,
    costs: PayloadCosts,
    dims: tuple[int, int, int],
    keys: DecodeKeys,
    decode: Sensitivity,
    chosen: Candidate,
    prefill: Sensitivity,
    prompt: Sequence[PromptChoice],
    reserve: Reserve,
    budget_decode: float,
    expected_output_tokens: float,
    config: CalibrationConfig,
    record: dict[str, Any],
) -> PolicyTable:
    """The table: decode buckets from the chosen decode candidate, the prompt plan of the
    loosest budget in ``prompt`` at the top level, and, when ``prompt`` holds several budgets,
    one plan per budget in ``plans`` (the runtime serves each request its budget's plan)."""
    from pask_agent.runtime.models.loading import ALIASES, BUNDLED

    bundled = BUNDLED.get(ALIASES.get(model_name, model_name))
    layers, kv_heads, head_dim = dims
    prior = build_default_table(
        model_id=bundled.model_id if bundled is not None else model_name,
        tokenizer_hash=tokenizer_hash(tokenizer),
        num_layers=layers,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        sink_tokens=config.sinks,
        window_tokens=config.window,
    )
    up = _scaled(decode.upgrade_scores(costs))
    entries = {}
    for b in range(keys.size):
        row = []
        for c in range(3):
            scores = {"R->L": float(up[b, c, 0]), "L->H": float(up[b, c, 1])}
            row.append(
                DecodeEntry(
                    base=_NAMES[int(chosen.actions[b, c])],
                    floor=_NAMES[int(chosen.floors[b, c])],
                    upgrade=scores,  # type: ignore[arg-type]
                    downgrade={"H->L": scores["L->H"], "L->R": scores["R->L"]},
                )
            )
        entries[keys.name(b)] = row
    default = entries.pop("<default>")
    # Buckets no trace measured keep the prior's entries (and are listed as carried over): the
    # SQL family's own roles and states, and every class no measured key belongs to (prose,
    # ``text``, when the traces hold only calls). Other unmeasured keys resolve to a measured
    # parent through the fallback chain, so they are not carried.
    measured_classes = {k.split("/")[0] for k in entries if k != "<default>"}
    carried = [
        k
        for k in prior.decode
        if k not in entries
        and (
            (_valid_in(k, "sql") and not _valid_in(k, "function_calling"))
            or k.split("/")[0] not in measured_classes
        )
    ]
    decode_table = {**{k: prior.decode[k] for k in carried}, **entries}
    if decode.tokens[-1] == 0:  # no untagged token was seen: keep untagged tokens high
        default = [
            DecodeEntry(
                base="H",
                floor="H",
                upgrade={"R->L": 0.0, "L->H": 0.0},
                downgrade={"H->L": 0.0, "L->R": 0.0},
            )  # fmt: skip
        ] * 3
    per_budget = [(c, _prefill_entries(prefill, c, prior, carried)) for c in prompt]
    top, prefill_table = per_budget[-1]
    plans = [
        BudgetPlan(
            budget_total=c.budget_total,
            budget_prefill=round(c.budget_prefill, 4),
            prefill=entries,
            prefill_default=entries["protected_content"],
            choice=c.name,
        ).model_dump()
        for c, entries in per_budget
        if len(per_budget) > 1 and c.budget_total is not None
    ]
    return PolicyTable.model_validate(
        {
            **prior.model_dump(),
            "source": "calibrated",
            "decode": {k: [e.model_dump() for e in v] for k, v in decode_table.items()},
            "decode_default": [e.model_dump() for e in default],
            "decode_fallback": {},
            "prefill": {k: [e.model_dump() for e in v] for k, v in prefill_table.items()},
            "prefill_default": [e.model_dump() for e in prefill_table["protected_content"]],
            "reserve": reserve.model_dump(),
            "budget_decode": budget_decode,
            "budget_prefill": round(top.budget_prefill, 4),
            "alpha_decode": config.alpha_decode,
            "alpha_prefill": config.alpha_prefill,
            "budget_total": top.budget_total,
            "expected_output_tokens": expected_output_tokens,
            "plans": plans or None,
            "calibration": {
                **record,
                "selected": {
                    "decode": chosen.name,
                    "prefill": top.name,
                    "prefill_budget": round(top.budget_prefill, 4),
                },
                "carried_over": carried,
            },
        }
    )


def mismatch_report(s: Sensitivity) -> dict[str, Any]:
    """App. D.7: do the most task-sensitive buckets have the most distortion?

    Per action, over buckets that occurred: ``T`` = top 20 % by V̄ (only buckets with
    V̄ > 0), ``recall@20`` = share of ``T`` also in the top 20 % by D, ``mismatch_20_50`` =
    share of ``T`` in the bottom half by D.
    """
    out: dict[str, Any] = {}
    seen = np.repeat(s.tokens > 0, 3)
    for name, a in (("R", R), ("L", L)):
        v = s.v[..., a].reshape(-1)[seen]
        d = s.d[..., a].reshape(-1)[seen]
        n = len(v)
        k = max(1, int(round(0.2 * n)))
        positive = np.nonzero(v > 0)[0]
        top_v = positive[np.argsort(-v[positive], kind="stable")][:k]
        order_d = np.argsort(-d, kind="stable")
        top_d = set(order_d[:k].tolist())
        bottom_half = set(order_d[n - n // 2 :].tolist())
        out[name] = {
            "buckets": n,
            "sensitive": len(top_v),
            "recall_at_20": round(len(set(top_v.tolist()) & top_d) / len(top_v), 4)
            if len(top_v)
            else None,
            "mismatch_20_50": round(len(set(top_v.tolist()) & bottom_half) / len(top_v), 4)
            if len(top_v)
            else None,
        }
    return out
