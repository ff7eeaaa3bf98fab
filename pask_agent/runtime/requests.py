"""What crosses the engine's door: sampling settings, one request's state, and how a request
ends (``Finished`` or ``Failed``), as events the async ``Runtime`` routes.

Kept apart from ``engine.py`` so the loop reads in one sitting and callers that only build
requests or configs (the server, the CLI, eval) need not read it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from pask_agent.errors import ConfigError
from pask_agent.grammars.token_text import TokenTextStream
from pask_agent.policy.base import Policy, PolicySession
from pask_agent.runtime.turns.constraint import Constraint, OutputSpec
from pask_agent.runtime.turns.results import Delta, Finished


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False  # benchmarks: always generate max_new_tokens

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ConfigError("need temperature >= 0 and 0 < top_p <= 1")


@dataclass
class SequenceState:
    """A store sequence that outlives one request (a conversation): its tokens and policy."""

    seq_id: str
    session: PolicySession
    ids_in_store: list[int] = field(default_factory=list)
    busy: bool = False


@dataclass(frozen=True, slots=True)
class Failed:
    error: BaseException


@dataclass(eq=False)
class Request:
    """One request's mutable state; owned by the engine thread once submitted."""

    prompt_ids: list[int]
    labels: list[str] | None
    spec: OutputSpec
    params: SamplingParams
    state: SequenceState  # a fresh one per bare request, the conversation's otherwise
    policy: Policy = field(default_factory=Policy)
    keep_sequence: bool = False
    cancelled: bool = False
    # engine-side progress
    constraint: Constraint | None = None
    prefill_pos: int = 0
    reused: int = 0
    generated: list[int] = field(default_factory=list)
    feed: list[int] = field(default_factory=list)
    text: str = ""
    submitted: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    generator: torch.Generator | None = None
    stream: TokenTextStream | None = None
    demand_bytes: int = 0  # reserved KV capacity (grows if the request outruns it)
    demand_rows: Any = None  # [2, 3] int64 pool rows behind demand_bytes (admission.py)
    plan: list | None = None  # prefill plan of all prompt_ids, made at admission
    plan_keep: int = -1
    tag_counts: dict[str, int] = field(default_factory=dict)  # generated tokens per bucket
    shed_rows: int = 0  # pool rows this request shed past its reservation (admission.py)
    leader: Request | None = None  # prefilling the same prompt: copied when done (engine.py)
    # Parity checks compare every step's raw logits with transformers' own: keep them (a [V]
    # copy per token, so off by default).
    keep_logits: bool = False
    step_logits: list[torch.Tensor] = field(default_factory=list)

    def may_copy(self, q: Request) -> bool:
        """Whether this request, not yet started, may take ``q``'s prompt KV and last logits
        when ``q``'s prefill ends instead of computing them (the candidates of one SQL
        question, samples of one prompt): same tokens, same plan, ``q`` prefilled from
        nothing and still prefilling. A revising session may copy too (``int4`` and PASK
        below INT4's cost): the copy is taken before the step's revisions and each session
        then revises its own rows, from the same positions and labels, in the same step. Not
        for policies that rank by attention: their scores are gathered by each sequence's
        own prefill, which a copy skips."""
        scored = self.policy.needs_scores or q.policy.needs_scores
        return (
            not scored and q.leader is None and not q.reused
            and q.prefill_pos < len(q.prompt_ids) and q.prompt_ids == self.prompt_ids
            and q.plan == self.plan and q.policy.stores_int4 == self.policy.stores_int4
        )  # fmt: skip

    def finished(self, reason: str, kv: Any, allocated_kv_bytes: int) -> Finished:
        """How the request ends: its tokens and timings, the store's KV report for it, and the
        stage budgets its session planned at."""
        now = time.perf_counter()
        n = len(self.generated)
        first = self.first_token_at or now
        ceiling = getattr(self.state.session, "ceiling", None)
        return Finished(
            token_ids=tuple(self.generated),
            text=self.text,
            reason=reason,
            prompt_tokens=len(self.prompt_ids),
            prefilled_tokens=len(self.prompt_ids) - self.reused,
            kv=kv,
            ttft_s=first - self.submitted,
            tpot_s=(now - first) / (n - 1) if n > 1 else 0.0,
            tag_counts=dict(self.tag_counts),
            allocated_kv_bytes=allocated_kv_bytes,
            step_logits=tuple(self.step_logits) if self.keep_logits else None,
            stages=getattr(self.state.session, "stage_plan", None),
            ceiling_fallback_tokens=0 if ceiling is None else ceiling.demoted_tokens,
            shed_fallback_rows=self.shed_rows,
        )


Event = tuple[Request, Delta | Finished | Failed]
