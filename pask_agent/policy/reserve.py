"""The decode reserve ``Γ(s; B_D)`` resolved to bytes for one request (paper §3.5, App. B.6, E.4).

Calibration stores ``Γ`` per parser state as the β-quantile of the K-step lookahead deficit
``S^(K)(B_D) = max_h [Σ_{j≤h} f_{u+j} − h·b]_+``, for a few decode budgets, in units of
``C_full``. A request runs at one budget, so the reserve is resolved once when its controller is
built: the deficit shrinks as ``B_D`` grows, and between calibrated budgets it is interpolated
linearly (clamped to the end rows outside them). States without their own quantile — and
untagged tokens — use the pooled quantile, as App. E.4 prescribes for unseen states.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pask_agent.policy.table_entries import Reserve


def _dec(value: float) -> Fraction:
    # Table numbers are decimals (0.33, 1.34): read them as written, not as binary floats.
    return Fraction(repr(float(value)))


@dataclass(frozen=True, slots=True)
class ReserveBytes:
    """Reserve in bytes per parser state for one decode budget.

    Attributes
    ----------
    by_state:
        ``Γ(s; B_D)`` in bytes for each calibrated state (read-only mapping).
    pooled:
        Reserve in bytes for states absent from ``by_state`` and for untagged tokens.
    """

    by_state: Mapping[str, Fraction]
    pooled: Fraction

    @classmethod
    def zero(cls) -> ReserveBytes:
        """No reserve at all (the all-high fallback controller of App. A.4 uses ``Γ = 0``)."""
        return cls(MappingProxyType({}), Fraction(0))

    @classmethod
    def resolve(
        cls, reserve: Reserve, *, budget: Fraction, full_bytes_per_token: int
    ) -> ReserveBytes:
        """Interpolate the table's rows at ``budget`` and convert ``C_full`` units to bytes."""
        rows = reserve.rows
        lo = hi = rows[0]
        weight = Fraction(0)
        if budget >= _dec(rows[-1].budget):
            lo = hi = rows[-1]
        elif budget > _dec(rows[0].budget):
            for left, right in zip(rows, rows[1:], strict=False):
                if _dec(left.budget) <= budget <= _dec(right.budget):
                    lo, hi = left, right
                    weight = (budget - _dec(left.budget)) / (_dec(right.budget) - _dec(left.budget))
                    break

        def mix(a: float, b: float) -> Fraction:
            return (_dec(a) + (_dec(b) - _dec(a)) * weight) * full_bytes_per_token

        states = set(lo.by_state) | set(hi.by_state)
        by_state = {
            s: mix(lo.by_state.get(s, lo.pooled), hi.by_state.get(s, hi.pooled))
            for s in sorted(states)
        }
        return cls(MappingProxyType(by_state), mix(lo.pooled, hi.pooled))

    def for_state(self, state: str | None) -> Fraction:
        """``Γ(state)`` in bytes; ``None`` (untagged) and unseen states get the pooled value."""
        if state is None:
            return self.pooled
        return self.by_state.get(state, self.pooled)
