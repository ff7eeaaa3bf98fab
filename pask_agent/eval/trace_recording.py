"""Record BFCL cases as calibration traces at Full KV (``pask-agent traces record``).

Calibration replays what the model actually wrote under the reference cache, so the recorder
serves every case of one split partition at Full KV, in the runtime's default output format,
and stores the output ids with a ``reference`` the BFCL checker can score again and ``ok``,
its verdict on this output.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from pask_agent.calibration.traces import Trace, messages_json, write_traces
from pask_agent.errors import ConfigError
from pask_agent.eval.bfcl import NON_LIVE_CATEGORIES, BfclCase, ast_check
from pask_agent.eval.splits import cases_in

ALIASES = {"simple": "simple_python"}


def bfcl_categories(text: str) -> list[str]:
    """Parse ``simple,multiple,...`` (``simple`` means ``simple_python``).

    Raises
    ------
    ConfigError
        An unknown or empty category list.
    """
    names = [ALIASES.get(c.strip(), c.strip()) for c in text.split(",") if c.strip()]
    bad = [c for c in names if c not in NON_LIVE_CATEGORIES]
    if not names or bad:
        raise ConfigError(
            f"unknown BFCL categories {bad or text!r}; use any of simple, multiple, parallel, "
            "parallel_multiple"
        )
    return names


def case_trace(case: BfclCase, request: dict[str, Any], result: Any, model: Any) -> Trace:
    """One served BFCL case as a trace: its output ids, the checker's verdict and a reference
    to score a replayed output against."""
    calls = [{"name": c.name, "arguments": c.arguments} for c in result.tool_calls]
    ok = bool(calls) and result.finish_reason == "tool_calls" and ast_check(case, calls)
    return Trace(
        messages=tuple(messages_json(request["messages"])),
        output=result.text,
        output_token_ids=tuple(result.token_ids),
        model=model,
        tools=tuple(t.to_openai() for t in request["tools"]),
        tool_choice=request["tool_choice"],
        parallel_tool_calls=request["parallel_tool_calls"],
        ok=ok,
        reference={"checker": "bfcl_ast", "case_id": case.id, "category": case.category},
        id=case.id,
    )


async def record_cases(
    rt: Any, cases: Sequence[BfclCase], *, max_new_tokens: int = 200
) -> list[Trace]:
    """Serve ``cases`` at Full KV together (the runtime batches) and return their traces."""
    traces: list[Trace | None] = [None] * len(cases)

    async def one(i: int, case: BfclCase) -> None:
        request = case.request()
        result = await rt.chat(**request, policy="full", max_new_tokens=max_new_tokens)
        traces[i] = case_trace(case, request, result, rt.model_id)

    async with anyio.create_task_group() as tg:
        for i, case in enumerate(cases):
            tg.start_soon(one, i, case)
    return [t for t in traces if t is not None]


def record_bfcl(
    categories: Sequence[str],
    split: str,
    out: Path,
    *,
    model: str = "default",
    per_category: int | None = None,
    max_new_tokens: int = 200,
) -> list[Trace]:
    """Record one partition of the fixed split and write ``out`` (replacing it)."""
    from pask_agent.runtime.engine import RuntimeConfig
    from pask_agent.runtime.runtime import Runtime

    cases = cases_in(split, per_category=per_category, categories=categories)

    async def main() -> list[Trace]:
        config = RuntimeConfig(max_batch=max(16, min(len(cases), 64)))
        async with Runtime.open(model, config=config) as rt:
            return await record_cases(rt, cases, max_new_tokens=max_new_tokens)

    traces = anyio.run(main)
    write_traces(out, traces)
    return traces
