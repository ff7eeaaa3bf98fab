"""The decode budget ledger ``R_t`` (paper App. B.6, B.7).

Each generated token with KV earns an allowance ``b = B_D · C_full`` bytes and is charged the
payload of its scheduled actions ``M(a_t)``. Before deciding token ``t`` (1-based) the balance is

    R_t = t · b − Σ_{i<t} M(a_i).

The ledger keeps exact arithmetic: ``b`` is a :class:`fractions.Fraction` (a float budget is
read as the decimal it prints as, so ``0.33`` means ``33/100``), the token count and the charged
bytes are integers, and ``R_t`` is recomputed from them instead of being accumulated, so no
rounding ever builds up. Charges above the balance (floors that cost more than the allowance)
leave ``R_t`` negative: that debt carries forward and later tokens pay it back.

The ledger is an immutable value. Snapshotting is keeping a reference; restoring is using the
old value again — which is what rollback for speculative or jump-forward decoding needs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from pask_agent.errors import ConfigError


def as_fraction(value: float | int | Fraction | str, *, name: str) -> Fraction:
    """Read a budget exactly: floats by their shortest decimal repr (0.33 → 33/100)."""
    try:
        if isinstance(value, float):
            return Fraction(repr(value))
        return Fraction(value)
    except (ValueError, ZeroDivisionError, TypeError) as exc:
        raise ConfigError(f"{name}={value!r} is not a number") from exc


@dataclass(frozen=True, slots=True)
class BudgetLedger:
    """Request-local decode budget state: ``O(1)`` size, independent of history.

    Attributes
    ----------
    allowance_per_token:
        ``b = B_D · C_full`` in bytes (exact fraction).
    full_bytes_per_token:
        ``C_full`` in bytes, kept to report the measured decode ratio.
    tokens:
        Tokens that earned an allowance so far (stop tokens excluded).
    charged_bytes:
        ``Σ M(a_i)`` over those tokens.
    last_excess_bytes:
        ``[M(a_t) − R_t]_+`` of the latest charge: how far it went past its pre-action balance
        (which may already include earlier debt), as App. B.6 defines it.
    """

    allowance_per_token: Fraction
    full_bytes_per_token: int
    tokens: int = 0
    charged_bytes: int = 0
    last_excess_bytes: Fraction = Fraction(0)

    @classmethod
    def start(cls, *, budget: float | Fraction | str, full_bytes_per_token: int) -> BudgetLedger:
        """A fresh ledger for stage budget ``B_D`` (fraction of Full KV, ``0 ≤ B_D ≤ 1``).

        Raises
        ------
        ConfigError
            ``budget`` outside ``[0, 1]`` or ``full_bytes_per_token`` not positive.
        """
        b_d = as_fraction(budget, name="budget")
        if not 0 <= b_d <= 1:
            raise ConfigError(f"decode budget B_D={budget} must lie in [0, 1]")
        if full_bytes_per_token <= 0:
            raise ConfigError(f"full_bytes_per_token={full_bytes_per_token} must be positive")
        return cls(b_d * full_bytes_per_token, full_bytes_per_token)

    @property
    def balance(self) -> Fraction:
        """``tokens · b − charged_bytes``; negative means debt carried forward."""
        return self.tokens * self.allowance_per_token - self.charged_bytes

    @property
    def debt_bytes(self) -> Fraction:
        """``[−balance]_+``: what later tokens still have to pay back."""
        return -self.balance if self.balance < 0 else Fraction(0)

    @property
    def measured_ratio(self) -> float:
        """Charged bytes over Full-KV bytes for the same tokens (0.0 before any token)."""
        if self.tokens == 0:
            return 0.0
        return self.charged_bytes / (self.tokens * self.full_bytes_per_token)

    def open_token(self) -> BudgetLedger:
        """Credit the allowance of the next token; ``balance`` is then ``R_t``."""
        return replace(self, tokens=self.tokens + 1)

    def charge(self, payload_bytes: int) -> BudgetLedger:
        """Charge the token just opened with ``M(a_t)`` bytes; record its excess over ``R_t``."""
        if payload_bytes < 0:
            raise ConfigError(f"payload_bytes={payload_bytes} must be non-negative")
        excess = payload_bytes - self.balance
        return replace(
            self,
            charged_bytes=self.charged_bytes + payload_bytes,
            last_excess_bytes=excess if excess > 0 else Fraction(0),
        )

    def charge_stop(self) -> BudgetLedger:
        """A stop token: its KV is never computed, so it earns no allowance and costs nothing."""
        return self
