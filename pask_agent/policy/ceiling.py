"""A per-request byte ceiling for answers whose tag family calibration never measured.

The shipped table measured function-calling answers, not SQL: SQL's decode buckets are carried
over from the hand-written prior, which holds critical tokens ``H``, so such an answer keeps
almost every token BF16. Planning the prompt for the longest answer the request allows (what
``pask`` did before) kept that promise only by starving the prompt: on a 1,050-token schema
prompt the plan had ``B_P`` ≈ 0.26 at ``B`` = 0.33, below what INT4 for every prompt token
costs, so schema tokens were released for a 160-token answer that almost never came (the
median SQL candidate is about 20 tokens).

Instead the prompt is planned for the table's expected answer, and this ceiling holds the
request's total within ``B + tolerance`` however long the answer runs: a generated token whose
scheduled action would let the total pass the ceiling once it leaves the recent window is
stored INT4 in the groups it would have kept BF16. Generated tokens are never released here
(releasing generated scaffold made the model lose count of its own output:
``tests/eval/test_bfcl_eval.py`` pins that runaway).

Why it is safe at decision time: a token's action takes effect when it leaves the window of
``w`` tokens, so at any stop ``T`` the request holds the prompt's planned bytes, the scheduled
payload of tokens ``1..T−w`` and ``w`` BF16 tokens. Token ``t`` is admitted only if
``P + Σ_{i≤t} M(a_i) + w · C_full ≤ (B + tol) · C_full · (n + t + w)``, which is that bound at
``T = t + w``. INT4 costs less than ``B + tol`` per token, so a demoted token always widens the
margin. The first ``w`` answer tokens are the plan's job (it counts them BF16).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from pask_agent.policy.actions import Action
from pask_agent.policy.costs import PayloadCosts


@dataclass
class AnswerCeiling:
    """Running bytes of one request's prompt plan and answer against ``limit · C_full``."""

    limit: Fraction  # the most B any stop may show: target B + tolerance
    costs: PayloadCosts
    window: int
    prompt_tokens: int = 0
    prompt_bytes: int = 0
    answer_tokens: int = 0
    answer_bytes: int = 0
    demoted_tokens: int = 0  # tokens stored INT4 because BF16 would have passed the ceiling

    def start(self, prompt_tokens: int, prompt_bytes: int) -> None:
        """A new request's prompt plan (its answer has not started)."""
        self.prompt_tokens, self.prompt_bytes = prompt_tokens, prompt_bytes
        self.answer_tokens = self.answer_bytes = self.demoted_tokens = 0

    def fit(self, actions: tuple[Action, ...]) -> tuple[Action, ...]:
        """``actions`` for the next generated token, with ``H`` groups stored ``L`` when keeping
        them would pass the ceiling; charges what is kept."""
        full = self.costs.full_bytes_per_token
        t = self.answer_tokens + 1
        allowed = self.limit * full * (self.prompt_tokens + t + self.window)
        held = self.prompt_bytes + self.answer_bytes + self.window * full
        cost = self.costs.token_cost(actions)
        if held + cost > allowed and Action.H in actions:
            actions = tuple(Action.L if a == Action.H else a for a in actions)
            cost = self.costs.token_cost(actions)
            self.demoted_tokens += 1
        self.answer_tokens = t
        self.answer_bytes += cost
        return actions
