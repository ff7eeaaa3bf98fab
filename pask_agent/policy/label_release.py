"""Below INT4's cost, release prompt tokens in the order of their span labels: how ``pask``
serves such budgets, and ``pask_release``, that mode under its own name at every budget.

Uniform INT4 (``int4``) costs about 0.27 of Full KV; a budget under that must *release* tokens,
and then which tokens go is the whole game. ``int4`` releases the oldest first: it has nothing
else to go by. This policy stores every token INT4 outside the sinks and the recent window, as
``int4`` does, and when the request's bytes pass ``B`` it releases settled tokens in the order
the table's span labels give (``LabelRules``: each label's ``R→L`` priority in each layer
group, the lowest first; older first within a label). The answer being decoded outranks every
prompt token, so it is never released while prompt is left: at ``B = 0.20`` on BFCL dev,
releasing answer tokens made parallel answers loop to the token limit (``policy/stages.py``).

One rule refines the labels: the template text *after the tool definitions* (the paragraph on
how to format a call, the role markers around the request and the answer) ranks just above the
schema scaffold, while the template's header before them (its default system line, the tools'
introduction) ranks as ``template_text``. Released with the rest of the template, the answer
lost the one example of the format it must write: on BFCL dev at ``B = 0.20`` parallel answers
spelled the forced JSON in one-character tokens and ran to the token limit (13 answers; 9 with
this rule; 55.0 % → 56.5 %, ``results/dev_checks/``).

It differs from ``int4`` in one thing, the ranking, so the difference between the two is the
labels' doing; and from ``pask``'s table plan in that nothing is planned at prefill: the prompt
is cut as the answer grows, so the cut is sized by the real answer, not the expected one, and
every step ends within ``B`` (``ScoredSession``'s tiered fit, per layer group). ``pask`` serves
a budget below ``PayloadCosts.int4_share`` (INT4's bytes over BF16's per token, 0.266 on the
default model) this way: there its table plan released what answers needed (dev, ``B = 0.20``:
42.5 % against 56.5 % here). The order is the hand-written table's label priorities, chosen on
dev over the shipped table's, which were selected for upgrades at ``B = 0.33`` (53.0 %).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pask_agent.grammars.tags import SPAN_LABELS, Tag
from pask_agent.policy.base import Actions, Policy, PolicyEnv, RetentionView, StagePlan
from pask_agent.policy.default_table import HAND_WRITTEN_TABLE_PATH
from pask_agent.policy.label_rules import LabelRules
from pask_agent.policy.registry import register_policy
from pask_agent.policy.scored import check_budget, resolve_budget
from pask_agent.policy.table import PolicyTable
from pask_agent.policy.uniform import Int4Session

_LABEL_INDEX = {label: i for i, label in enumerate(SPAN_LABELS)}
_TEMPLATE = _LABEL_INDEX["template_text"]
_SCAFFOLD = _LABEL_INDEX["schema_scaffold"]
# Labels only tool (or table) definitions carry: where the last one is, the definitions end.
_DEFINITION = np.array(
    [_LABEL_INDEX[x] for x in ("type_constraint", "schema_description", "unlinked_schema")]
)


def release_order(table: PolicyTable | None = None) -> np.ndarray:
    """``[label, group]`` release ranks (lowest goes first): ``table``'s ``R→L`` priorities,
    the hand-written table's when None."""
    rules = LabelRules.from_table(table or PolicyTable.read(HAND_WRITTEN_TABLE_PATH))
    return rules.priority[:, :, 0]


def tail_rank(label_rank: np.ndarray) -> np.ndarray:
    """``[group]``: the rank of the template text after the definitions, halfway between the
    scaffold's rank and the next label's above it (one above the scaffold if none is)."""
    scaffold = label_rank[_SCAFFOLD]
    above = np.where(label_rank > scaffold, label_rank, np.inf).min(axis=0)
    return np.where(np.isfinite(above), (scaffold + above) / 2, scaffold + 1.0)


def prompt_ranks(index: np.ndarray, label_rank: np.ndarray) -> np.ndarray:
    """``[n, group]``: each prompt token's rank from its label index (``-1``: a label the table
    lacks, ranked lowest), template text after the definitions at ``tail_rank``."""
    fallback = label_rank.min(axis=0)
    ranks = np.where(index[:, None] >= 0, label_rank[np.maximum(index, 0)], fallback)
    definitions = np.flatnonzero(np.isin(index, _DEFINITION))
    if definitions.size:
        tail = (index == _TEMPLATE) & (np.arange(len(index)) > definitions[-1])
        ranks[tail] = tail_rank(label_rank)
    return ranks


@dataclass
class LabelReleaseSession(Int4Session):
    """``int4``'s session (INT4 everywhere, a tiered fit to ``B`` after each step) ranked by
    span label instead of age."""

    label_rank: np.ndarray = field(default_factory=lambda: np.zeros((len(SPAN_LABELS), 3)))
    prompt_rank: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))  # [n, group]
    answer_tokens: int = 0

    @property
    def stage_plan(self) -> StagePlan:
        """What ``usage`` reports: one total ``B`` for prompt and answer alike (no stage split:
        the answer outranks the prompt), served by release."""
        return StagePlan(self.budget, self.budget, mode="release")

    def plan_prefill(self, labels: Sequence[str]) -> Sequence[Actions]:
        """Every prompt token INT4; its rank comes from its label (the whole prompt is
        planned each turn, so the ranks restart from position 0)."""
        index = np.array([_LABEL_INDEX.get(x, -1) for x in labels], dtype=np.int64)
        self.prompt_rank = prompt_ranks(index, self.label_rank)
        self.answer_tokens = 0
        return super().plan_prefill(labels)

    def on_token(self, tag: Tag | None, *, is_stop: bool = False) -> Actions:
        self.answer_tokens += 1
        return super().on_token(tag, is_stop=is_stop)

    def rank(self, view: RetentionView, group: int) -> np.ndarray:
        """``[length]``: the prompt's label ranks, then the answer above every label
        (positions the session has not seen, if any, rank with the lowest label)."""
        out = np.full(view.length, float(self.label_rank.min()), dtype=np.float64)
        n = min(len(self.prompt_rank), view.length)
        out[:n] = self.prompt_rank[:n, group]
        out[n : min(n + self.answer_tokens, view.length)] = self.label_rank.max() + 1.0
        return out


@register_policy("pask_release")
@dataclass(frozen=True)
class LabelReleasePolicy(Policy):
    """INT4 outside sinks and window; over ``B``, release by span label, answer last.

    Parameters
    ----------
    budget:
        Target total ``B`` when the request names none (1.0: never release).
    table:
        The table whose prompt priorities rank the labels (the hand-written one if None).
    """

    budget: float = 1.0
    table: PolicyTable | None = None
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    name = "pask_release"
    needs_labels = True
    revises = True
    stores_int4 = True

    def __post_init__(self) -> None:
        check_budget(self.budget)

    def start(self, env: PolicyEnv) -> LabelReleaseSession:
        if "rank" not in self._cache:
            self._cache["rank"] = release_order(self.table)
        budget = resolve_budget(env, self.budget)
        return LabelReleaseSession.open(env, budget, label_rank=self._cache["rank"])
