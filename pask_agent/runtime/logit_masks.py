"""Which tokens a request may sample next: grammar masks, the free-text ban on control tokens,
the parallel-call continuation rule and ``ignore_eos``, applied to one step's logits at once.

Kept apart from the engine's loop: these are token-id facts about one tokenizer, computed once
per engine, and the step only says which rows need which of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pask_agent.grammars.compiler import special_token_ids, stop_token_ids
from pask_agent.runtime.requests import Request


class LogitMasks:
    """Token-id masks of one tokenizer over a ``vocab_size``-wide logit row.

    Parameters
    ----------
    tokenizer:
        The served model's tokenizer.
    vocab_size:
        The model's logit width (may exceed the tokenizer's vocabulary).
    continue_calls_at:
        ``RuntimeConfig.continue_calls_at``: between parallel calls, forbid closing the array
        when another call gets at least this probability (None: never).
    """

    def __init__(self, tokenizer: Any, vocab_size: int, continue_calls_at: float | None) -> None:
        self.vocab_size = vocab_size
        self.stop_ids = frozenset(stop_token_ids(tokenizer))
        banned = [i for i in special_token_ids(tokenizer, vocab_size) if i not in self.stop_ids]
        self._free_text = torch.zeros(vocab_size, dtype=torch.bool)
        self._free_text[banned] = True
        # a tokenizer wider than the model (tiny test models) has stops the logits lack
        self._stops = torch.tensor(
            sorted(i for i in self.stop_ids if i < vocab_size), dtype=torch.long
        )
        self._next_call_ids, self._close_ids = _separator_ids(tokenizer, vocab_size)
        self.continue_calls_at = continue_calls_at

    @property
    def separator_ids(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Ids of tokens that start another parallel call (``,``) and that close the array."""
        return self._next_call_ids, self._close_ids

    def apply(self, logits: torch.Tensor, rows: Sequence[tuple[int, Request]]) -> None:
        """Mask ``logits [B, V]`` in place for the requests sampling at ``rows``."""
        constrained = [(row, r) for row, r in rows if r.constraint.matcher is not None]
        if constrained:
            import xgrammar as xgr  # lazy: free-text rows (and their engines) need no xgrammar

            bitmask = xgr.allocate_token_bitmask(len(logits), self.vocab_size)
            xgr.reset_token_bitmask(bitmask)
            for row, r in constrained:
                r.constraint.fill_mask(bitmask, row)
            xgr.apply_token_bitmask_inplace(
                logits, bitmask, vocab_size=self.vocab_size, indices=[row for row, _ in constrained]
            )
        tau = self.continue_calls_at
        if tau is not None:
            for row, r in rows:
                if r.constraint.between_calls():
                    p = torch.softmax(logits[row].float(), dim=-1)
                    if float(p[self._next_call_ids].sum()) >= tau:
                        logits[row, self._close_ids] = float("-inf")
        # one indexed write per kind, whatever the batch size
        free = [row for row, r in rows if r.constraint.matcher is None]
        if free:
            idx = torch.tensor(free, dtype=torch.long)
            logits[idx] = logits[idx].masked_fill(self._free_text, float("-inf"))
        no_eos = [row for row, r in rows if r.params.ignore_eos]
        if no_eos:
            logits[torch.tensor(no_eos, dtype=torch.long)[:, None], self._stops] = float("-inf")


def _separator_ids(tokenizer: Any, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids whose text starts with ``,`` (another call follows) and with ``]`` (the array
    of calls closes). Byte-level BPE spells both characters as themselves."""
    comma, close = [], []
    for text, i in tokenizer.get_vocab().items():
        if i < vocab_size and text[:1] == ",":
            comma.append(i)
        elif i < vocab_size and text[:1] == "]":
            close.append(i)
    return torch.tensor(comma, dtype=torch.long), torch.tensor(close, dtype=torch.long)
