"""Per-request output constraint: an xgrammar matcher for legality, a tagger for structure.

An ``OutputSpec`` is compiled once and shared (immutable); ``OutputSpec.start()`` gives the
per-request ``Constraint`` (fresh matcher + fresh tagger), as xgrammar's compiled-grammar /
matcher split does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from pask_agent.grammars.tags import Tag

if TYPE_CHECKING:  # imported where a matcher is made: free-text serving runs without xgrammar
    import xgrammar as xgr

logger = logging.getLogger(__name__)


_TAG_FAMILY = {"tools": "function_calling", "json": "function_calling", "sql": "sql"}


@dataclass(frozen=True)
class OutputSpec:
    """What the answer must look like and how to tag it.

    ``compiled`` is None for free text. ``new_tagger`` makes a fresh structural tagger (or is
    None when there is no structure to tag).
    """

    kind: str  # "text" | "tools" | "json" | "sql"
    compiled: xgr.CompiledGrammar | None
    new_tagger: Callable[[], Any] | None = None
    payload: Any = None  # the tools / schema / SQL schema this spec was built from

    @property
    def tag_family(self) -> str | None:
        """The tag vocabulary the answer's tagger speaks (None: free text, untagged)."""
        return _TAG_FAMILY.get(self.kind)

    def start(self) -> Constraint:
        matcher = None
        if self.compiled is not None:
            import xgrammar as xgr  # lazy, see the import above

            matcher = xgr.GrammarMatcher(self.compiled)
        return Constraint(matcher, self.new_tagger() if self.new_tagger else None)


class Constraint:
    """One request's matcher and tagger; both advance once per accepted token."""

    def __init__(self, matcher: xgr.GrammarMatcher | None, tagger: Any | None) -> None:
        self.matcher = matcher
        self.tagger = tagger
        self.tagger_failed = False

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> None:
        if self.matcher is not None:
            self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> bool:
        return self.matcher is None or bool(self.matcher.accept_token(token_id))

    def tag(self, token_text: str) -> Tag | None:
        """The token's structural tag; None when there is no tagger (or it lost track)."""
        if self.tagger is None or self.tagger_failed:
            return None
        try:
            return self.tagger.feed(token_text)
        except Exception:  # noqa: BLE001 - a tagger bug must not break a legal answer
            # Counted per token in usage (``tagger_fallback``) and logged once per request.
            logger.warning("structural tagger lost track; default bucket from here", exc_info=True)
            self.tagger_failed = True
            return None

    def between_calls(self) -> bool:
        """Whether the output just finished one of several parallel calls (see the tagger)."""
        if self.tagger is None or self.tagger_failed:
            return False
        probe = getattr(self.tagger, "between_calls", None)
        return bool(probe()) if probe is not None else False

    def forced_text(self) -> str:
        """Text the grammar forces next (jump-forward), or ``""``."""
        if self.matcher is None or self.matcher.is_terminated():
            return ""
        return self.matcher.find_jump_forward_string()

    def accept_forced(self, tokenizer: Any, room: int) -> list[int]:
        """Accept up to ``room`` tokens of the text the grammar forces next (jump-forward:
        appended without sampling); the tokens accepted."""
        forced = self.forced_text()
        if not forced:
            return []
        taken: list[int] = []
        for t in tokenizer(forced, add_special_tokens=False)["input_ids"][:room]:
            if not self.accept(t):
                break
            taken.append(t)
        return taken

    def is_terminated(self) -> bool:
        return self.matcher is not None and self.matcher.is_terminated()

    def rollback(self, n: int) -> None:
        if self.matcher is not None and n:
            self.matcher.rollback(n)
        if self.tagger is not None and not self.tagger_failed and n:
            self.tagger.rollback(n)


TAGGER_FALLBACK = "tagger_fallback"
UNTAGGED = "untagged"


def tag_key(tag: Tag | None, constraint: Constraint) -> str:
    """A generated token's bucket for usage reports: its tag, ``untagged`` for output with no
    structure to tag (free text), or ``tagger_fallback`` when the tagger lost track of an
    output the grammar accepted (a bug to fix; the policy then sees the default bucket)."""
    if tag is not None:
        return str(tag.key())
    return TAGGER_FALLBACK if constraint.tagger is not None else UNTAGGED
