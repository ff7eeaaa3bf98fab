"""Runtime results → OpenAI response objects: completions, stream chunks, usage, models.

``usage`` carries OpenAI's token counts plus a ``pask`` object with what the KV store measured
for the request (``Usage`` from the runtime): live KV bytes at the end, the same tokens' Full-KV
bytes, measured ``B`` = their ratio, peak bytes, timings and the structural buckets of the
generated tokens. Measured, never the configured budget: ``budget`` is shown beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pask_agent.runtime.turns.results import ChatResult, Usage


@dataclass(frozen=True, slots=True)
class Stamp:
    """What every object of one completion repeats."""

    id: str
    created: int
    model: str


def usage_dict(
    usage: Usage | None,
    *,
    prompt_tokens: int,
    completion_tokens: int,
    policy: str,
    budget: float | None,
) -> dict[str, Any]:
    """OpenAI usage with a ``pask`` object. Without a runtime ``Usage`` (a turn cut by a stop
    sequence ends before the store reports), the KV fields are ``None``."""
    cached = usage.prompt_tokens - usage.prefilled_tokens if usage is not None else 0
    pask: dict[str, Any] = {"policy": policy, "budget": budget}
    if usage is not None:
        pask |= {
            "measured_b": usage.measured_b,
            "kv_bytes": usage.kv_bytes,
            "full_kv_bytes": usage.full_kv_bytes,
            "peak_kv_bytes": usage.peak_kv_bytes,
            "ttft_s": usage.ttft_s,
            "tpot_s": usage.tpot_s,
            "tagger_fallbacks": usage.tagger_fallbacks,
            "tag_counts": dict(usage.tag_counts),
        }
    else:
        pask |= dict.fromkeys(("measured_b", "kv_bytes", "full_kv_bytes", "peak_kv_bytes"))
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
        "pask": pask,
    }


def completion(
    stamp: Stamp,
    *,
    content: str | None,
    result: ChatResult | None,
    finish_reason: str,
    usage: dict[str, Any],
) -> dict[str, Any]:
    """A ``chat.completion`` object with one choice; ``content`` may stand next to the calls
    (the text written before them)."""
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if result is not None and result.tool_calls:
        message["tool_calls"] = [c.as_openai() for c in result.tool_calls]
    return {
        "id": stamp.id,
        "object": "chat.completion",
        "created": stamp.created,
        "model": stamp.model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
        ],
        "usage": usage,
    }


def chunk(stamp: Stamp, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    """A ``chat.completion.chunk`` with one choice's delta."""
    return {
        "id": stamp.id,
        "object": "chat.completion.chunk",
        "created": stamp.created,
        "model": stamp.model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
    }


def usage_chunk(stamp: Stamp, usage: dict[str, Any]) -> dict[str, Any]:
    """The last chunk of a stream with ``stream_options.include_usage``: no choices."""
    return {
        "id": stamp.id,
        "object": "chat.completion.chunk",
        "created": stamp.created,
        "model": stamp.model,
        "choices": [],
        "usage": usage,
    }


def model_list(names: list[str], created: int, root: str) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"id": n, "object": "model", "created": created, "owned_by": "pask-agent", "root": root}
            for n in names
        ],
    }
