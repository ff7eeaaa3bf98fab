"""The one compact JSON layout every grammar, tagger and rendered ground truth shares.

Objects ``{"a": 1, "b": 2}``, arrays ``[1, 2]`` (``json.dumps``'s default separators, no other
whitespace), keys in the schema's property order; literals are spelled by ``json_literal`` and
numbers are bounded by ``JsonLayout``, so one output has one spelling (see ``ebnf`` for why the
bounds exist).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class JsonLayout:
    """Bounds that keep every literal finite (see the module docstring).

    The defaults admit every ``repr`` of a Python float (at most 16 integer digits before it
    switches to an exponent, and 17 significant digits after up to 4 leading zeros) and every
    integer below 10**16, and nothing longer.
    """

    max_int_digits: int = 16
    max_frac_digits: int = 21


def json_literal(value: Any) -> str:
    """The one spelling of a JSON value that the grammar and rendered ground truth share."""
    return json.dumps(value, ensure_ascii=False)
