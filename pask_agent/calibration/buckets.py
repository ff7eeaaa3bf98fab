"""Which decode buckets calibration measures: tag keys with enough support in the traces.

A bucket measured on a handful of tokens gives a task-error estimate that is mostly noise,
so rare tags are pooled into their parent key (App. B.1's fallback chain
``(c,r,s,n) → (c,r,s) → (c,r) → c``) until each key has ``min_tokens`` tokens in at least
``min_traces`` traces. The online controller resolves tags through the same chain, so a rare
tag meets the pooled entry it was measured in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pask_agent.calibration.replay import ReplayedTrace
from pask_agent.grammars.tags import Tag

DEFAULT_KEY = "<default>"  # untagged tokens (the table's decode_default)


@dataclass(frozen=True)
class DecodeKeys:
    """The decode keys calibration measures; the last index is the default bucket."""

    keys: tuple[str, ...]
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {k: i for i, k in enumerate(self.keys)})

    @classmethod
    def choose(
        cls, traces: Sequence[ReplayedTrace], *, min_tokens: int = 30, min_traces: int = 5
    ) -> DecodeKeys:
        tokens: Counter[str] = Counter()
        spread: Counter[str] = Counter()
        for tr in traces:
            seen: set[str] = set()
            for tag in tr.tags:
                if tag is None:
                    continue
                for key in tag.parents():
                    tokens[key] += 1
                    seen.add(key)
            spread.update(seen)
        chosen: set[str] = set()
        pending = {t for tr in traces for t in tr.tags if t is not None}
        for level in range(4):  # most specific first; a tag stops at its first supported key
            for tag in sorted(pending, key=Tag.key):
                key = tag.parents()[level]
                if tokens[key] >= min_tokens and spread[key] >= min_traces:
                    chosen.add(key)
            pending = {t for t in pending if not any(k in chosen for k in t.parents())}
        return cls(tuple(sorted(chosen)))

    @property
    def size(self) -> int:
        """Number of buckets including the default one."""
        return len(self.keys) + 1

    def name(self, index: int) -> str:
        return self.keys[index] if index < len(self.keys) else DEFAULT_KEY

    def index_of(self, tag: Tag | None) -> int:
        if tag is not None:
            for key in tag.parents():
                if key in self._index:
                    return self._index[key]
        return len(self.keys)

    def of_trace(self, trace: ReplayedTrace) -> np.ndarray:
        """``int64 [T]``: the bucket index of every output token."""
        return np.array([self.index_of(t) for t in trace.tags], dtype=np.int64)
