"""Token choice: greedy at temperature 0, else temperature + top-p with a per-request seed."""

from __future__ import annotations

import torch


def sample(
    logits: torch.Tensor, *, temperature: float, top_p: float, generator: torch.Generator | None
) -> int:
    """Pick one token from masked logits ``[V]`` (masked entries are ``-inf``)."""
    if temperature <= 0.0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        keep = sorted_p.cumsum(0) - sorted_p < top_p  # always keeps the first
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_p[keep])
    return int(torch.multinomial(probs, 1, generator=generator))
