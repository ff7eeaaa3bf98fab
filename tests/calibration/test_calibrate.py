"""Calibration on a real model: teacher-forced replay agrees with the runtime, a whole
``pask-agent calibrate`` run writes a loadable table that resumes from its checkpoint, and bad
input is refused before any model work (SmolLM2-135M, traces recorded by the real runtime)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from sample_tools import convert_currency, get_weather

from pask_agent.calibration.agreement import Probe, ProbePolicy
from pask_agent.calibration.buckets import DecodeKeys
from pask_agent.calibration.calibrate import CalibrationConfig, calibrate
from pask_agent.calibration.inputs import file_digest
from pask_agent.calibration.interventions import Interventions
from pask_agent.calibration.measure import unshielded_prompt
from pask_agent.calibration.model_parts import ModelParts
from pask_agent.calibration.replay import TraceReplayer
from pask_agent.calibration.teacher import H, R, TraceContext
from pask_agent.errors import ConfigError
from pask_agent.grammars.tags import Tag
from pask_agent.policy.actions import Action
from pask_agent.policy.base import Policy, PolicyEnv
from pask_agent.policy.costs import PayloadCosts
from pask_agent.policy.pask import PaskPolicy
from pask_agent.policy.table import PolicyTable
from pask_agent.policy.tokenizer_hash import tokenizer_hash
from pask_agent.record.traces import TraceError, read_traces
from pask_agent.runtime.config import RuntimeConfig
from pask_agent.runtime.runtime import Runtime

QUESTIONS = [
    "What is the weather in Oslo?",
    "Convert 250 euros to US dollars.",
    "Weather in Paris in fahrenheit, please.",
    "How much is 99 GBP in JPY?",
    "Is it raining in Bergen right now?",
    "Convert 12.5 USD to CHF and tell me the weather in Zurich.",
]
WINDOW = 8
# SmolLM2 writes calls until the token limit (parallel calls allowed): every decision of a
# trace costs a decode step here and a replayed position in each calibration below.
MAX_NEW_TOKENS = 32


@pytest.fixture(scope="module")
def recorded(smollm2, tmp_path_factory) -> tuple[Path, Path]:
    """Four calibration and two development traces recorded by the runtime itself."""
    folder = tmp_path_factory.mktemp("traces")
    cal, dev = folder / "cal.jsonl", folder / "dev.jsonl"

    async def main() -> None:
        async with Runtime.open(smollm2, config=RuntimeConfig(window=WINDOW)) as rt:
            for i, q in enumerate(QUESTIONS):
                await rt.chat(
                    [{"role": "user", "content": q}],
                    tools=[get_weather, convert_currency],
                    tool_choice="required",
                    max_new_tokens=MAX_NEW_TOKENS,
                    record_traces=str(cal if i < 4 else dev),
                )

    anyio.run(main)
    return cal, dev


def _contexts(model: Any, path: Path) -> list[TraceContext]:
    replayer = TraceReplayer(model.tokenizer, int(model.model.config.vocab_size))
    parts = ModelParts.of(model.model, key_offsets=model.key_offsets)
    return [
        TraceContext(
            parts,
            replayer.replay(t, where=str(i)),
            sinks=4,
            window=WINDOW,
            token_text=lambda i: model.tokenizer.decode([i]),
            stop_ids=frozenset({model.tokenizer.eos_token_id}),
        ).build()
        for i, t in enumerate(read_traces(path))
    ]


@pytest.fixture(scope="module")
def cal_contexts(smollm2, recorded) -> list[TraceContext]:
    """The calibration traces replayed once (about 6 s, 0.2 GB) for the two tests below."""
    return _contexts(smollm2, recorded[0])


def test_replay_reproduces_the_recorded_greedy_decisions(cal_contexts) -> None:
    contexts = cal_contexts
    decisions = sum(int(c.valid.sum()) for c in contexts)
    reproduced = np.mean([c.stable_fraction for c in contexts])
    assert decisions > 30 and reproduced >= 0.95  # FP32 replay vs the runtime's own decoding
    for ctx in contexts:
        n, p = 3, ctx.trace.prompt_len
        modes = np.full((n, 3, p), H, np.int8)
        modes[2] = R  # row 2: the whole prompt released in every group
        out = ctx.run(Interventions(modes, None, 0, 0), distortion_group=0)
        assert not out.flipped[:2].any() and out.distortion[1] == 0.0  # rows 0, 1: all H
        assert out.distortion[2] > 0
    assert any(ctx.run(Interventions(_released(ctx), None, 0, 0)).flipped[1] for ctx in contexts)


def _released(ctx: TraceContext) -> np.ndarray:
    """Row 1 releases every prompt token the plan may release (not sinks, not the window)."""
    modes = np.full((2, 3, ctx.trace.prompt_len), H, np.int8)
    modes[1][:, unshielded_prompt(ctx.trace.prompt_len, ctx.sinks, ctx.window)] = R
    return modes


class _ReleaseSession:
    def __init__(self, sinks: int, window: int) -> None:
        self.sinks, self.window = sinks, window

    def plan_prefill(self, labels: list[str]) -> list[tuple[Action, ...]]:
        n = len(labels)
        keep = [i < self.sinks or i >= n - self.window for i in range(n)]
        return [(Action.H,) * 3 if k else (Action.R,) * 3 for k in keep]

    def on_token(self, tag: Any, *, is_stop: bool = False) -> tuple[Action, ...]:
        return (Action.H,) * 3


class ReleasePrompt(Policy):
    """Releases every prompt token outside sinks and window, in every layer group."""

    name = "release-prompt"
    needs_labels = True

    def start(self, env: PolicyEnv) -> _ReleaseSession:
        return _ReleaseSession(env.sinks, env.window)


def test_the_runtime_changes_an_answer_exactly_when_the_replay_says_so(
    smollm2, recorded, cal_contexts
) -> None:
    """The agreement check at unit size: releasing the prompt, free-running vs the proxy."""
    traces = read_traces(recorded[0])
    contexts = cal_contexts

    async def main() -> list[tuple[str, str]]:
        out = []
        config = RuntimeConfig(window=WINDOW, prefill_chunk_tokens=4096)
        async with Runtime.open(smollm2, config=config) as rt:
            for t in traces:
                kw: dict[str, Any] = dict(
                    tools=list(t.tools), tool_choice="required", max_new_tokens=MAX_NEW_TOKENS
                )
                same = await rt.chat(list(t.messages), policy="full", **kw)
                gone = await rt.chat(list(t.messages), policy=ReleasePrompt(), **kw)
                out.append((same.text, gone.text))
        return out

    runs = anyio.run(main)
    for t, ctx, (same, gone) in zip(traces, contexts, runs, strict=True):
        assert same == t.output  # Full KV reproduces the trace
        proxy = bool(ctx.run(Interventions(_released(ctx), None, 0, 0)).flipped[1])
        assert proxy == ("".join(gone.split()) != "".join(t.output.split()))


def test_probe_policy_degrades_one_bucket_in_one_group() -> None:
    keys = DecodeKeys(("schema_bearing",))
    env = PolicyEnv(PayloadCosts.from_dims(24, 2, 64), sinks=1, window=2)
    pre = ProbePolicy(Probe("prefill", 2, 1, Action.L), keys).start(env)
    labels = ["function_name", "protected_content", "function_name", "function_name", "x"]
    plan = pre.plan_prefill(labels)
    assert [a[1] for a in plan] == [Action.H, Action.H, Action.L, Action.H, Action.H]
    assert all(a[0] == a[2] == Action.H for a in plan)
    dec = ProbePolicy(Probe("decode", 0, 2, Action.R), keys).start(env)
    tag = Tag("schema_bearing", "dispatch_key", "critical", "no_lookahead")
    assert dec.on_token(tag) == (Action.H, Action.H, Action.R)
    other = Tag("pure_scaffold", "dispatch_key", "boundary", "no_lookahead")
    assert dec.on_token(other) == (Action.H,) * 3


def test_calibrate_writes_a_table_that_serves_and_resumes(smollm2, recorded, tmp_path) -> None:
    cal, dev = recorded
    out = tmp_path / "smollm2.json"
    config = CalibrationConfig(
        traces=(cal,),
        dev=(dev,),
        out=out,
        model="smollm2-135m",
        budget=0.5,
        window=WINDOW,
        candidates_per_path=4,
        progress=False,
    )
    result = calibrate(config)
    table = PolicyTable.load(
        out, model_id="SmolLM2-135M-Instruct", tokenizer_hash=tokenizer_hash(smollm2.tokenizer)
    )
    assert table.source == "calibrated" and table.budget_total == 0.5
    assert 0 < table.budget_decode <= 1 and 0 <= table.budget_prefill <= 1
    record = table.calibration
    assert record is not None and record["wall_seconds"] > 0 and record["cpu_count"] >= 1
    assert record["git_commit"] and record["command"]
    assert [(t["path"], t["sha256"], t["n"]) for t in record["traces"]] == [
        (str(cal), file_digest(cal), 4),
        (str(dev), file_digest(dev), 2),
    ]
    report = json.loads(result.report_path.read_text())
    assert report["decode_candidates"] and report["mismatch"]["decode"]["R"]["buckets"] > 0
    # the table serves: PASK with it decodes a tool call on the model it was made for (one
    # call: allowed parallel calls, SmolLM2 repeated this one until the 40-token limit)
    question = [{"role": "user", "content": "Weather in Rome?"}]

    async def serve() -> Any:
        async with Runtime.open(smollm2, config=RuntimeConfig(window=WINDOW)) as rt:
            return await rt.chat(
                question, tools=[get_weather], tool_choice="required", max_new_tokens=40,
                policy=PaskPolicy(table), budget=0.5, parallel_tool_calls=False,
            )  # fmt: skip

    served = anyio.run(serve)
    assert served.tool_calls and served.tool_calls[0].name == "get_weather"
    assert served.usage.measured_b < 1.0
    # a second run resumes: no trace is replayed again, and the same table comes out
    lines = config.checkpoint_path().read_text().count("\n")
    again = calibrate(config)
    assert config.checkpoint_path().read_text().count("\n") == lines
    second = PolicyTable.read(again.table_path)
    assert second.decode == table.decode and second.prefill == table.prefill
    assert second.calibration["runs"] == 2  # type: ignore[index]
    # the same tasks as Ray actors on a local instance give the same table
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = calibrate(
            replace(config, out=tmp_path / "ray.json", checkpoint=None, ray="local", workers=1)
        )
    finally:
        ray.shutdown()
    third = PolicyTable.read(on_ray.table_path)
    assert third.decode == table.decode and third.prefill == table.prefill
    assert third.reserve == table.reserve and third.budget_decode == table.budget_decode


def test_bad_input_is_refused_before_any_work(recorded, tmp_path) -> None:
    cal, dev = recorded
    base = dict(traces=(cal,), dev=(dev,), out=tmp_path / "t.json", model="smollm2-135m")
    with pytest.raises(ConfigError, match="budget"):
        calibrate(CalibrationConfig(**base, budget=0.0))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="budget"):
        calibrate(CalibrationConfig(**base, budget=1.5))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="budget"):
        calibrate(CalibrationConfig(**base, budget=(0.2, 1.5)))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="no development traces"):
        calibrate(CalibrationConfig(**{**base, "dev": ()}))  # type: ignore[arg-type]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(TraceError, match="holds no traces"):
        calibrate(CalibrationConfig(**{**base, "traces": (empty,)}))  # type: ignore[arg-type]
    broken = tmp_path / "broken.jsonl"
    broken.write_text(cal.read_text().splitlines()[0] + "\n{not json\n")
    with pytest.raises(TraceError, match=":2: not JSON"):
        calibrate(CalibrationConfig(**{**base, "traces": (broken,)}))  # type: ignore[arg-type]
    other = tmp_path / "other.jsonl"
    row = json.loads(cal.read_text().splitlines()[0])
    row["model"] = {"name": "default", "weights_sha256": "1d96" + "0" * 60}
    other.write_text(json.dumps(row) + "\n")
    with pytest.raises(TraceError, match="recorded with model"):
        calibrate(CalibrationConfig(**{**base, "traces": (other,)}))  # type: ignore[arg-type]
    assert not (tmp_path / "t.json").exists()


# Logits by which a pair's margin may differ between its batched and its alone replay: BF16
# rounding under another batch shape. Measured on 67 replayed pairs of two traces (all stages
# and groups, 2-core Xeon): at most 0.22 (0.06 in the top group), and one verdict at a margin
# of 0.004 came out the other way (issue 34 saw the same on another CPU).
NEAR_TIE = 0.25


def test_rescore_replays_each_stored_pair_alone_as_measurement_batched_it(
    smollm2, recorded, tmp_path
) -> None:
    """``agreement --rescore``: a pair replayed alone gets the verdict the batched measurement
    recorded for it (rows of a batch do not interact), and keeps its earlier verdict aside.

    Rows of a batch share no state, but the batch's shape picks other BF16 kernels, so a pair
    whose flip hangs on a near-tie may come out either way: margins must agree within
    ``NEAR_TIE``, verdicts wherever the margin is wider. One batch is enough to show it: the
    prompt probes of the top layer group (every label, R, and L where measurement replays it),
    on the first trace that has a flip beyond a near-tie.
    """
    from pask_agent.calibration.agreement import rescore
    from pask_agent.calibration.measure import measure_trace
    from pask_agent.calibration.worker import ReplayWorker, WorkerSpec

    # taken as correct (SmolLM2 runs on to the token limit): what matters here is that the
    # verdicts agree, not which answers were right
    by_where = {f"cal:{i}": replace(t, ok=True) for i, t in enumerate(read_traces(recorded[0]))}
    worker = ReplayWorker(WorkerSpec("smollm2-135m", "bfloat16", 4, 16, 0.01))
    keys = DecodeKeys.choose([worker.replayer.replay(t, where=w) for w, t in by_where.items()])
    for where, trace in by_where.items():
        ctx = worker.context(trace, where, keep=True)  # kept: rescore replays it alone
        measured = measure_trace(ctx, keys.of_trace(ctx.trace), keys.size, only=("prefill", 2))
        batched = measured.margin  # the probes measurement replayed, batched
        # the first trace with both kinds of verdict beyond a near-tie: which trace that is
        # depends on BF16 rounding (thread count, key offsets), so none is fixed in advance
        if any(m > NEAR_TIE for m in batched.values()) and any(
            m < -NEAR_TIE for m in batched.values()
        ):
            break
    assert batched and {n.split(":")[2] for n in batched} == {"2"}
    assert all((m > 0) <= measured.flipped[n] <= (m >= 0) for n, m in batched.items())
    assert any(m > NEAR_TIE for m in batched.values())  # some probe clearly breaks the trace
    assert any(m < -NEAR_TIE for m in batched.values())  # and some clearly does not
    pairs = [{"trace": where, "probe": name, "proxy_flip": None,
              "free_running_changed": False, "output": ""} for name in sorted(batched)]  # fmt: skip
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"pairs": pairs}))
    rows = rescore(earlier, {where: by_where[where]}, keys, "smollm2-135m", worker=worker)
    assert [r["probe"] for r in rows] == sorted(batched)
    for row in rows:
        margin = batched[row["probe"]]
        assert abs(row["proxy_flip_margin"] - margin) <= NEAR_TIE, (row, margin)
        if abs(margin) > NEAR_TIE:
            assert row["proxy_flip"] == measured.flipped[row["probe"]], (row, margin)
        assert (
            (row["proxy_flip_margin"] > 0) <= row["proxy_flip"] <= (row["proxy_flip_margin"] >= 0)
        )
        assert row["proxy_flip_before"] is None


def test_calibrate_measures_sql_traces_beside_tool_calls(smollm2, recorded, tmp_path) -> None:
    """Traces that `pask-agent traces record --sql` writes calibrate with the tool-call ones:
    the SQL prompts are replayed through the assistant's own grammar and measured, and their
    tokens count in the table's support."""
    from pask_agent.eval.sql_data import SqlQuestionSet, load_sample_questions
    from pask_agent.eval.trace_recording import record_sql
    from pask_agent.record.traces import write_traces

    cal, dev = recorded
    data = load_sample_questions(split="dev")
    questions = SqlQuestionSet(data.questions[:2], data.databases)

    async def main() -> list[Any]:
        async with Runtime.open(smollm2, config=RuntimeConfig(window=WINDOW)) as rt:
            return await record_sql(rt, questions, max_new_tokens=MAX_NEW_TOKENS)

    traces = anyio.run(main)  # what `pask-agent traces record --sql` writes, on this model
    assert len(traces) == 2 and all(t.sql_schema for t in traces)
    sql = tmp_path / "sql.jsonl"
    write_traces(sql, traces)
    config = CalibrationConfig(
        traces=(cal, sql), dev=(dev, sql), out=tmp_path / "mixed.json", model="smollm2-135m",
        budget=(0.25, 0.5), window=WINDOW, candidates_per_path=2, progress=False,
    )  # fmt: skip
    result = calibrate(config)
    table = PolicyTable.read(result.table_path)
    # two budgets, one pass over the development traces: a prompt plan each, the looser one
    # also at the top level, each selected at the B_P the runtime plans for its budget
    assert [p.budget_total for p in table.plans or ()] == [0.25, 0.5]
    assert table.budget_total == 0.5 and table.prefill == table.plans[1].prefill  # type: ignore[index]
    assert table.plans[0].budget_prefill < table.plans[1].budget_prefill  # type: ignore[index]
    assert table.at_budget(0.3).budget_total == 0.25 and table.at_budget(0.6).budget_total == 0.5
    assert [t["n"] for t in table.calibration["traces"]] == [4, 2, 2, 2]  # type: ignore[index]
    report = json.loads(result.report_path.read_text())
    assert report["cal_traces"] == 6 and report["dev_traces"] == 4
    # the SQL traces are development groups of their own (BIRD difficulty), weighted equally
    assert {t.group for t in traces} <= set(report["dev_groups"])
