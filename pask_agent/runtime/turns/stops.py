"""Stop strings over streamed text, shared by every front end that streams (LangChain, server).

A stop string may arrive split across tokens, so a stream must hold back the text's tail that
could still become one before it sends anything."""

from __future__ import annotations

from collections.abc import Sequence


def stop_holdback(text: str, stops: Sequence[str]) -> int:
    """Length of ``text``'s longest suffix that is a proper prefix of some stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best
