"""The hand-written PASK table: the prior calibration starts from, and a documented fixture.

PASK served this table before calibration existed. The shipped default is now the calibrated
table (``calibration_data/policies/default.json``, written by ``pask-agent calibrate``); this
one stays at ``calibration_data/policies/default.hand-written.json`` as the baseline policy
``pask_hand`` and for tests, and calibration keeps its entries for buckets it has no traces
for (the SQL family). The choices follow the paper's intuition rather than measurements
(``source: "hand-written"``):

- decode: tokens that choose *what* is called — dispatch keys, required arguments, tokens in a
  critical parser state and tokens right before a critical one (``lookahead_critical``) — get an
  ``H`` floor in every layer group. SQL schema identifiers (relations, projections) start at
  ``H``. Every other generated token — optional arguments, free text, pure scaffold
  (separators, quotes, braces) — is held at ``L`` and never released: on the BFCL dev split
  (5 parallel cases, B = 0.33), releasing generated scaffold made the model lose count of the
  calls it had already written and repeat them until the token limit in 4 of 5 cases, while
  keeping it at ``L`` gave 5 of 5 valid arrays at a measured B of 0.339. The budget guard
  makes up the difference on the prompt side;
- prefill: function names, parameter keys and enum constraints are planned ``H`` with an ``H``
  floor in the lower layer group and an ``L`` floor above it, type constraints keep ``L``;
  descriptions and scaffold may be released; instructions and the request
  (``protected_content``) keep at least ``L`` and have the highest upgrade priority. With ``H``
  floors in every group, a prompt that is mostly names cannot meet its budget: SQL schemas
  (tables and columns) at B = 0.33 measured B = 0.47 on the sample test split;
- the scores are placeholders ordered by those intuitions (R→L ranks above L→H, lower layer
  groups slightly above upper ones); the reserve assumes runs of 3/2/1 fully protected tokens
  after critical/boundary/stable states: ``Γ(s; B_D) = k_s · (1 − B_D)`` in units of ``C_full``;
- prose (the ``text`` class: what an assistant writes before a call or instead of one, a
  vocabulary the paper leaves to future work) is held at ``L`` like every generated token;
  a sentence's body and its boundaries (``. ! ? ; :`` and line breaks, where the model decides
  what comes next) are separate buckets so that calibration can tell them apart. Calibration
  has no prose traces yet, so the calibrated table carries these entries over and names them
  in ``calibration.carried_over``.

Regenerate the committed fixture with ``python -m pask_agent.policy.default_table``.
"""

from __future__ import annotations

from pask_agent.grammars.tags import CLASSES, NEXTS, SPAN_LABELS, VOCABULARIES, TagFamily
from pask_agent.package_data import policy_table_path
from pask_agent.policy.actions import LayerGroups
from pask_agent.policy.table import PolicyTable
from pask_agent.policy.table_entries import (
    NUM_GROUPS,
    DecodeEntry,
    PrefillEntry,
    Reserve,
    ReserveRow,
    tie_key,
)

DEFAULT_MODEL_ID = "Qwen2.5-Coder-0.5B-Instruct"
# sha256 of tokenizer.json in the converted cache folder of the bundled default model
# (`tokenizer_hash(resolve_model_dir("default"))`; a slow test re-checks it).
DEFAULT_TOKENIZER_SHA256 = "870929f6937e07fc88e0bc62333a39c5fe97bcbea944ea9d3a6ffcf760ef360d"
# calibration_data/policies/default.json, in a checkout and in a wheel (package data): the
# calibrated table PASK serves by default; and the hand-written fixture next to it.
DEFAULT_TABLE_PATH = policy_table_path("default")
HAND_WRITTEN_TABLE_PATH = policy_table_path("default.hand-written")

_GROUP_WEIGHT = (1.0, 0.9, 0.8)
_CLASS_WEIGHT = {"schema_bearing": 1.0, "free_generation": 0.6, "text": 0.4, "pure_scaffold": 0.2}
_RESERVE_RUN = {"critical": 3.0, "boundary": 2.0, "stable": 1.0}
_RESERVE_POOLED_RUN = 2.0
_RESERVE_BUDGETS = (0.25, 0.33, 0.5, 0.75, 1.0)

# Per role: (base, floor) per layer group. Roles absent here inherit their class entry.
_PROTECT = (("H", "H"),) * 3
_KEEP_LOW = (("L", "L"),) * 3  # generated tokens are never released (see the module doc)
_ROLE_RULES: dict[str, tuple[tuple[str, str], ...]] = {
    "dispatch_key": _PROTECT,
    "required": _PROTECT,
    "optional": _KEEP_LOW,
    "scaffold_separator": _KEEP_LOW,
    "relation": (("H", "L"),) * 3,
    "projection": (("H", "L"),) * 3,
    "predicate": _KEEP_LOW,
    "outside_schema": _KEEP_LOW,
    "text_body": _KEEP_LOW,
    "text_boundary": _KEEP_LOW,
}
_CLASS_RULES: dict[str, tuple[tuple[str, str], ...]] = {
    "schema_bearing": _KEEP_LOW,
    "free_generation": _KEEP_LOW,
    "pure_scaffold": _KEEP_LOW,
    "text": _KEEP_LOW,
}
_DEFAULT_DECODE = _KEEP_LOW

# Prefill: label -> ((base, floor) per group, (R->L, L->H) priority before group weighting).
# Names are planned high; only the lower layer group's H is a floor (see the module doc).
_NAME_FLOORS = (("H", "H"), ("H", "L"), ("H", "L"))
_PREFILL_RULES: dict[str, tuple[tuple[tuple[str, str], ...], tuple[float, float]]] = {
    "protected_content": ((("L", "L"),) * 3, (3.0, 1.5)),
    "schema_scaffold": ((("L", "R"), ("R", "R"), ("R", "R")), (0.5, 0.1)),
    "function_name": (_NAME_FLOORS, (3.0, 2.0)),
    "parameter_key": (_NAME_FLOORS, (3.0, 2.0)),
    "type_constraint": ((("L", "L"),) * 3, (1.5, 0.8)),
    "enum_constraint": (_NAME_FLOORS, (3.0, 2.0)),
    "schema_description": ((("L", "R"),) * 3, (1.0, 0.3)),
    # the chat template's own text (role markers, tool preamble, format instructions): the
    # grammar enforces what it says, so it goes first (grammars/chat_spans.py)
    "template_text": ((("R", "R"),) * 3, (0.2, 0.05)),
    # a SQL table the question never mentions (grammars/sql/span_labels.py): kept at INT4 while
    # the budget allows, released before anything else when it does not
    "unlinked_schema": ((("L", "L"),) * 3, (0.1, 0.02)),
}
_DEFAULT_TIE_ORDER = (
    [tie_key(c, "R->L") for c in range(NUM_GROUPS)]
    + [tie_key(c, "L->H") for c in range(NUM_GROUPS)]
    + [tie_key(c, "H->L") for c in reversed(range(NUM_GROUPS))]
    + [tie_key(c, "L->R") for c in reversed(range(NUM_GROUPS))]
)


def _decode_entries(rules: tuple[tuple[str, str], ...], weight: float) -> list[DecodeEntry]:
    out = []
    for c, (base, floor) in enumerate(rules):
        w = round(weight * _GROUP_WEIGHT[c], 6)
        up = {"R->L": round(2 * w, 6), "L->H": w}
        down = {"H->L": up["L->H"], "L->R": up["R->L"]}
        out.append(DecodeEntry(base=base, floor=floor, upgrade=up, downgrade=down))
    return out


def _role_rule(cls: str, role: str) -> tuple[tuple[str, str], ...]:
    # Quotes, colons and braces around a required key are scaffold: they keep the scaffold rule
    # unless the parser marks them critical or lookahead-critical.
    if cls == "pure_scaffold" and role != "scaffold_separator":
        return _CLASS_RULES[cls]
    return _ROLE_RULES[role]


def _decode_buckets(families: tuple[TagFamily, ...]) -> dict[str, list[DecodeEntry]]:
    buckets: dict[str, list[DecodeEntry]] = {}
    for cls in CLASSES:
        buckets[cls] = _decode_entries(_CLASS_RULES[cls], _CLASS_WEIGHT[cls])
    for family in families:
        vocab = VOCABULARIES[family]
        for cls in CLASSES:
            weight = _CLASS_WEIGHT[cls]
            for role in vocab["role"]:
                buckets[f"{cls}/{role}"] = _decode_entries(_role_rule(cls, role), weight)
                if "critical" in vocab["state"]:
                    buckets[f"{cls}/{role}/critical"] = _decode_entries(_PROTECT, weight)
                for state in vocab["state"]:
                    key = f"{cls}/{role}/{state}/{NEXTS[0]}"  # lookahead_critical
                    buckets[key] = _decode_entries(_PROTECT, weight)
    return buckets


def _reserve(families: tuple[TagFamily, ...]) -> Reserve:
    states = sorted({s for f in families for s in VOCABULARIES[f]["state"]})
    rows = [
        ReserveRow(
            budget=b,
            by_state={s: round(_RESERVE_RUN[s] * (1 - b), 6) for s in states},
            pooled=round(_RESERVE_POOLED_RUN * (1 - b), 6),
        )
        for b in _RESERVE_BUDGETS
    ]
    return Reserve(beta=0.8, horizon=8, rows=rows)


def build_default_table(
    *,
    model_id: str = DEFAULT_MODEL_ID,
    tokenizer_hash: str = DEFAULT_TOKENIZER_SHA256,
    num_layers: int = 24,
    num_kv_heads: int = 2,
    head_dim: int = 64,
    families: tuple[TagFamily, ...] = ("function_calling", "sql"),
    budget_decode: float = 0.33,
    budget_prefill: float = 0.33,
    sink_tokens: int = 4,
    window_tokens: int = 16,
) -> PolicyTable:
    """The hand-written table; defaults describe Qwen2.5-Coder-0.5B-Instruct (24 layers, GQA-2).

    Other models can reuse the same intuitions by passing their id, tokenizer hash and dims.
    """
    groups = LayerGroups.for_layers(num_layers)
    prefill = {}
    for label in SPAN_LABELS:
        rules, (rl, lh) = _PREFILL_RULES[label]
        prefill[label] = [
            PrefillEntry(
                base=base,
                floor=floor,
                priority={
                    "R->L": round(rl * _GROUP_WEIGHT[c], 6),
                    "L->H": round(lh * _GROUP_WEIGHT[c], 6),
                },
            )
            for c, (base, floor) in enumerate(rules)
        ]
    return PolicyTable(
        source="hand-written",
        model_id=model_id,
        tokenizer_hash=tokenizer_hash,
        num_layers=num_layers,
        layer_boundaries=(groups.b1, groups.b2),
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        families=list(families),
        vocabularies={f: {k: list(v) for k, v in VOCABULARIES[f].items()} for f in families},
        span_labels=list(SPAN_LABELS),
        decode=_decode_buckets(families),
        decode_default=_decode_entries(_DEFAULT_DECODE, 0.5),
        prefill=prefill,
        prefill_default=prefill["protected_content"],
        tie_order=list(_DEFAULT_TIE_ORDER),
        reserve=_reserve(families),
        budget_decode=budget_decode,
        budget_prefill=budget_prefill,
        sink_tokens=sink_tokens,
        window_tokens=window_tokens,
        alpha_decode=0.01,
        alpha_prefill=0.01,
    )


if __name__ == "__main__":
    build_default_table().save(HAND_WRITTEN_TABLE_PATH)
    print(f"wrote {HAND_WRITTEN_TABLE_PATH}")
