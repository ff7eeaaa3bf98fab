"""Stage budgets: how a request's total ``B`` splits into the prompt plan's ``B_P`` and the
decode ledger's ``B_D`` (paper §3.6, App. B.4, B.6, Table 17).

One function, :func:`solve_stage_budgets`, used by calibration when it replays prompt
candidates (``calibration/calibrate.py``) and by PASK when it serves (``policy/pask.py``): for
the same prompt length, expected answer length, sinks, window, total and calibrated ``B_D``
they get the same numbers, so a table serves the prompt plans it was selected at.

The rule, and why:

1. **Decode runs at the table's calibrated** ``B_D``, **but not below INT4's own cost** while
   the total allows it (``decode_floor``: ``max(B_D, min(floor, B))``). Calibration chose
   ``B_D`` as the cheapest decode plan within ``α_D`` of Full KV; running the ledger at
   ``max(B_D, B)`` (an earlier rule) spent bytes calibration found no use for. Below the INT4
   cost, though, the ledger must *release* answer tokens, and the teacher-forced replay that
   chose ``B_D`` feeds the recorded answer back token by token: it cannot see the loop a
   released token starts in free-running decoding (a call repeated until the token limit).
   Measured on the 200 BFCL test cases at ``B = 0.33`` with the shipped table
   (``B_D = 0.157``): 54.0 % unfloored against Full KV's 65.5 %
   (``results/bfcl_test_stages.md``). Until calibration validates releases on free-running
   answers, decoding is not planned below the cost of keeping every answer token INT4.
   Below that cost the floor gives way to ``B``. On the 200 BFCL dev cases at ``B = 0.20``
   (``results/dev_checks/``) this rule scored 42.5 %, with 15 of 40 parallel answers running
   to the token limit. Flooring at INT4's cost at every ``B`` scored 44.0 % and ended 51 of
   200 answers above ``B`` (max 0.219): the prompt plan, solved for the expected answer
   length, cannot pay for a runaway answer. Uniform ``int4`` scored 46.0 % and
   ``position_both`` 45.0 % (Full KV 58.0 %).
2. **The prompt gets what is left** of ``B · (n + a)`` after the expected answer: its first
   ``w`` tokens sit in the recent window (BF16) and the rest keep ``B_D``, so
   ``B_P · n = B · (n + a) − min(a, w) − B_D · max(a − w, 0)`` (in units of ``C_full``). The
   bytes a low ``B_D`` frees go to the prompt plan, as the table was selected with.
3. **A prompt kept whole returns the rest to decoding.** If ``B_P`` would exceed 1 the prompt is
   kept whole and ``B_D`` rises to what is left (at most 1): at ``B = 1`` both are 1, Full KV.
4. **The prompt never plans below what the store protects anyway.** Sinks and the prompt's
   recent window stay BF16 whatever the plan says; if ``B_P`` falls below that share the prompt
   is planned at it and the ledger gives up the difference (``B_D`` falls). On a request so
   short that the sinks and both windows alone keep more than ``B``, no policy on this store
   can meet ``B`` (the score-based baselines cannot either): the ledger keeps its calibrated
   ``B_D`` (starving the answer would not meet ``B`` either), the request is not refused (a
   short chat at the default budget must run), and its measured ``B`` says what it kept.

Two cases have nothing to trade: a table without an expected answer length (the hand-written
one) plans both stages at ``B``; an answer family calibration never measured has no calibrated
``B_D`` (``decode=None``), so the prompt's share is solved for that answer kept whole and the
ledger runs at ``B`` (``policy/ceiling.py`` holds the total).

What the table's *floors* cannot keep within ``B_P`` the prompt planner releases below them,
lowest priority first, and reports (``PrefillPlanner``, ``floor_breach_bytes``, in ``usage``):
a budget the floors cannot meet is met by release, never exceeded silently. This module sees
lengths only.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from pask_agent.errors import ConfigError
from pask_agent.policy.ledger import as_fraction
from pask_agent.policy.scored import check_budget


@dataclass(frozen=True, slots=True)
class StageBudgets:
    """One request's stage budgets (shares of Full-KV bytes).

    Attributes
    ----------
    total:
        ``B``, the request's target total (exact).
    prompt:
        ``B_P``, what the prompt plan aims at, in ``[0, 1]``.
    decode:
        ``B_D``, the decode ledger's allowance per generated token, in ``[0, 1]`` (exact).
    """

    total: Fraction
    prompt: float
    decode: Fraction


def solve_stage_budgets(
    total: float | Fraction,
    *,
    decode: float | Fraction | None,
    prompt_tokens: int,
    answer_tokens: float | None,
    sinks: int,
    window: int,
    decode_floor: float | Fraction = 0,
) -> StageBudgets:
    """Split ``total`` into ``B_P`` and ``B_D`` for one prompt (rules in the module docstring).

    Parameters
    ----------
    total:
        The request's target ``B`` in ``(0, 1]``.
    decode:
        The table's calibrated ``B_D``; None when the answer's tag family was never measured.
    prompt_tokens:
        ``n``, the prompt's length in tokens.
    answer_tokens:
        ``a``, the answer length the table expects (None: the table does not say).
    sinks, window:
        The store's protection: sink tokens and recent-window tokens, kept BF16.

    Raises
    ------
    ConfigError
        ``total`` or ``decode`` outside its range.
    """
    if not isinstance(total, Fraction):
        check_budget(total)
    b = as_fraction(total, name="budget")
    if not 0 < b <= 1:
        raise ConfigError(f"budget {total} must lie in (0, 1] (a share of Full-KV bytes)")
    calibrated = None if decode is None else as_fraction(decode, name="budget_decode")
    if calibrated is not None and not 0 <= calibrated <= 1:
        raise ConfigError(f"decode budget B_D={decode} must lie in [0, 1]")
    if calibrated is not None:
        calibrated = max(calibrated, min(as_fraction(decode_floor, name="decode_floor"), b))
    n = max(int(prompt_tokens), 0)
    a = Fraction(0) if answer_tokens is None else as_fraction(answer_tokens, name="answer")
    w = Fraction(window)
    in_window, rest = min(a, w), max(a - w, Fraction(0))
    protected = Fraction(min(n, sinks + window))
    d = b if calibrated is None else calibrated
    if answer_tokens is None or n == 0:  # nothing to trade between the stages
        return StageBudgets(b, float(b), b if answer_tokens is None else d)
    keep = Fraction(1) if calibrated is None else d  # an unmeasured answer is planned whole
    need = b * (n + a)
    share = (need - in_window - keep * rest) / n
    if share > 1:
        share = Fraction(1)
        if calibrated is not None:
            spare = (need - n - in_window) / rest if rest else b
            d = max(d, min(Fraction(1), spare))
    elif share * n < protected:
        share = protected / n
        left = need - protected - in_window  # < 0: no B_D can meet B, so none is given up
        if calibrated is not None and rest and left >= 0:
            d = min(d, left / rest)
    return StageBudgets(b, float(share), d)
