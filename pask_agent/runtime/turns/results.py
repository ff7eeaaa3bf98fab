"""What callers get back: OpenAI-shaped messages with usage and measured KV statistics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from pask_agent.runtime.turns.mixed_output import split_output


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens, measured KV bytes and timings of one request.

    ``kv_bytes`` is the live payload (high + low + scales) at the end of the request and
    ``measured_b`` its ratio to Full-KV bytes for the same tokens; ``peak_kv_bytes`` is the
    request's peak payload. ``ttft_s`` runs from submission to the first new token.
    ``allocated_kv_bytes`` is what the store's pools take when the request ends (every
    sequence's rows and the free slots): the memory the server pays, next to what this request
    holds, so a saving in ``kv_bytes`` can be checked against it.
    """

    prompt_tokens: int
    completion_tokens: int
    prefilled_tokens: int  # prompt tokens actually computed (the rest came from a reused prefix)
    kv_bytes: int
    full_kv_bytes: int
    measured_b: float
    peak_kv_bytes: int
    ttft_s: float
    tpot_s: float
    # Generated tokens per structural bucket (the tag's key), "untagged" for free text, and
    # "tagger_fallback" for tokens the tagger could not place (should never happen).
    tag_counts: dict[str, int] = field(default_factory=dict)
    allocated_kv_bytes: int = 0
    # the prompt's part of kv_bytes / full_kv_bytes: B split into the prompt's and the answer's
    prompt_kv_bytes: int = 0
    prompt_full_kv_bytes: int = 0
    # the stage budgets the policy planned this turn at (policy/stages.py; None: a policy
    # without stages) and the prompt bytes it released below its floors to meet them
    planned_b_prompt: float | None = None
    planned_b_decode: float | None = None
    floor_breach_bytes: int = 0
    # the total budget whose calibrated prompt plan served: the asked B or, for a table with
    # plans for several budgets, the next stricter one it has (None: no table)
    plan_budget: float | None = None
    # how the policy held B: "plan" (a prompt plan at planned_b_prompt) or "release" (every
    # token INT4, prompt tokens released by span label after each step: pask below INT4's cost)
    plan_mode: str | None = None
    # Bytes moved after the plan, by the two mechanisms that do it: answer tokens the answer
    # ceiling (policy/ceiling.py) stored INT4 where the table kept them BF16, and pool rows
    # (one token in one layer group) the request shed when it outgrew its reservation with no
    # rows left (runtime/memory/admission.py). Both are 0 when the plan held.
    ceiling_fallback_tokens: int = 0
    shed_fallback_rows: int = 0

    @property
    def measured_b_prompt(self) -> float:
        """Share of the prompt's Full-KV bytes kept (realized B_P)."""
        full = self.prompt_full_kv_bytes
        return self.prompt_kv_bytes / full if full else 0.0

    @property
    def measured_b_answer(self) -> float:
        """Share of the generated tokens' Full-KV bytes kept (realized B_D)."""
        full = self.full_kv_bytes - self.prompt_full_kv_bytes
        return (self.kv_bytes - self.prompt_kv_bytes) / full if full > 0 else 0.0

    @property
    def tagger_fallbacks(self) -> int:
        return self.tag_counts.get("tagger_fallback", 0)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]

    def as_openai(self) -> dict[str, Any]:
        import json

        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }


@dataclass(frozen=True, slots=True)
class ChatResult:
    """``message`` is an OpenAI assistant message dict (``content`` and/or ``tool_calls``).

    ``text`` is the whole output; with calls, ``content`` is the text written before them
    (``runtime/turns/mixed_output.py``).
    """

    text: str
    tool_calls: tuple[ToolCall, ...]
    usage: Usage
    finish_reason: str  # "stop" | "length" | "tool_calls"
    token_ids: tuple[int, ...] = field(default=())

    @property
    def content(self) -> str | None:
        """The message text: the whole output, or with calls the text before them (None when
        there is none)."""
        return split_output(self.text)[0] if self.tool_calls else self.text

    @property
    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [c.as_openai() for c in self.tool_calls]
        return msg


@dataclass(frozen=True, slots=True)
class Delta:
    """A streamed piece of the answer: new text and the token ids that produced it."""

    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Finished:
    """The end of a request: generated ids, why it stopped, and the store's KV report."""

    token_ids: tuple[int, ...]
    text: str
    reason: str
    prompt_tokens: int
    prefilled_tokens: int
    kv: Any
    ttft_s: float
    tpot_s: float
    tag_counts: dict[str, int] = field(default_factory=dict)
    allocated_kv_bytes: int = 0  # the store's pool tensors when the request ended
    # [V] fp32 logits of each sampled token before any mask, when the request kept them
    step_logits: tuple[torch.Tensor, ...] | None = None
    stages: Any = None  # the session's StagePlan for this turn (policy/base.py), if it has one
    ceiling_fallback_tokens: int = 0  # answer tokens the answer ceiling stored INT4, not BF16
    shed_fallback_rows: int = 0  # pool rows (token x layer group) shedding demoted or released
