"""The eval harness: ordered concurrent runs, resume, shard + merge, provenance in every file,
the flags the modules and ``pask-agent eval`` share, and files written before the harness.

The runs use a workload written here in a few lines (sums asked as structured outputs) on
SmolLM2 through a real runtime, one case in flight at a time, so an interrupted, resumed or
sharded run decodes each case exactly as an uninterrupted one does and the rows must agree.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from importlib import import_module
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

from pask_agent.cli import build_parser
from pask_agent.cli.eval import EVALS
from pask_agent.errors import ConfigError
from pask_agent.eval.harness import (
    Config,
    Measured,
    Row,
    Run,
    Scored,
    Shard,
    Workload,
    configurations,
    evaluate,
    run_ordered,
)
from pask_agent.eval.harness_args import Defaults, add_arguments, run_eval
from pask_agent.eval.harness_report import merge, summarize_rows
from pask_agent.eval.harness_rows import read_rows

# its subprocesses load a model of their own: this worker's default model goes meanwhile
pytestmark = pytest.mark.usefixtures("no_default_model_here")

SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
CONFIGS = configurations(["full", "streaming"], [0.5])


@dataclass(frozen=True, slots=True)
class Sum:
    id: str
    a: int
    b: int


@dataclass(frozen=True)
class SumWorkload(Workload):
    """Additions asked through ``Runtime.call``: how small a workload is."""

    n: int = 4

    name: ClassVar[str] = "sums"
    title: ClassVar[str] = "Sums"

    def cases(self) -> list[Sum]:
        return [Sum(f"s{i}", i + 2, 3 * i + 1) for i in range(self.n)]

    def group(self, case: Sum) -> str:
        return "small" if case.a < 4 else "large"

    async def run(self, rt: Any, case: Sum, config: Config) -> Any:
        return await rt.call(
            SCHEMA, f"What is {case.a} + {case.b}? Answer with the number.",
            policy=config.policy, budget=config.budget, max_new_tokens=10, with_usage=True,
        )  # fmt: skip

    def score(self, case: Sum, answer: Any) -> Scored:
        value, usage = answer
        right = value["answer"] == case.a + case.b
        return Scored(right, True, "" if right else f"got {value['answer']}",
                      Measured.of([usage]), {"answer": value["answer"]})  # fmt: skip


def add_sum_arguments(p: argparse.ArgumentParser) -> None:
    """This module as an eval command (``--workers`` runs its ``run`` in each process)."""
    add_arguments(p, Defaults(out="sums", policies="full,streaming", budgets="0.5"))


def run(args: argparse.Namespace) -> int:
    return run_eval(args, SumWorkload(), module=__name__, log=lambda _: None)


def run_sums(out: Path, model: Any, **options: Any) -> list[Any]:
    from pask_agent.runtime.config import RuntimeConfig

    log = options.pop("log", lambda _: None)
    small = RuntimeConfig(max_batch=4, kv_capacity_bytes=32 * 2**20)
    run = Run(out, concurrency=1, **options)
    return anyio.run(
        lambda: evaluate(SumWorkload(), CONFIGS, run, model=model, runtime_config=small, log=log)
    )


def rows_of(out: Path) -> list[dict[str, Any]]:
    """The written rows without their latency (the one field two runs may not share)."""
    lines = out.with_suffix(".jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k != "seconds"} for x in lines]


@pytest.fixture(scope="module")
def whole(smollm2: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("whole") / "sums"
    run_sums(out, smollm2)
    return out


# -- the runner --------------------------------------------------------------------------------
def test_results_come_back_in_item_order_with_concurrency_bounded() -> None:
    async def go(concurrency: int | None) -> tuple[list[float], list[int], int]:
        finished: list[int] = []
        live = peak = 0

        async def work(delay: float) -> float:
            nonlocal live, peak
            live += 1
            peak = max(peak, live)
            await anyio.sleep(delay)
            live -= 1
            return 10 * delay

        done = await run_ordered(
            [0.3, 0.2, 0.1], work, concurrency=concurrency,
            on_result=lambda i, _: finished.append(i),
        )  # fmt: skip
        return done, finished, peak

    assert anyio.run(go, None) == ([3.0, 2.0, 1.0], [2, 1, 0], 3)  # all at once, in order
    assert anyio.run(go, 1) == ([3.0, 2.0, 1.0], [0, 1, 2], 1)
    with pytest.raises(ConfigError, match="concurrency"):
        anyio.run(go, 0)


def test_configurations_run_budget_by_budget_with_full_once() -> None:
    plan = configurations(["full", "pask", "snapkv"], [0.33, 0.5])
    assert [(c.policy_name, c.budget) for c in plan] == [
        ("full", 1.0), ("pask", 0.33), ("snapkv", 0.33), ("pask", 0.5), ("snapkv", 0.5),
    ]  # fmt: skip
    with pytest.raises(ConfigError, match=r"\(0, 1\]"):
        configurations(["pask"], [1.5])
    with pytest.raises(ConfigError, match="at least one"):
        configurations([], [0.5])
    assert Shard.parse("1/3").of(list(range(7))) == [1, 4]
    for bad in ("3/3", "1-2", "x/2"):
        with pytest.raises(ConfigError, match="--shard"):
            Shard.parse(bad)


def test_summary_measures_budget_three_ways_and_counts_fallbacks() -> None:
    def row(case: str, group: str, ok: bool, kv: int, full: int, prompt: tuple[int, int]) -> Row:
        m = Measured.values(
            kv_bytes=kv, full_kv_bytes=full, measured_b=kv / full, pooled_b=kv / full,
            prompt_kv_bytes=prompt[0], prompt_full_kv_bytes=prompt[1],
            fallbacks={"tagger_fallbacks": 1},
        )  # fmt: skip
        return Row(case, group, "h2o", "h2o", 0.33, ok, True, "", m, 2.0, "abc")

    (s,) = summarize_rows([
        row("a", "parallel", True, 30, 100, (20, 80)),
        row("b", "parallel", False, 10, 300, (5, 200)),
        row("c", "multiple", True, 40, 100, (0, 0)),  # recorded no prompt split
    ])  # fmt: skip
    assert s.accuracy == {"parallel": 0.5, "multiple": 1.0}
    assert (s.overall, s.correct, s.cases) == (pytest.approx(2 / 3), 2, 3)
    assert s.measured_b == pytest.approx(80 / 500)  # Σ live / Σ full
    assert s.mean_b == pytest.approx((0.3 + 10 / 300 + 0.4) / 3) and s.max_b == 0.4
    assert s.measured_b_prompt == pytest.approx(25 / 280)  # only rows with a prompt split
    assert s.measured_b_answer == pytest.approx(15 / 120)
    assert s.fallbacks == {"tagger_fallbacks": 3} and s.label == "h2o @ 0.33"


# -- runs on SmolLM2 ---------------------------------------------------------------------------
def test_every_written_file_says_where_it_came_from(whole: Path) -> None:
    body = json.loads(whole.with_suffix(".json").read_text())
    commit = body["git_commit"]
    assert commit and body["command"] and body["machine"] and body["workload"] == "sums"
    rows = rows_of(whole)
    assert len(rows) == 8 and {r["git_commit"] for r in rows} == {commit}
    assert body["row_commits"] == {commit: 8}
    assert f"at commit `{commit}`" in whole.with_suffix(".md").read_text()
    png = whole.with_suffix(".png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and commit.encode() in png  # a tEXt chunk
    assert [(r["config"], r["id"]) for r in rows] == [
        (c, f"s{i}") for c in ("full", "streaming") for i in range(4)
    ]  # configurations in plan order, cases in case order
    for r in rows:  # every row records what the runtime measured
        assert r["full_kv_bytes"] > r["prompt_full_kv_bytes"] > 0 and r["tagger_fallbacks"] == 0
        assert (r["measured_b"] == 1.0) == (r["policy"] == "full")
    assert set(body["paired_vs_full"]) == {"streaming @ 0.50"}


def test_a_stopped_run_resumes_to_the_rows_of_an_uninterrupted_one(
    whole: Path, smollm2: Any, tmp_path: Path
) -> None:
    class Stop(Exception):
        pass

    out, written = tmp_path / "sums", []

    def stop_after_three(line: str) -> None:
        if line.startswith("["):  # one line per finished row
            written.append(line)
            if len(written) == 3:
                raise Stop

    with pytest.raises(BaseException) as stopped:
        run_sums(out, smollm2, log=stop_after_three)
    assert (
        stopped.group_contains(Stop)
        if isinstance(stopped.value, BaseExceptionGroup)
        else (stopped.type is Stop)
    )
    assert len(rows_of(out)) == 3
    with out.with_suffix(".jsonl").open("a") as f:
        f.write('{"id": "s3", "categ')  # a kill in the middle of writing a row
    ran: list[str] = []
    run_sums(out, smollm2, log=lambda line: ran.append(line) if line.startswith("[") else None)
    assert len(ran) == 8 - 3  # rows already written are not run again
    assert rows_of(out) == rows_of(whole)
    with pytest.raises(ConfigError, match=r"other settings \(n\)"):
        anyio.run(lambda: evaluate(SumWorkload(n=3), CONFIGS, Run(out), model=smollm2))


def test_shards_merged_equal_the_unsharded_run(whole: Path, smollm2: Any, tmp_path: Path) -> None:
    parts = [tmp_path / f"shard{i}" for i in range(2)]
    for i, part in enumerate(parts):
        run_sums(part, smollm2, shard=Shard(i, 2))
        assert {r["id"] for r in rows_of(part)} == {f"s{k}" for k in range(i, 4, 2)}
    merged = tmp_path / "merged"
    summaries = merge(SumWorkload(), parts, merged)
    assert rows_of(merged) == rows_of(whole)
    before = json.loads(whole.with_suffix(".json").read_text())["summaries"]
    latency = ("seconds",)
    assert [{k: v for k, v in asdict(s).items() if k not in latency} for s in summaries] == [
        {k: v for k, v in s.items() if k not in latency} for s in before
    ]
    with pytest.raises(ConfigError, match="appears in two parts"):
        merge(SumWorkload(), [parts[0], parts[0]], tmp_path / "twice")


def test_workers_run_shards_in_processes_and_merge_them(whole: Path, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_sum_arguments(parser)
    out = tmp_path / "sums"
    argv = ["--workers", "2", "--concurrency", "1", "--model", "smollm2-135m", "--out", str(out)]
    assert run(parser.parse_args(argv)) == 0
    for i in range(2):  # each worker wrote its shard, which a rerun would resume
        shard = rows_of(tmp_path / f"sums-shard{i}of2")
        assert [r["id"] for r in shard] == [f"s{k}" for k in range(i, 4, 2)] * 2
    merged = rows_of(out)  # one thread per worker: near-tie tokens may differ from `whole`
    assert [(r["config"], r["id"]) for r in merged] == [
        (r["config"], r["id"]) for r in rows_of(whole)
    ]
    assert json.loads(out.with_suffix(".json").read_text())["settings"]["merged_from"] == [
        str(tmp_path / f"sums-shard{i}of2") for i in range(2)
    ]
    with pytest.raises(ConfigError, match="drop --shard"):
        run(parser.parse_args([*argv, "--shard", "0/2"]))


# -- flags -------------------------------------------------------------------------------------
def _options(parser: argparse.ArgumentParser) -> dict[str, Any]:
    return {
        a.dest: (tuple(a.option_strings), a.default) for a in parser._actions if a.dest != "help"
    }


@pytest.mark.parametrize("name", sorted(EVALS))
def test_cli_and_module_share_one_flag_set(name: str) -> None:
    module = import_module(EVALS[name][0])
    own = argparse.ArgumentParser()
    module.add_arguments(own)
    cli = build_parser()
    sub = next(a for a in cli._actions if isinstance(a, argparse._SubParsersAction))
    evals = next(
        a for a in sub.choices["eval"]._actions if isinstance(a, argparse._SubParsersAction)
    )
    mine = _options(evals.choices[name])
    mine.pop("func", None)
    assert mine == _options(own)
    shared = argparse.ArgumentParser()
    add_arguments(shared, Defaults(out="x"))
    for dest, (flags, _) in _options(shared).items():  # every shared flag, under its names
        assert set(flags) <= set(mine[dest][0]), (dest, flags)
    argv = ["--policies", "full,pask", "--budgets", "0.2,0.33", "--out", "o", "--shard", "1/2"]
    parsed = vars(cli.parse_args(["eval", name, *argv]))
    assert {k: v for k, v in parsed.items() if k not in ("command", "eval", "func")} == vars(
        own.parse_args(argv)
    )


# -- files written before the harness ----------------------------------------------------------
OLD_BFCL = {
    "id": "simple_python_1",
    "category": "simple_python",
    "policy": "pask",
    "budget": 0.33,
    "correct": True,
    "valid_call": True,
    "calls": [{"name": "math.factorial", "arguments": {"number": 5}}],
    "text": '{"name": "math.factorial", "arguments": {"number": 5}}',
    "finish_reason": "tool_calls",
    "prompt_tokens": 194,
    "completion_tokens": 17,
    "kv_bytes": 750016,
    "full_kv_bytes": 2592768,
    "measured_b": 0.2892723143759874,
    "error": "",
    "tagger_fallbacks": 0,
    "prompt_kv_bytes": 547136,
    "prompt_full_kv_bytes": 2383872,
}  # fmt: skip  (a line of results/bfcl_test50_pask.jsonl)


def test_bfcl_rows_written_before_the_harness_merge(tmp_path: Path) -> None:
    from pask_agent.eval.bfcl_eval import BfclWorkload

    old = tmp_path / "old"
    full = {**OLD_BFCL, "policy": "full", "budget": 1.0, "measured_b": 1.0, "correct": False}
    old.with_suffix(".jsonl").write_text(json.dumps(OLD_BFCL) + "\n" + json.dumps(full) + "\n")
    summaries = merge(BfclWorkload(split="test"), [old], tmp_path / "merged")
    assert [(s.config, s.budget, s.overall) for s in summaries] == [
        ("full", 1.0, 0.0), ("pask", 0.33, 1.0),
    ]  # fmt: skip
    (row,) = [r for r in read_rows(tmp_path / "merged.jsonl", BfclWorkload()) if r.policy == "pask"]
    assert row.measured.pooled_b == row.measured.measured_b == OLD_BFCL["measured_b"]
    assert row.detail["calls"] == OLD_BFCL["calls"] and row.group == "simple_python"
    body = json.loads((tmp_path / "merged.json").read_text())
    assert body["paired_vs_full"]["pask @ 0.33"]["only_a"] == 1


def test_sql_records_written_before_the_harness_merge(tmp_path: Path) -> None:
    from pask_agent.eval.sql_eval import main

    old = {
        "config": "pask@0.33 k=1", "policy": "pask", "budget": 0.33, "id": "shop-02",
        "db": "shop", "difficulty": "simple", "question": "?", "gold_sql": "SELECT 1",
        "predicted_sql": "SELECT 1", "correct": True, "error": None, "completion_tokens": 60,
        "measured_b": 0.31, "pooled_b": 0.3, "seconds": 12.0, "repairs": 0,
        "candidates": [{"sql": "SELECT 1", "digest": "f4", "votes": 1, "error": None,
                        "correct": True}],
    }  # fmt: skip
    full = {**old, "config": "full k=1", "policy": "full", "budget": None, "correct": False,
            "error": "SQLite error: no such column: x"}  # fmt: skip
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n" + json.dumps(full) + "\n")
    assert main(["--records", str(path), "--out", str(tmp_path / "out")]) == 0
    body = json.loads((tmp_path / "out" / "sql_eval.json").read_text())
    assert [c["config"] for c in body["configs"]] == ["full k=1", "pask@0.33 k=1"]
    assert body["configs"][0]["errors"] == 1 and body["configs"][1]["max_measured_b"] == 0.31
    assert body["paired_vs_full"]["pask k=1 @ 0.33"]["only_a"] == 1


def test_device_flag_reaches_the_runtime_and_a_missing_gpu_is_a_typed_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--device`` (every harness eval) places the model and pools; asked for a GPU torch
    cannot see, the run stops with the typed error (exit 2), and a name torch cannot parse
    is refused the same way."""
    import torch

    from pask_agent.eval import bfcl_eval

    base = ["--split", "dev", "--cases-per-category", "1", "--categories", "simple_python",
            "--policies", "full", "--model", "smollm2-135m"]  # fmt: skip
    base += ["--out", str(tmp_path / "r")]
    assert bfcl_eval.main([*base, "--device", "gpu0"]) == 2
    assert "is not a torch device" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert bfcl_eval.main([*base, "--device", "cuda"]) == 2
        assert "torch sees no CUDA device" in capsys.readouterr().err
    settings = json.loads((tmp_path / "r.json").read_text())["settings"]
    assert settings["device"] in ("gpu0", "cuda")  # recorded: never resumed as a CPU run's


def test_weights_label_the_rows_and_merge_beside_fp32(
    whole: Path, smollm2: Any, tmp_path: Path
) -> None:
    """``--weights int8`` loads the model that way, records it, and names its rows apart, so
    its run merges with an fp32 run into one table paired against fp32 Full KV."""
    from pask_agent.eval.harness_report import merge

    out = tmp_path / "int8"
    run_sums(out, "smollm2-135m", weights="int8")
    assert {r["config"] for r in rows_of(out)} == {"full int8 weights", "streaming int8 weights"}
    assert json.loads(out.with_suffix(".json").read_text())["settings"]["weights"] == "int8"
    merge(SumWorkload(), [whole, out], tmp_path / "both")
    body = json.loads((tmp_path / "both.json").read_text())
    configs = [c["config"] for c in body["summaries"]]
    assert configs[:2] == ["full", "full int8 weights"]
    assert any("full int8 weights" in key for key in body["paired_vs_full"])
