"""What one request may ask for: a KV budget in (0, 1], a length within the model's context,
and a KV demand (what its policy will keep) within the runtime's capacity.

Why here and early: each check runs when the request is made, before anything queues, so a
request that can never run fails at once with a message that says what to change. Admission
(``Engine._admit``) still waits, never fails, for a request that fits once others finish;
it re-checks capacity only to keep the engine safe when driven directly.
"""

from __future__ import annotations

from pask_agent.errors import ConfigError, RequestTooLargeError


def check_budget(budget: float | None) -> float | None:
    """``None`` (the policy's default) or a KV budget ``B`` with ``0 < B <= 1``.

    Raises
    ------
    ConfigError
        ``budget`` is not a number in (0, 1].
    """
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, int | float) or not 0 < budget <= 1:
        raise ConfigError(
            f"budget {budget!r} is outside (0, 1]: B is the fraction of Full-KV bytes a request "
            "may keep (e.g. 0.33); pass 1.0 for Full KV or None for the policy's default"
        )
    return float(budget)


def check_context(prompt_tokens: int, max_new_tokens: int, context_tokens: int) -> None:
    """The prompt and the tokens it may generate fit the model's context (positions beyond
    the trained context give garbage, so we refuse rather than truncate silently).

    ``context_tokens`` <= 0 means the model states no limit.

    Raises
    ------
    RequestTooLargeError
        ``max_new_tokens``, the prompt, or their sum exceed the context.
    """
    if context_tokens <= 0:
        return
    if max_new_tokens > context_tokens:
        raise RequestTooLargeError(
            f"max_new_tokens={max_new_tokens} is above the model's context of {context_tokens} "
            "tokens; ask for fewer new tokens"
        )
    if prompt_tokens >= context_tokens:
        raise RequestTooLargeError(
            f"the prompt has {prompt_tokens} tokens but the model's context is {context_tokens} "
            "tokens; shorten the messages or the tool list"
        )
    if prompt_tokens + max_new_tokens > context_tokens:
        room = context_tokens - prompt_tokens
        raise RequestTooLargeError(
            f"the prompt has {prompt_tokens} tokens and max_new_tokens={max_new_tokens}, more "
            f"than the model's context of {context_tokens} tokens; pass max_new_tokens <= {room} "
            "or shorten the prompt"
        )


def check_kv_capacity(demand_bytes: int, capacity_bytes: int) -> None:
    """A request's demand (``runtime/memory/admission.py``) fits ``kv_capacity_bytes`` when it runs
    alone.

    Raises
    ------
    RequestTooLargeError
        It does not: no amount of waiting would admit it.
    """
    if demand_bytes > capacity_bytes:
        raise RequestTooLargeError(
            f"the request needs up to {demand_bytes} KV bytes (what its policy keeps of the "
            "prompt and max_new_tokens, plus the recent window and reserve) but "
            f"RuntimeConfig.kv_capacity_bytes is {capacity_bytes}, so it could never be "
            "admitted; shorten the prompt, lower max_new_tokens, lower the budget or raise "
            "kv_capacity_bytes"
        )
