"""The policy interface the runtime talks to (STYLE rule 2).

A ``Policy`` is a small frozen dataclass of configuration. ``start(env)`` gives a per-request
(or per-conversation) ``PolicySession`` that holds the mutable state (ledger, counters) and
answers two hooks:

* ``plan_prefill(labels)``: one action per layer group for each new prompt token (``[n, 3]``
  ``Action`` values), decided before the prompt forward (paper §3.6);
* ``on_token(tag, is_stop=...)``: the per-group actions for one accepted token (§3.5);
* ``decode_demand(costs)`` (optional): what its generated tokens keep, so admission can
  reserve a compressed request's real demand (App. B.4) instead of its Full-KV worst case;
* ``revise(view)`` (only for policies with ``revises = True``, the score- and recency-based
  baselines): after each step, late demotions of tokens that already left the window.

Actions are *scheduled*: the store executes them when the token leaves the recent window, and
the store alone enforces sink and window protection. Policies never see tensors or storage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar, Protocol

import numpy as np

from pask_agent.grammars.tags import Tag
from pask_agent.policy.actions import Action
from pask_agent.policy.costs import PayloadCosts

Actions = tuple[Action, Action, Action]


@dataclass(frozen=True, slots=True)
class PolicyEnv:
    """What a session needs to know about the model and the store it decides for."""

    costs: PayloadCosts
    sinks: int
    window: int
    budget: float | None = None  # target total B; None = the policy's own default
    # The served model, for policies whose frozen table belongs to one model (None: unchecked,
    # for unit tests that drive a policy without a model).
    model_id: str | None = None
    tokenizer_hash: str | None = None
    # The tag family of the answer this session will decode ("function_calling", "sql"; None
    # for free text or unknown).
    answer_family: str | None = None
    # The most tokens the answer may have (None: unknown); caps the answer length a policy
    # plans the prompt's share for.
    max_new_tokens: int | None = None


class KeyGeometry(Protocol):
    """A sequence's stored keys as the key-geometry baselines read them (KeyDiff, R-KV):
    per layer group, each position's unit key against the mean unit key, without tensors."""

    def to_mean(self, group: int, upto: int) -> tuple[np.ndarray, np.ndarray]:
        """``(dots [n, m], anchor_norm [m])`` over the ``m`` (layer, KV head) pairs of
        ``group``: each position's unit key dotted with ``ū``, the mean unit key of positions
        ``< upto``, and ``|ū|``."""
        ...


@dataclass(frozen=True, slots=True)
class RetentionView:
    """One sequence's retention after a step, as a revising policy sees it (no KV tensors).

    Per layer group: positions held high and held low (settled tokens only: sinks and the
    recent window are the store's to protect), and the attention mass each position has
    received (``scores``: all steps; ``step_scores``: the latest step only), or None when the
    policy does not ask for scores.
    """

    length: int
    settled: int
    sinks: int
    high: tuple[np.ndarray, np.ndarray, np.ndarray]
    low: tuple[np.ndarray, np.ndarray, np.ndarray]
    scores: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    step_scores: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    prefill_done: bool  # the prompt has been fully processed
    keys: KeyGeometry | None = None  # for policies with ``needs_keys``


@dataclass(frozen=True, slots=True)
class Demotion:
    """Move ``positions`` of one layer group to ``action`` (H→L, H→R or L→R)."""

    group: int
    positions: tuple[int, ...]
    action: Action


@dataclass(frozen=True, slots=True)
class DecodeDemand:
    """What a session's generated tokens keep.

    Attributes
    ----------
    bytes_per_token:
        ``b = B_D · C_full``: payload a generated token keeps on average (exact).
    min_token_bytes:
        The least one generated token can cost (sizes what the recent window adds).
    reserve_bytes:
        ``max_s Γ(s; B_D)``: how far floor charges may run ahead of the allowance.
    quantizes_late:
        The session may move any token, prompt or generated, to INT4 after holding it high
        (a revising tiered baseline: MiKV), so admission reserves an INT4 row for each.
    row_shares:
        ``(high, low)``: per layer group, the share of generated tokens that end in a BF16
        row and in an INT4 row, when the session knows them; None: it decides token by
        token, so at most ``B_D`` of them high and any of them INT4 (admission reserves a
        low row for every generated token, ``runtime/memory/admission.py``).
    """

    bytes_per_token: Fraction
    min_token_bytes: int
    reserve_bytes: Fraction = Fraction(0)
    quantizes_late: bool = False
    row_shares: tuple[tuple[float, float, float], tuple[float, float, float]] | None = None

    @classmethod
    def full(cls, costs: PayloadCosts) -> DecodeDemand:
        c = costs.full_bytes_per_token
        return cls(Fraction(c), c)


@dataclass(frozen=True, slots=True)
class StagePlan:
    """What a session planned for its latest prompt, reported in ``usage``.

    Attributes
    ----------
    budget_prompt, budget_decode:
        The stage budgets ``B_P`` and ``B_D`` it planned at (``policy/stages.py``).
    floor_breach_bytes:
        Prompt bytes released below the table's floors because the floors did not fit
        ``B_P`` (0 when they did): a budget met by release, said out loud.
    plan_budget:
        The total budget the table's prompt plan was calibrated for: the asked ``B``, or the
        next stricter budget a table with several plans has (``PolicyTable.at_budget``).
    mode:
        ``"plan"``: the prompt was planned at ``B_P``; ``"release"``: nothing was planned, every
        token is INT4 and settled prompt tokens are released by label after each step to hold
        ``B`` (``policy/label_release.py``; ``pask`` below INT4's cost).
    """

    budget_prompt: float
    budget_decode: float
    floor_breach_bytes: int = 0
    plan_budget: float | None = None
    mode: str = "plan"


class PolicySession(Protocol):
    def plan_prefill(self, labels: Sequence[str]) -> Sequence[Actions]: ...

    def on_token(self, tag: Tag | None, *, is_stop: bool = False) -> Actions: ...

    # Optional: what generated tokens keep, for admission (runtime/memory/admission.py); a session
    # without it is reserved at Full KV.
    # def decode_demand(self, costs: PayloadCosts) -> DecodeDemand: ...
    # Optional: ``stage_plan: StagePlan | None``, the stage budgets of its latest prompt plan
    # (reported in ``usage``; sessions without stages have none).


class Policy:
    """Base of every registered policy; subclasses are frozen dataclasses."""

    name: ClassVar[str] = ""
    needs_tags: ClassVar[bool] = False  # wants structural tags from a tagger
    needs_labels: ClassVar[bool] = False  # wants prompt span labels
    needs_scores: ClassVar[bool] = False  # wants attention mass per key (computed in attention)
    needs_keys: ClassVar[bool] = False  # wants its keys' geometry (``RetentionView.keys``)
    # Its sessions revise: ``revise(view) -> Sequence[Demotion]`` after each step. The engine
    # asks the session (``session_revises``): ``pask``'s do only below INT4's cost.
    revises: ClassVar[bool] = False
    observation_tokens: ClassVar[int] = 0  # last prompt tokens run as their own chunk (SnapKV)
    # May store a token INT4 (``L``): the store then keeps this policy's keys centered
    # (``runtime/models/key_offsets.py``) so INT4 rows are not scaled by a shared channel offset.
    stores_int4: ClassVar[bool] = False

    def start(self, env: PolicyEnv) -> PolicySession:
        raise NotImplementedError


def session_revises(session: object) -> bool:
    """Whether the engine revises this session's rows after each step (it has ``revise``)."""
    return callable(getattr(session, "revise", None))


@dataclass(frozen=True, slots=True)
class UniformSession:
    """Every token, prompt or generated, gets the same actions."""

    actions: Actions

    def plan_prefill(self, labels: Sequence[str]) -> Sequence[Actions]:
        return [self.actions] * len(labels)

    def on_token(self, tag: Tag | None, *, is_stop: bool = False) -> Actions:
        return self.actions

    def decode_demand(self, costs: PayloadCosts) -> DecodeDemand:
        cost = costs.token_cost(self.actions)
        shares = tuple(tuple(float(a == x) for a in self.actions) for x in (Action.H, Action.L))
        return DecodeDemand(Fraction(cost), cost, row_shares=shares)  # type: ignore[arg-type]
