"""``position``: the paper's no-parser ablation (App. C.5) — position bins instead of tags.

The decode controller, ledger, reserve, floors, prefill planner and stage budgets are PASK's,
unchanged; only the decode lookup key differs. The ``t``-th generated token falls in one of
``bins`` request-local position bins, ``bin = min(bins − 1, ⌊bins · t / expected_tokens⌋)``
(the last bin absorbs the tail), and the bin is the bucket key. The parser still enforces
legality but no longer informs KV actions. The per-bin base actions and floors are hand-set
(the paper recalibrates them per variant; calibration is a separate issue): the first bins,
where a call names its function, start ``H`` with an ``L`` floor, the middle ones keep ``L``,
and the tail may be released.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pask_agent.errors import ConfigError
from pask_agent.grammars.tags import Tag
from pask_agent.policy.base import Actions, Policy, PolicyEnv
from pask_agent.policy.controller import DEFAULT_KEY, DecodeLookup, compile_bucket
from pask_agent.policy.pask import PaskPolicy, PaskSession, session_parts
from pask_agent.policy.registry import register_policy
from pask_agent.policy.table import PolicyTable
from pask_agent.policy.table_entries import DecodeEntry

_GROUP_WEIGHT = (1.0, 0.9, 0.8)


def bin_rule(k: int, bins: int) -> tuple[str, str]:
    """Hand-set ``(base, floor)`` of bin ``k``: early H, middle L, tail releasable."""
    if k < max(1, bins // 5):
        return "H", "L"
    if k < bins // 2:
        return "L", "L"
    return "L", "R"


def position_lookup(table: PolicyTable, bins: int) -> DecodeLookup:
    """A decode lookup keyed ``bin0`` … ``bin{bins-1}`` with the table's tie order."""
    tie_rank = {name: i for i, name in enumerate(table.tie_order)}
    by_key = {}
    for k in range(bins):
        base, floor = bin_rule(k, bins)
        decay = 1.0 - 0.5 * k / bins  # earlier bins win promotions, lose demotions last
        up = [{"R->L": w * decay, "L->H": 0.5 * w * decay} for w in _GROUP_WEIGHT]
        entries = [DecodeEntry(base=base, floor=floor, upgrade=u) for u in up]  # type: ignore[arg-type]
        by_key[f"bin{k}"] = compile_bucket(f"bin{k}", entries, tie_rank)
    default = compile_bucket(DEFAULT_KEY, table.decode_default, tie_rank)
    return DecodeLookup(MappingProxyType({}), MappingProxyType(by_key), default)


@dataclass
class PositionSession(PaskSession):
    bins: int = 10
    expected_tokens: int = 40
    generated: int = 0

    def on_token(self, tag: Tag | None, *, is_stop: bool = False) -> Actions:
        if is_stop:
            return self.controller.on_token(None, is_stop=True).actions  # type: ignore[return-value]
        k = min(self.bins - 1, self.generated * self.bins // self.expected_tokens)
        self.generated += 1
        decision = self.controller.on_token(Tag(f"bin{k}", "", "", ""))
        return decision.actions  # type: ignore[return-value]


@register_policy("position")
@dataclass(frozen=True)
class PositionPolicy(Policy):
    """PASK's controller over request-local position bins (the no-parser ablation).

    Parameters
    ----------
    bins:
        Number of contiguous position bins (the paper uses ten).
    expected_tokens:
        Completion length the bins span; later tokens fall in the last bin. The default is
        the mean Full-KV completion length of the default model on the BFCL dev split.
    table:
        Table for the prefill side, reserve and window (the shipped default if None).
    """

    bins: int = 10
    expected_tokens: int = 40
    table: PolicyTable | None = None
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    name = "position"
    needs_labels = True
    stores_int4 = True

    def __post_init__(self) -> None:
        if self.bins < 1 or self.expected_tokens < 1:
            raise ConfigError(
                f"bins and expected_tokens must be >= 1, got {self.bins}, {self.expected_tokens}"
            )

    def start(self, env: PolicyEnv) -> PositionSession:
        if "table" not in self._cache:
            self._cache["table"] = PaskPolicy(self.table).resolved_table()
            self._cache["lookup"] = position_lookup(self._cache["table"], self.bins)
        parts = session_parts(self._cache["table"], env, self._cache["lookup"])
        return PositionSession(
            **parts,
            bins=self.bins,
            expected_tokens=self.expected_tokens,
        )
