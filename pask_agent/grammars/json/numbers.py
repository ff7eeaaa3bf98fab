"""JSON numbers, one character at a time, for the tool-call lexer (``lexer.py``).

The grammar bounds how many digits an integer part, a fraction and an exponent may have
(a compressed cache once produced a runaway ``200000000000…``), so the scanner counts them.
States are ``frames.N_*``; ``NumFrame`` carries the state and the digits of the current part.
"""

from __future__ import annotations

from pask_agent.grammars.json.frames import (
    N_DOT,
    N_EMARK,
    N_ESIGN,
    N_EXP,
    N_FRAC,
    N_INT,
    N_MINUS,
    N_START,
    N_ZERO,
)

__all__ = ["ACCEPTING", "DIGITS", "NO_TRANSITION", "TooManyDigits", "next_state"]

ACCEPTING = frozenset((N_ZERO, N_INT, N_FRAC, N_EXP))
"""States in which the characters read so far form a complete number."""

DIGITS = frozenset("0123456789")
MAX_EXP_DIGITS = 3
NO_TRANSITION = -1


class TooManyDigits(Exception):
    """The part being read already has as many digits as the grammar allows."""


def next_state(
    state: int, ndig: int, ch: str, *, integer: bool, max_int: int, max_frac: int
) -> tuple[int, int]:
    """``(state, digits of the current part)`` after ``ch``; ``NO_TRANSITION`` when a number
    in ``state`` cannot take ``ch`` (it may have ended: the caller decides).

    Raises ``TooManyDigits`` when ``ch`` is one digit too many for the current part.
    """
    if state == N_START:
        nxt = N_MINUS if ch == "-" else (N_ZERO if ch == "0" else (N_INT if ch in DIGITS else -1))
        return nxt, 1
    if state == N_MINUS:
        return (N_ZERO if ch == "0" else (N_INT if ch in DIGITS else -1)), 1
    if ch in DIGITS and state in (N_INT, N_FRAC, N_EXP):
        bound = max_int if state == N_INT else (max_frac if state == N_FRAC else MAX_EXP_DIGITS)
        if ndig >= bound:
            raise TooManyDigits(f"too many digits (the grammar allows at most {bound} here)")
        return state, ndig + 1
    if ch in DIGITS and state in (N_DOT, N_EMARK, N_ESIGN):
        return (N_FRAC if state == N_DOT else N_EXP), 1
    if not integer and ch == "." and state in (N_ZERO, N_INT):
        return N_DOT, 0
    if not integer and ch in "eE" and state in (N_ZERO, N_INT, N_FRAC):
        return N_EMARK, 0
    if ch in "+-" and state == N_EMARK:
        return N_ESIGN, 0
    return NO_TRANSITION, 0
