"""``pask``: the frozen table's prefill plan for prompt spans and the online decode controller
for generated tokens (paper §3.5, §3.6), held to the target *total* budget ``B`` by planning.

The table carries calibrated stage budgets: ``B_D`` for answers (the cheapest decode candidate
within ``α_D``) and the expected answer length. Each prompt's ``(B_P, B_D)`` comes from
``policy/stages.py::solve_stage_budgets``, the function calibration selected the table with:
decoding runs at the calibrated ``B_D`` and the prompt plan gets the rest of ``B``, so prompt +
answer meet ``B`` on a typical answer (the rule and its exceptions are written there). There is
no after-the-fact guard: the plan, the ledger and the reserve are the whole mechanism. What the
prompt's floors cannot keep within ``B_P`` the planner releases below them and reports
(``floor_breach_bytes``, in ``usage``).

An answer whose tag family calibration never measured (SQL, while the table's SQL buckets are
carried over from the hand-written prior, which holds critical tokens ``H``) is planned kept
whole for the table's expected answer length, and an ``AnswerCeiling`` stores INT4 whatever
would take the request past ``B + BUDGET_TOLERANCE`` (``policy/ceiling.py``). Before the
ceiling the prompt was planned for the longest answer the request allowed, which released
schema tokens for answers that almost never came.

Below INT4's cost (``PayloadCosts.int4_share``, 0.266 of Full KV on the default model) even
uniform INT4 does not fit, tokens must go, and the table's plans (selected for upgrades at
``B = 0.33``) released what answers needed: at ``B = 0.20`` on BFCL dev PASK's plan scored
42.5 %, below uniform ``int4``'s 46.0 %. There ``pask`` keeps every token INT4 and releases
settled prompt tokens by span label after each step instead (``policy/label_release.py``:
56.5 %); ``usage.plan_mode`` says ``"release"``.

Free text (no grammar, so no tags) gets the table's default bucket, which keeps every token
BF16: a 64-token prose answer took a 512-token request to B 0.39 at a target of 0.33 (the
serving bench). Its answer is held by a ceiling at ``B`` itself: prose has no structure the
table could protect, so nothing earns the tolerance. (The recent window stays BF16, which the
prompt plan counted at ``B_D``: a short answer may end up to 0.006 over ``B``.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar

from pask_agent.grammars.tags import Tag
from pask_agent.policy.actions import Action
from pask_agent.policy.base import Actions, DecodeDemand, Policy, PolicyEnv, StagePlan
from pask_agent.policy.ceiling import AnswerCeiling
from pask_agent.policy.controller import DecodeController, DecodeLookup
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.default_table import DEFAULT_TABLE_PATH, HAND_WRITTEN_TABLE_PATH
from pask_agent.policy.label_release import LabelReleaseSession, release_order
from pask_agent.policy.ledger import as_fraction
from pask_agent.policy.planner import PrefillPlan, PrefillPlanner
from pask_agent.policy.registry import register_policy
from pask_agent.policy.scored import check_budget
from pask_agent.policy.stages import StageBudgets, solve_stage_budgets
from pask_agent.policy.table import PolicyTable

BUDGET_TOLERANCE = Fraction(3, 100)  # how far over B an unmeasured answer may take a request


@dataclass
class PaskSession:
    """One request's (or conversation's) PASK state: the decode controller and the planner.

    ``budget`` is the target total ``B``; ``calibrated_decode`` the table's ``B_D`` (None: the
    answer's family was never measured); ``expected_answer`` the answer length the prompt's
    share is planned for (None: the table does not say, both stages plan at ``B``). ``stages``
    and ``stage_plan`` describe the latest prompt planned.
    """

    controller: DecodeController
    planner: PrefillPlanner
    table: PolicyTable
    costs: PayloadCosts
    lookup: DecodeLookup
    budget: Fraction = Fraction(1)
    calibrated_decode: Fraction | None = None
    expected_answer: float | None = None
    sinks: int = 0  # the store's protection, planned as H so the plan's bytes are the real ones
    window: int = 0
    ceiling: AnswerCeiling | None = None  # an unmeasured answer family's byte ceiling
    stages: StageBudgets | None = None
    stage_plan: StagePlan | None = None

    @property
    def budget_decode(self) -> Fraction:
        """The decode ledger's ``B_D``."""
        return self.controller.ledger.allowance_per_token / self.costs.full_bytes_per_token

    def solve(self, prompt_tokens: int) -> StageBudgets:
        """This session's ``(B_P, B_D)`` for a prompt of ``prompt_tokens`` tokens."""
        return solve_stage_budgets(
            self.budget,
            decode=self.calibrated_decode,
            prompt_tokens=prompt_tokens,
            answer_tokens=self.expected_answer,
            sinks=self.sinks,
            window=self.window,
            decode_floor=self.costs.int4_share,
        )

    def plan_prefill(self, labels: Sequence[str]) -> Sequence[Actions]:
        n = len(labels)
        protected = [i < self.sinks or i >= n - self.window for i in range(n)]
        self.stages = stages = self.solve(n)
        if stages.decode != self.budget_decode:
            # A turn whose stage solve moves B_D starts a fresh ledger: a conversation's
            # earlier answers are prompt tokens now, re-planned with it (history_plan.py).
            self.controller = DecodeController(
                self.table, self.costs, budget=stages.decode, lookup=self.lookup
            )
        plan = self.plan_prompt(labels, protected, stages.prompt)
        self.stage_plan = StagePlan(
            stages.prompt, float(stages.decode), plan.floor_breach_bytes, self.table.budget_total
        )
        if self.ceiling is not None:
            self.ceiling.start(n, plan.planned_bytes)
        return [tuple(Action(int(a)) for a in row) for row in plan.actions]  # type: ignore[misc]

    def plan_prompt(
        self, labels: Sequence[str], protected: Sequence[bool], budget: float
    ) -> PrefillPlan:
        """The prompt's plan at ``B_P = budget`` from its span labels."""
        return self.planner.plan(labels, protected=protected, budget=budget)

    def on_token(self, tag: Tag | None, *, is_stop: bool = False) -> Actions:
        actions = self.controller.on_token(tag, is_stop=is_stop).actions
        if self.ceiling is not None and not is_stop:
            actions = self.ceiling.fit(actions)
        return actions  # type: ignore[return-value]

    def decode_demand(self, costs: PayloadCosts) -> DecodeDemand:
        """``b = B_D · C_full`` per generated token and the largest reserve ``Γ`` (App. B.4)."""
        reserve = self.controller.reserve
        return DecodeDemand(
            self.controller.ledger.allowance_per_token,
            0,
            max([reserve.pooled, *reserve.by_state.values()]),
        )


def session_parts(table: PolicyTable, env: PolicyEnv, lookup: DecodeLookup) -> dict[str, Any]:
    """A session's controller, planner and budgets for one table (PASK and its ablations
    differ only in the decode lookup and, for ``position_both``, the prompt plan).

    Raises
    ------
    ConfigError
        ``env.budget`` outside ``(0, 1]``.
    """
    total = as_fraction(table_budget(table, env.budget), name="budget")
    family = env.answer_family
    unmeasured = family is not None and not table.decode_measured(family)
    limit = total + BUDGET_TOLERANCE if unmeasured else total  # free text: B itself
    calibrated = None if unmeasured else as_fraction(table.budget_decode, name="budget_decode")
    if table.expected_output_tokens is None:
        calibrated = total  # nothing to trade between the stages: both plan at B
    # The ledger's B_D until a prompt is planned (each prompt re-solves it, stages.py).
    first = total if calibrated is None or total == 1 else calibrated
    return {
        "controller": DecodeController(table, env.costs, budget=first, lookup=lookup),
        "planner": PrefillPlanner(table, env.costs, budget=total),
        "table": table,
        "costs": env.costs,
        "lookup": lookup,
        "budget": total,
        "calibrated_decode": calibrated,
        "expected_answer": expected_answer(table, env),
        "sinks": env.sinks,
        "window": env.window,
        "ceiling": (
            AnswerCeiling(min(Fraction(1), limit), env.costs, env.window)
            if (unmeasured or family is None) and total < 1
            else None
        ),
    }


def expected_answer(table: PolicyTable, env: PolicyEnv) -> float | None:
    """The answer length the prompt's share is planned for: the table's expected length, but
    never more than the request may generate (an answer capped at 24 tokens repays none of
    what a 59-token answer at the calibrated ``B_D`` would have lent the prompt)."""
    expected = table.expected_output_tokens
    if expected is None or env.max_new_tokens is None:
        return expected
    return min(expected, float(env.max_new_tokens))


def table_budget(table: PolicyTable, budget: float | None) -> float:
    """The request's total ``B``: the asked one, else the table's own.

    Raises
    ------
    ConfigError
        A budget outside ``(0, 1]``.
    """
    if budget is None:
        budget = table.budget_total if table.budget_total is not None else table.budget_prefill
    return check_budget(budget)


@register_policy("pask")
@dataclass(frozen=True)
class PaskPolicy(Policy):
    """PASK over a frozen table (the shipped default table unless one is given).

    Parameters
    ----------
    table:
        The frozen table; the shipped default when None.
    allow_transfer:
        Use the table on a model or tokenizer other than the one it was calibrated for (paper
        §4.5); by default that is a ``PolicyTableError``.
    """

    table: PolicyTable | None = None
    allow_transfer: bool = False
    _lookup: dict = field(default_factory=dict, compare=False, repr=False)
    name = "pask"
    needs_tags = True
    needs_labels = True
    stores_int4 = True
    default_table_path: ClassVar[Path] = DEFAULT_TABLE_PATH

    def resolved_table(self, env: PolicyEnv | None = None) -> PolicyTable:
        """The table, checked against ``env``'s model and tokenizer when it names them.

        Raises
        ------
        PolicyTableError
            The table was calibrated for another model or tokenizer (and ``allow_transfer`` is
            off), the shipped table file is unreadable or corrupt, or the table has plans for
            several budgets and none at or below ``env.budget`` (``PolicyTable.at_budget``).
        """
        table = self._checked_table(env)
        if env is not None and table.plans:
            budget = table_budget(table, env.budget)
            if ("plan", budget) not in self._lookup:
                self._lookup[("plan", budget)] = table.at_budget(budget)
            table = self._lookup[("plan", budget)]
        return table

    def _checked_table(self, env: PolicyEnv | None) -> PolicyTable:
        if "table" not in self._lookup:
            self._lookup["table"] = self.table or PolicyTable.read(self.default_table_path)
        table: PolicyTable = self._lookup["table"]
        if env is not None and env.tokenizer_hash is not None and not self.allow_transfer:
            key = ("checked", env.model_id, env.tokenizer_hash)
            if key not in self._lookup:
                table.check_model(
                    model_id=env.model_id or table.model_id, tokenizer_hash=env.tokenizer_hash
                )
                self._lookup[key] = True
        return table

    def start(self, env: PolicyEnv) -> PaskSession | LabelReleaseSession:
        """The table's plan; below INT4's cost (``PayloadCosts.int4_share``), release by span
        label: no plan of the table's fits there without releasing what answers need."""
        total = table_budget(self._checked_table(env), env.budget)
        if total < env.costs.int4_share:
            if "release" not in self._lookup:
                self._lookup["release"] = release_order()
            return LabelReleaseSession.open(env, total, label_rank=self._lookup["release"])
        table = self.resolved_table(env)
        if "decode" not in self._lookup:
            self._lookup["decode"] = DecodeLookup.from_table(table)
        return PaskSession(**session_parts(table, env, self._lookup["decode"]))


@register_policy("pask_hand")
@dataclass(frozen=True)
class HandWrittenPaskPolicy(PaskPolicy):
    """PASK over the hand-written table (``default_table.py``): what served before
    calibration, kept as a baseline to compare the calibrated table against."""

    name = "pask_hand"
    default_table_path: ClassVar[Path] = HAND_WRITTEN_TABLE_PATH


@dataclass(frozen=True)
class TablePaskPolicy(PaskPolicy):
    """PASK over a table file (your own calibration); ``str`` is the path, so keys that name
    the policy (conversations) stay short."""

    path: str = ""

    @classmethod
    def read(cls, path: str) -> TablePaskPolicy:
        """Read and validate the table (the model check happens when a request starts).

        Raises
        ------
        PolicyTableError
            The file is missing, corrupt or not a valid table.
        """
        return cls(PolicyTable.read(path), path=str(path))

    def __str__(self) -> str:
        return f"pask:{self.path}"
