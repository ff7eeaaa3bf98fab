"""Is a turn's answer right? Its calls match the gold calls, and they leave the same state.

Why both: matching arguments alone (BFCL's AST check) cannot tell that two spellings of one
request do the same thing, and comparing states alone cannot fault a search with the wrong
city (searches change nothing). So a turn is right when the predicted calls equal the gold
ones after normalisation (same function names, same argument values, casefolded strings,
defaults filled in, order of calls free) *and* running them on a copy of the sandbox state
gives the state the gold calls give.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import permutations
from typing import Any

from pask_agent.eval.agent_sandbox.tools import DEFAULTS, Call, execute
from pask_agent.eval.agent_sandbox.world import World


@dataclass(frozen=True, slots=True)
class TurnScore:
    """One turn's verdict: right overall, calls matched, state matched, and why not."""

    correct: bool
    calls_match: bool
    state_match: bool
    error: str


def normalize_value(value: Any) -> Any:
    """Strings casefolded with whitespace collapsed; numbers compared as numbers."""
    if isinstance(value, str):
        return " ".join(value.split()).casefold()
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, list | tuple):
        return [normalize_value(v) for v in value]
    if isinstance(value, dict):
        return {k: normalize_value(v) for k, v in value.items()}
    return value


def normalize_call(call: Call) -> tuple[str, dict[str, Any]]:
    """A call's name and arguments with omitted optional arguments set to their defaults and
    ``None`` arguments dropped."""
    args = {k: v for k, v in call.arguments.items() if v is not None}
    for (name, key), default in DEFAULTS.items():
        if name == call.name:
            args.setdefault(key, default)
    return call.name, {k: normalize_value(v) for k, v in args.items()}


def call_mismatch(predicted: Call, gold: Call) -> str:
    """Why ``predicted`` is not ``gold`` ("" when it is)."""
    p_name, p_args = normalize_call(predicted)
    g_name, g_args = normalize_call(gold)
    if p_name != g_name:
        return f"called {p_name}, want {g_name}"
    for key in sorted(set(p_args) | set(g_args)):
        if key not in g_args:
            return f"{g_name}: unexpected argument {key!r}"
        if key not in p_args:
            return f"{g_name}: missing argument {key!r}"
        if p_args[key] != g_args[key]:
            got, want = predicted.arguments.get(key), gold.arguments.get(key)
            return f"{g_name}: {key}={got!r}, want {want!r}"
    return ""


def calls_mismatch(predicted: Sequence[Call], gold: Sequence[Call]) -> str:
    """Why the predicted calls are not the gold ones, in any order ("" when they are)."""
    if not predicted:
        return "no call"
    if len(predicted) != len(gold):
        return f"{len(predicted)} calls, want {len(gold)}"
    first = ""
    for order in permutations(predicted):
        errors = [call_mismatch(p, g) for p, g in zip(order, gold, strict=True)]
        if not any(errors):
            return ""
        first = first or next(e for e in errors if e)
    return first


def run_calls(world: World, calls: Sequence[Call]) -> World:
    """A copy of ``world`` after ``calls``."""
    after = copy.deepcopy(world)
    for call in calls:
        execute(after, call)
    return after


def score_turn(world: World, predicted: Sequence[Call], gold: Sequence[Call]) -> TurnScore:
    """Score one turn asked in state ``world`` (left unchanged)."""
    mismatch = calls_mismatch(predicted, gold)
    same_state = run_calls(world, predicted) == run_calls(world, gold)
    error = mismatch or ("" if same_state else "the calls leave another state than the gold")
    if mismatch and not same_state:
        error += "; state differs"
    return TurnScore(not mismatch and same_state, not mismatch, same_state, error)
