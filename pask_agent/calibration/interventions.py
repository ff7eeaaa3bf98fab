"""What one replay batch asks and answers: the interventions (actions per layer group for every
prompt and output key), what they did (flips, distortion), and how a decision's candidates are
compared (``answer_keys``) and chosen (the runtime's continue-calls rule)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def answer_keys(candidates: list[list[str]], continuations: list[str]) -> np.ndarray:
    """``[T, K]`` ids such that two candidates of a decision share an id iff choosing either
    leaves the answer's text unchanged, as far as that one decision can tell.

    ``candidates[t]`` are the texts of decision ``t``'s candidates, the recorded choice first;
    ``continuations[t]`` is the recorded text from that choice on. Two kinds of difference are
    not changes: whitespace only (JSON ignores it), and a candidate whose text starts the
    recorded continuation (``"}}"`` where ``"}},"`` was recorded, ``"cal"`` where ``"calc"``
    was): the same text split into other tokens, which free-running decoding completes the
    same way. Measured on 200 (trace, probe) pairs: 34 of the 38 proxy flips that free-running
    decoding did not confirm were such re-tokenizations, against 3 of the 62 it did confirm
    (results/calibration_agreement.md).
    """
    keys = np.zeros((len(candidates), len(candidates[0]) if candidates else 0), dtype=np.int64)
    for t, texts in enumerate(candidates):
        seen: dict[str, int] = {}
        for j, piece in enumerate(texts):
            if j > 0 and piece and continuations[t].startswith(piece):
                keys[t, j] = keys[t, 0]
            else:
                keys[t, j] = seen.setdefault(piece.strip(), len(seen))
    return keys


def continue_rule_logits(
    logits: torch.Tensor,
    at: torch.Tensor,
    real: torch.Tensor,
    is_next: torch.Tensor,
    is_close: torch.Tensor,
    tau: float,
) -> torch.Tensor:
    """The candidates' logits ``[N, T, K]`` with the runtime's continue-calls rule
    (``RuntimeConfig.continue_calls_at``) applied to each row's own probabilities at the
    between-calls positions ``at``: where a row gives another call at least ``tau``, closing
    the array is taken out of the running (``-inf``); the row's choice is the argmax.
    ``real``, ``is_next`` and ``is_close`` (``[len(at), K]``) say which candidates are legal
    tokens, start another call, and close the array."""
    logits = logits.clone()
    sub = logits[:, at].masked_fill(~real[None], float("-inf"))
    p_next = (torch.softmax(sub, dim=-1) * is_next[None]).sum(-1)  # [N, len(at)]
    block = (p_next >= tau)[..., None] & is_close[None]
    logits[:, at] = logits[:, at].masked_fill(block, float("-inf"))
    return logits


@dataclass(frozen=True)
class Interventions:
    """A batch of interventions on one trace (row 0 must be the all-H control).

    ``prompt`` and ``output`` hold ``int8 [N, 3, P]`` / ``[N, 3, T]`` actions per layer group
    (None: all H). ``start_layer`` is the first layer any row changes; ``first_query`` the
    first output position whose attention can see a degraded key in any row.
    """

    prompt: np.ndarray | None
    output: np.ndarray | None
    start_layer: int
    first_query: int

    @property
    def rows(self) -> int:
        arr = self.prompt if self.prompt is not None else self.output
        assert arr is not None
        return int(arr.shape[0])


MARGIN_LIMIT = 1e4  # |margin| of a verdict no decision can change (beyond any logit gap)


def margins(
    logits: torch.Tensor, texts: np.ndarray, control: np.ndarray, valid: np.ndarray
) -> np.ndarray:
    """``ReplayOutcome.margin`` of each row from its candidates' logits ``[N, T, K]`` (after
    the continue-calls rule), their answer keys ``texts [T, K]``, the control row's chosen
    keys ``control [1, T]`` and the checked decisions ``valid [1, T]``."""
    keeps = torch.from_numpy(texts[None] == control[..., None])  # [1, T, K]
    inf = torch.tensor(float("inf"))
    change = logits.masked_fill(keeps, -inf).amax(-1)
    keep = logits.masked_fill(~keeps, -inf).amax(-1)
    # a decision whose every answer-keeping candidate the rule took out has flipped for sure
    gap = torch.where(torch.isinf(keep), torch.where(torch.isinf(change), -inf, inf), change - keep)
    gap = gap.masked_fill(~torch.from_numpy(valid), -inf)
    return gap.amax(-1).clamp(-MARGIN_LIMIT, MARGIN_LIMIT).double().numpy()


@dataclass(frozen=True)
class ReplayOutcome:
    """What a batch of interventions did.

    ``flipped[n]``: row ``n`` changed the checked output somewhere (row 0 is always False).
    ``distortion[n]``: ``Σ_u Σ_ℓ max_h ‖o_ctrl − o_n‖²`` over recomputed query positions and
    the layers of ``distortion_layers`` (the intervened group's).
    ``margin[n]``: how far row ``n``'s verdict is from the other one, in logits: the largest,
    over its checked decisions, of (best logit of a candidate that changes the answer − best
    logit of one that keeps the control's). Positive: it flipped; negative: it did not, and
    would have to move that far to (0, an exact tie, either way; ``-MARGIN_LIMIT`` when no
    decision is checked). Verdicts within a small margin are near-ties that rounding decides
    (a batch's shape, another CPU's kernels); only verdicts beyond it are stable.
    """

    flipped: np.ndarray
    distortion: np.ndarray
    margin: np.ndarray
