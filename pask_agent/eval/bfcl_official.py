"""The official BFCL harness scoring ``pask-agent serve``, beside our in-process harness on the
same cases (issue 35, item 5).

    make bfcl-official   # the side venv: bfcl-eval with its own dependency tree
    python -m pask_agent.eval.bfcl_official --split test --cases-per-category 50 \\
        --policy full --out results/bfcl_official

Three steps, one command, one commit:

1. **In process**: ``eval/bfcl_eval``'s workload over the cases, asked exactly as the official
   client asks the server: ``tool_choice`` left to ``auto`` and parallel calls allowed in every
   category (the official client sends neither field), ``max_tokens`` as the server's default.
2. **Official**: ``pask-agent serve`` in its own process; ``bfcl generate`` (the released
   ``bfcl-eval`` package, run from a side venv because it pins numpy 1.26 and dozens of API
   SDKs) asks it every case through the ``openai`` SDK, and ``bfcl evaluate --partial-eval``
   scores the answers with BFCL's own checker and files.
3. **Paired**: per case, right in both / one / neither, the bootstrap interval of the
   difference and McNemar's p; where answers differ, what the two calls were.

Beside them, the same cases through our harness as its headline numbers ask them
(``tool_choice="required"``, parallel calls only in the parallel categories, so those get the
array grammar): the gap between that column and the other two is what ``auto`` costs.

BFCL's registry has no "any OpenAI-compatible endpoint" entry; ``openbmb/MiniCPM-SALA-FC`` is
the entry whose handler is the plain Chat Completions function-calling client
(``OpenAICompletionsHandler``, which reads ``OPENAI_BASE_URL``), so the server is started under
that name. The name is a label: no MiniCPM weight is involved. That client converts the
functions itself (dots in names become underscores, ``dict`` becomes ``object``, a note on
Python syntax is appended to each description), so the two prompts are not byte-identical:
the differences in the table come from there.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from pask_agent.errors import ConfigError
from pask_agent.eval.bfcl import NON_LIVE_CATEGORIES, BfclCase
from pask_agent.eval.bfcl_eval import BfclWorkload
from pask_agent.eval.paired import PairedComparison, compare_paired
from pask_agent.record.provenance import provenance

OFFICIAL_MODEL = "openbmb/MiniCPM-SALA-FC"
DEFAULT_VENV = Path(".peers/bfcl/venv")
_INSTALL = "make bfcl-official  (a side venv with bfcl-eval==2026.3.23 and its dependencies)"


def bfcl_command(venv: Path) -> Path:
    """The ``bfcl`` executable of the side venv.

    Raises
    ------
    ConfigError
        The venv has no ``bfcl`` (the message names the command that makes it).
    """
    exe = venv.resolve() / "bin" / "bfcl"
    if not exe.is_file():
        raise ConfigError(f"no official BFCL harness at {exe}; make it with: {_INSTALL}")
    return exe


def official_env(project: Path, base_url: str) -> dict[str, str]:
    """The environment ``bfcl`` reads: its project folder and our server as the OpenAI API."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "BFCL_"))}
    return env | {
        "BFCL_PROJECT_ROOT": str(project),
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": "not-needed-on-loopback",
    }


def run_official(
    bfcl: Path, project: Path, base_url: str, cases: Sequence[BfclCase], threads: int
) -> None:
    """``bfcl generate`` on exactly these case ids, then ``bfcl evaluate`` of what it wrote."""
    ids: dict[str, list[str]] = {}
    for case in cases:
        ids.setdefault(case.category, []).append(case.id)
    project.mkdir(parents=True, exist_ok=True)
    (project / "test_case_ids_to_generate.json").write_text(json.dumps(ids, indent=1))
    env = official_env(project, base_url)
    generate = [str(bfcl), "generate", "--model", OFFICIAL_MODEL, "--run-ids"]
    generate += ["--temperature", "0", "--num-threads", str(threads), "--allow-overwrite"]
    evaluate = [str(bfcl), "evaluate", "--model", OFFICIAL_MODEL, "--partial-eval"]
    evaluate += ["--test-category", ",".join(ids)]
    for cmd in (generate, evaluate):
        done = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)
        (project / f"{cmd[1]}.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd[:2])} exited {done.returncode}: {done.stderr[-2000:]}"
            )


def _json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_official(project: Path, categories: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per case id: the official verdict and the calls as the official client decoded them.

    BFCL writes ``result/<model>/**/BFCL_v4_<cat>_result.json`` (one answer per line) and
    ``score/<model>/**/BFCL_v4_<cat>_score.json`` (a summary line, then one line per wrong case).

    Raises
    ------
    ConfigError
        A category has no result or score file (``bfcl`` wrote elsewhere or failed).
    """
    out: dict[str, dict[str, Any]] = {}
    for cat in categories:
        found = {
            kind: sorted(project.glob(f"{kind}/**/BFCL_v4_{cat}_{kind}.json"))
            for kind in ("result", "score")
        }
        if len(found["result"]) != 1 or len(found["score"]) != 1:
            raise ConfigError(f"BFCL wrote no single result and score file for {cat}: {found}")
        summary, *wrong = _json_lines(found["score"][0])
        failed = {row["id"]: row for row in wrong}
        for row in _json_lines(found["result"][0]):
            miss = failed.get(row["id"])
            out[row["id"]] = {
                "correct": miss is None,
                "answer": row.get("result"),
                "error": "" if miss is None else _error_text(miss),
            }
        if summary.get("total_count") != len([r for r in out if r.startswith(cat + "_")]):
            raise ConfigError(f"BFCL scored {summary} for {cat}, not the answers it generated")
    return out


def _error_text(row: Mapping[str, Any]) -> str:
    errors = row.get("error", [])
    text = "; ".join(map(str, errors)) if isinstance(errors, list) else str(errors)
    return f"{row.get('error_type', '')}: {text}"[:300]


def official_calls(answer: Any) -> list[dict[str, Any]] | None:
    """The official client's answer as ``{"name", "arguments"}`` dicts (``None``: text)."""
    if not isinstance(answer, list):
        return None
    calls = []
    for item in answer:
        ((name, args),) = item.items()
        calls.append(
            {"name": name, "arguments": json.loads(args) if isinstance(args, str) else args}
        )
    return calls


def same_calls(ours: Sequence[Mapping[str, Any]], theirs: list[dict[str, Any]] | None) -> bool:
    """Whether two answers make the same calls; names compared as the official client sends
    them (dots as underscores)."""
    if theirs is None:
        return not ours
    norm = [(c["name"].replace(".", "_"), c["arguments"]) for c in ours]
    return norm == [(c["name"].replace(".", "_"), c["arguments"]) for c in theirs]


def in_process(
    workload: BfclWorkload, policy: str, budget: float | None, out: Path
) -> dict[str, dict[str, Any]]:
    """Our harness over the workload's cases under one configuration; rows by case id."""
    from pask_agent.eval import harness

    run = harness.Run(out, references=(), restart=True)
    config = harness.Config(policy, 1.0 if budget is None else budget)
    anyio.run(lambda: harness.evaluate(workload, [config], run))
    rows = _json_lines(out.with_suffix(".jsonl"))
    return {r["id"]: r for r in rows}


def compare(
    cases: Sequence[BfclCase],
    ours: Mapping[str, Any],
    theirs: Mapping[str, Any],
    required: Mapping[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], PairedComparison]:
    """One row per case (both verdicts, both answers, same calls or not, how many calls each
    made) and the paired test, official against in process under the same ``auto``.
    ``required``: our headline harness's rows on the same cases, recorded beside them."""
    rows = []
    for case in cases:
        a, b = ours[case.id], theirs[case.id]
        calls_b = official_calls(b["answer"])
        row = {
            "id": case.id,
            "category": case.category,
            "in_process": bool(a["correct"]),
            "official": bool(b["correct"]),
            "same_calls": same_calls(a["calls"], calls_b),
            "in_process_n_calls": len(a["calls"]),
            "official_n_calls": 0 if calls_b is None else len(calls_b),
            "in_process_calls": a["calls"],
            "in_process_text": a["text"] if not a["calls"] else "",
            "official_answer": b["answer"],
            "official_error": b["error"],
        }
        if required is not None:
            row["required"] = bool(required[case.id]["correct"])
            row["required_n_calls"] = len(required[case.id]["calls"])
        rows.append(row)
    paired = compare_paired(
        {r["id"]: r["official"] for r in rows}, {r["id"]: r["in_process"] for r in rows}
    )
    return rows, paired


def to_markdown(report: Mapping[str, Any]) -> str:
    p = report["paired"]
    rows = report["rows"]
    lines = [
        "# The official BFCL harness against `pask-agent serve`, beside our in-process harness",
        "",
        f"- command: `{report['command']}`",
        f"- git commit: `{report['git_commit']}`; machine: {report['machine']}",
        f"- server: `pask-agent serve {' '.join(report['serve_args'])}`",
        f"- official: `bfcl-eval` {report['bfcl_version']} (`bfcl generate --model "
        f"{OFFICIAL_MODEL} --run-ids --temperature 0`, then `bfcl evaluate --partial-eval`), "
        "its own venv and checker files",
        f"- in process: `{report['in_process_settings']}`",
        f"- required: `{report.get('required_settings')}`",
        "",
        "Accuracy in % (right/n). *Official* and *in process* both leave `tool_choice` to "
        "`auto` and allow parallel calls, as the official client does; *required* is our "
        "headline harness on the same cases (a call required, the array grammar in the parallel "
        "categories only). *Answers with 2+ calls* counts, per column, the answers that made more "
        "than one call.",
        "",
        "| category | n | official | in process | same calls | required | answers with 2+ calls "
        "(official / in process / required) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for cat in [*report["categories"], "overall"]:
        sel = [r for r in rows if cat == "overall" or r["category"] == cat]
        n = len(sel)
        multi = " / ".join(
            str(sum(r.get(f"{k}_n_calls", 0) > 1 for r in sel))
            for k in ("official", "in_process", "required")
        )
        lines.append(
            f"| {cat} | {n} | {_pct(sel, 'official')} | {_pct(sel, 'in_process')} | "
            f"{sum(r['same_calls'] for r in sel)}/{n} | {_pct(sel, 'required')} | {multi} |"
        )
    lines += [
        "",
        "Paired, official minus in process: "
        f"{100 * p['difference']:+.1f} points, 95 % bootstrap interval "
        f"[{100 * p['ci_low']:+.1f}, {100 * p['ci_high']:+.1f}]; right only through the "
        f"official harness {p['only_a']}, only in process {p['only_b']}, McNemar p = "
        f"{p['p_value']:.3g}.",
        "",
        "## Cases the two harnesses score differently",
        "",
        "| case | official | in process | official answer | in-process calls |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r["official"] != r["in_process"]:
            ours = (
                json.dumps(r["in_process_calls"]) if r["in_process_calls"] else r["in_process_text"]
            )
            lines.append(
                f"| {r['id']} | {_mark(r['official'])} | {_mark(r['in_process'])} | "
                f"`{_cell(json.dumps(r['official_answer']))}` | `{_cell(ours)}` |"
            )
    lines += ["", *report["explanation"]]
    return "\n".join(lines) + "\n"


def _pct(rows: Sequence[Mapping[str, Any]], key: str) -> str:
    if not all(key in r for r in rows):
        return "not run"
    right = sum(r[key] for r in rows)
    return f"{100 * right / max(1, len(rows)):.1f} ({right}/{len(rows)})"


def _mark(ok: bool) -> str:
    return "right" if ok else "wrong"


def _cell(text: str, limit: int = 160) -> str:
    text = text.replace("|", "\\|").replace("`", "'")
    return text if len(text) <= limit else text[: limit - 1] + "…"


EXPLANATION = [
    "## Why the answers differ",
    "",
    "- **Between the two harnesses** (same model, same policy, same `auto`): the official "
    "client rewrites the function documents before it sends them: dots in names become "
    "underscores, BFCL's types become JSON Schema ones, and each description gains a note that "
    "the function is written in Python 3. The prompt differs by those tokens and greedy "
    "decoding follows them, e.g. `x**2` for `x^2` after the Python note, or an optional "
    "argument added or dropped. `same calls` compares the calls with names normalized; the "
    "official checker also reads the answer back through its own decoder.",
    "- **`auto` against `required`**: under `auto` the grammar lets an answer be text, one "
    "bare call or an array of calls (`grammars/json/tool_grammar.py`: forbidding the bare "
    "call pushes a small model into prose). Given the choice, the 0.5B model opens a single "
    "call with `{` and stops after it, so the parallel categories, which need 2 to 4 calls, "
    "score nothing under either harness; our headline harness requires a call and gives those "
    "categories the array grammar, and the model then writes several. A client that wants "
    'several calls from this model should send `tool_choice="required"`, as the README\'s '
    "example does.",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--split", default="test")
    p.add_argument("--cases-per-category", type=int, default=50)
    p.add_argument("--categories", default=",".join(NON_LIVE_CATEGORIES))
    p.add_argument("--model", default="default")
    p.add_argument("--policy", default="full")
    p.add_argument("--budget", type=float, default=None)
    p.add_argument("--max-tokens", type=int, default=200, help="the server's default max_tokens")
    p.add_argument("--threads", type=int, default=8, help="bfcl generate --num-threads")
    p.add_argument("--bfcl-venv", type=Path, default=DEFAULT_VENV)
    p.add_argument("--out", type=Path, default=Path("results/bfcl_official"))
    p.add_argument(
        "--work", type=Path, default=None, help="keep BFCL's own files here (default: a temp dir)"
    )
    args = p.parse_args(argv)
    bfcl = bfcl_command(args.bfcl_venv)
    categories = [c for c in args.categories.split(",") if c]
    workload = BfclWorkload(
        args.split, args.cases_per_category, tuple(categories), args.max_tokens,
        parallel=True, tool_choice="auto",
    )  # fmt: skip
    cases = list(workload.cases())
    stamp = provenance(argv if argv is None else ["-m", __spec__.name, *argv])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bfcl-official-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        ours = in_process(workload, args.policy, args.budget, work / "in_process")
        headline = dataclasses.replace(workload, parallel=None, tool_choice="required")
        required = in_process(headline, args.policy, args.budget, work / "in_process_required")
        theirs, serve_args, version = _official(args, bfcl, cases, work)
    rows, paired = compare(cases, ours, theirs, required)
    report = {
        **stamp,
        "serve_args": serve_args,
        "bfcl_version": version,
        "official_model_label": OFFICIAL_MODEL,
        "in_process_settings": {k: v for k, v in workload.settings().items() if k != "given"},
        "required_settings": {k: v for k, v in headline.settings().items() if k != "given"},
        "categories": categories,
        "paired": dataclasses.asdict(paired),
        "explanation": EXPLANATION,
        "rows": rows,
    }
    out = args.out.with_suffix(".json")
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    out.with_suffix(".md").write_text(to_markdown(report))
    print(to_markdown(report).split("## Cases")[0])
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


def _official(
    args: argparse.Namespace, bfcl: Path, cases: Sequence[BfclCase], tmp: Path
) -> tuple[dict[str, Any], list[str], str]:
    from pask_agent.eval.startup import served_process

    serve_args = ["--model", args.model, "--policy", args.policy, "--served-model-name"]
    serve_args += [OFFICIAL_MODEL, "--max-tokens", str(args.max_tokens), "--log-level", "warning"]
    serve_args += ["--max-batch", str(args.threads)]
    if args.budget is not None:
        serve_args += ["--budget", str(args.budget)]
    project = tmp / "bfcl"
    with served_process(serve_args, timeout_s=600, log=tmp / "serve.log") as server:
        run_official(bfcl, project, server.base_url, cases, args.threads)
    version = subprocess.run(
        [str(bfcl.with_name("python")), "-c", "import importlib.metadata as m; "
         "print(m.version('bfcl-eval'))"], capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    return read_official(project, sorted({c.category for c in cases})), serve_args, version


if __name__ == "__main__":
    raise SystemExit(main())
