"""Does the teacher-forced proxy predict what free-running decoding does? (issue 10, part 3)

Runtime-V counts a trace as broken when a teacher-forced, BF16 replay under a probe flips a
grammar-masked argmax. The server decodes for real, in FP32, and feeds its own tokens back.
This command takes (trace, probe) pairs whose proxy verdict calibration already wrote to its
checkpoint, decodes each one through the real ``Runtime`` with a policy that applies exactly
that probe, and reports how often the two verdicts agree — overall, among proxy flips and
among proxy non-flips (the pairs are stratified: flips are rare, so a uniform sample would
mostly measure the easy case).

    python -m pask_agent.calibration.agreement \\
        --traces calibration_data/traces/bfcl_calibration.jsonl \\
        --checkpoint calibration_data/policies/default.json.checkpoint.jsonl \\
        --pairs 200 --out results/calibration_agreement
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from pask_agent.calibration.buckets import DecodeKeys
from pask_agent.calibration.replay import TraceReplayer
from pask_agent.grammars.tags import SPAN_LABELS, Tag
from pask_agent.policy.actions import Action
from pask_agent.policy.base import Actions, Policy, PolicyEnv
from pask_agent.record.traces import Trace

if TYPE_CHECKING:
    from pask_agent.calibration.worker import ReplayWorker

_HIGH: Actions = (Action.H, Action.H, Action.H)


@dataclass(frozen=True)
class Probe:
    stage: str  # "decode" | "prefill"
    bucket: int
    group: int
    action: Action

    @classmethod
    def parse(cls, name: str) -> Probe:
        stage, bucket, group, action = name.split(":")
        return cls(stage, int(bucket), int(group), Action.parse(action))

    @property
    def name(self) -> str:
        return f"{self.stage}:{self.bucket}:{self.group}:{self.action.name}"


class ProbeSession:
    """All H, except the probe's bucket in the probe's layer group."""

    def __init__(self, probe: Probe, keys: DecodeKeys, sinks: int, window: int) -> None:
        self.probe, self.keys, self.sinks, self.window = probe, keys, sinks, window
        acts = [Action.H] * 3
        acts[probe.group] = probe.action
        self._degraded: Actions = tuple(acts)  # type: ignore[assignment]

    def plan_prefill(self, labels: Sequence[str]) -> Sequence[Actions]:
        n, p = len(labels), self.probe
        if p.stage != "prefill":
            return [_HIGH] * n
        label = SPAN_LABELS[p.bucket]
        return [
            self._degraded if x == label and self.sinks <= i < n - self.window else _HIGH
            for i, x in enumerate(labels)
        ]

    def on_token(self, tag: Tag | None, *, is_stop: bool = False) -> Actions:
        if is_stop or self.probe.stage != "decode":
            return _HIGH
        return self._degraded if self.keys.index_of(tag) == self.probe.bucket else _HIGH


@dataclass(frozen=True)
class ProbePolicy(Policy):
    """Applies one calibration probe in the real runtime (not registered: a measuring tool)."""

    probe: Probe | None = None
    keys: DecodeKeys | None = None
    name = "probe"
    needs_tags = True
    needs_labels = True
    stores_int4 = True  # a probe may apply L: centered, as PASK is served

    def start(self, env: PolicyEnv) -> ProbeSession:
        assert self.probe is not None and self.keys is not None
        return ProbeSession(self.probe, self.keys, env.sinks, env.window)


def _normalized(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return "".join(text.split())


def choose_pairs(
    checkpoint: Path, traces: list[tuple[str, Trace]], pairs: int, seed: int
) -> list[tuple[str, Probe, bool]]:
    """Half proxy flips, half proxy non-flips (as available), seeded, from the checkpoint's
    measurements of correct traces."""
    measured: dict[str, dict[str, Any]] = {}
    for line in checkpoint.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["stage"] == "measure" and row["result"]["ok"]:
            measured[row["where"]] = row["result"]
    flips, steady = [], []
    for where, _ in traces:
        if where not in measured:
            continue
        result = measured[where]
        flipped = set(result["flipped"])
        for name in sorted(result["distortion"]):
            (flips if name in flipped else steady).append(
                (where, Probe.parse(name), name in flipped)
            )
    rng = random.Random(seed)
    rng.shuffle(flips)
    rng.shuffle(steady)
    take = min(len(flips), pairs // 2)
    return flips[:take] + steady[: pairs - take]


async def _decode_all(
    model: str, chosen: list[tuple[str, Probe, bool]], by_where: dict[str, Trace], keys: DecodeKeys
) -> list[str]:
    from pask_agent.runtime.config import RuntimeConfig
    from pask_agent.runtime.runtime import Runtime

    outputs = [""] * len(chosen)
    # One prefill chunk, as the replay assumes (the prompt forward at full precision).
    config = RuntimeConfig(prefill_chunk_tokens=1 << 14, max_batch=16)
    async with Runtime.open(model, config=config) as rt:

        async def one(i: int, where: str, probe: Probe) -> None:
            t = by_where[where]
            result = await rt.chat(
                list(t.messages),
                tools=list(t.tools),
                tool_choice=t.tool_choice,
                parallel_tool_calls=t.parallel_tool_calls,
                policy=ProbePolicy(probe, keys),
                max_new_tokens=max(200, len(t.output_token_ids) + 8),
            )
            outputs[i] = result.text

        limiter = anyio.CapacityLimiter(16)

        async def bounded(i: int, where: str, probe: Probe) -> None:
            async with limiter:
                await one(i, where, probe)

        async with anyio.create_task_group() as tg:
            for i, (where, probe, _) in enumerate(chosen):
                tg.start_soon(bounded, i, where, probe)
    return outputs


def main(argv: list[str] | None = None) -> int:
    from pask_agent.calibration.inputs import load_traces, model_vocab_size
    from pask_agent.record.provenance import provenance
    from pask_agent.runtime.models.identity import model_identity
    from pask_agent.runtime.models.loading import load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, required=True, help="the calibration traces")
    ap.add_argument("--checkpoint", type=Path, required=True, help="calibration checkpoint")
    ap.add_argument("--model", default="default")
    ap.add_argument("--pairs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True, help="results stem (.json and .md)")
    ap.add_argument(
        "--rescore",
        type=Path,
        help="an earlier report (.json): keep its pairs and free-running answers, and replay "
        "only the proxy with the current code (after a change to the flip rule)",
    )
    args = ap.parse_args(argv)
    traces = load_traces([args.traces], model_identity(args.model))
    tokenizer = load_tokenizer(args.model)
    replayer = TraceReplayer(tokenizer, model_vocab_size(args.model, tokenizer))
    keys = DecodeKeys.choose([r for r in (replayer.replay(t, where=w) for w, t in traces) if r.ok])
    by_where = dict(traces)
    if args.rescore is not None:
        rows = rescore(args.rescore, by_where, keys, args.model)
    else:
        chosen = choose_pairs(args.checkpoint, traces, args.pairs, args.seed)
        outputs = anyio.run(_decode_all, args.model, chosen, by_where, keys)
        rows = []
        for (where, probe, proxy), text in zip(chosen, outputs, strict=True):
            changed = _normalized(text) != _normalized(by_where[where].output)
            rows.append({"trace": where, "probe": probe.name, "proxy_flip": proxy,
                         "free_running_changed": changed, "output": text})  # fmt: skip
    report = summarize(rows)
    report.update(provenance())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(
        json.dumps({**report, "pairs": rows}, indent=1) + "\n", encoding="utf-8"
    )
    args.out.with_suffix(".md").write_text(markdown(report), encoding="utf-8")
    print(markdown(report))
    return 0


def rescore(
    earlier: Path,
    by_where: dict[str, Trace],
    keys: DecodeKeys,
    model: str,
    *,
    worker: ReplayWorker | None = None,
) -> list[dict[str, Any]]:
    """The earlier report's pairs, each with the proxy verdict the current code gives it and
    its margin in logits (``proxy_flip_margin``: a near-tie's verdict is rounding's to
    decide), and the verdict it had, as ``proxy_flip_before``.

    ``worker``: one already loaded for ``model`` with the served protection (it keeps the
    traces it replays); None loads one.
    """
    from pask_agent.calibration.worker import ReplayWorker, WorkerSpec
    from pask_agent.errors import ConfigError

    pairs = json.loads(earlier.read_text(encoding="utf-8"))["pairs"]
    missing = sorted({p["trace"] for p in pairs} - set(by_where))
    if missing:
        raise ConfigError(f"{earlier}: pairs name traces not in --traces: {missing[:3]}")
    from pask_agent.runtime.config import RuntimeConfig

    served = RuntimeConfig()  # the protection and continue-calls rule the pairs were decoded with
    spec = WorkerSpec(model, "bfloat16", served.sinks, served.window, served.continue_calls_at)
    if worker is None:
        worker = ReplayWorker(spec)
    elif replace(worker.spec, threads=0) != spec:
        raise ConfigError(f"rescore replays as served, {spec}; the worker given has {worker.spec}")
    rows = []
    for pair in sorted(pairs, key=lambda p: p["trace"]):
        flip, margin = worker.probe(by_where[pair["trace"]], pair["trace"], keys, pair["probe"])
        rows.append({**pair, "proxy_flip_before": pair["proxy_flip"], "proxy_flip": flip,
                     "proxy_flip_margin": round(margin, 4)})  # fmt: skip
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def share(sel: list[dict[str, Any]]) -> float | None:
        if not sel:
            return None
        return round(sum(r["proxy_flip"] == r["free_running_changed"] for r in sel) / len(sel), 4)

    flips = [r for r in rows if r["proxy_flip"]]
    steady = [r for r in rows if not r["proxy_flip"]]
    return {
        "n_pairs": len(rows),
        "n_proxy_flip": len(flips),
        "n_proxy_steady": len(steady),
        "agreement": share(rows),
        "agreement_on_proxy_flips": share(flips),
        "agreement_on_proxy_steady": share(steady),
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Teacher-forced proxy vs free-running decoding",
        "",
        f"Command: `{report.get('command', '')}`  ",
        f"Commit: `{report.get('git_commit', '')}`; machine: {report.get('machine', '')}",
        "",
        "| pairs | proxy flips | proxy non-flips | agreement | on proxy flips | on non-flips |",
        "|---|---|---|---|---|---|",
        f"| {report['n_pairs']} | {report['n_proxy_flip']} | {report['n_proxy_steady']} | "
        f"{report['agreement']} | {report['agreement_on_proxy_flips']} | "
        f"{report['agreement_on_proxy_steady']} |",
        "",
        "A pair is (recorded correct trace, one probe: a bucket × layer group degraded to L or R). "
        "Proxy: BF16 teacher forcing flips a grammar-masked argmax in a way that changes the "
        "answer. Free-running: the FP32 runtime, decoding under that probe alone, writes an "
        "answer that differs from the recorded one (JSON-equal answers count as unchanged).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
