"""How to ask the default model for tool calls: output format × prompt × decoding, at Full KV.

A policy comparison is only as good as its reference. Full KV answered 40 % of the old 40 dev
cases and 10 % of parallel ones, because the 0.5B model closes the array after one call, so this
study tries the levers that do not touch the model, on the dev split only:

* output format: a bare JSON call / array (``json``, the runtime's format), the template's own
  ``<tool_call>`` blocks (``tool_call``), and the fenced JSON the model writes unprompted
  (``fenced``);
* prompt: the template's default system line, a line saying a request may need several calls,
  BFCL's own instruction for prompting models, and one worked example;
* decoding: greedy, or continuing the array of calls whenever the model gives "another call" at
  least probability τ (``RuntimeConfig.continue_calls_at``);
* ``+par`` lets every case answer with an array (``parallel_tool_calls=True`` as a chat app
  would): on single-call categories an extra call fails the checker, so this measures whether
  a threshold makes the model over-call.

Usage::

    python -m pask_agent.eval.fullkv_variants --variants json,json+tau0.01 \\
        --cases-per-category 10 --out results/fullkv_variants

Each variant's rows are appended to ``<out>.jsonl`` and the table ``<out>.md`` / ``<out>.json``
is rewritten after each, so an interrupted study keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio

from pask_agent.errors import ConfigError
from pask_agent.eval.bfcl import NON_LIVE_CATEGORIES, BfclCase
from pask_agent.eval.bfcl_eval import BfclWorkload, load_split
from pask_agent.eval.harness import Config, Row, run_cases
from pask_agent.eval.harness_report import Summary, markdown_table, summarize_rows
from pask_agent.record.provenance import provenance

SEVERAL = (
    "You are a helpful assistant. A request may need several function calls: make one call "
    "for each item the user asks about (each city, each value, each person), and answer with "
    "all of them."
)
BFCL = (
    "You are an expert in composing functions. You are given a question and a set of possible "
    "functions. Based on the question, you will need to make one or more function/tool calls "
    "to achieve the purpose. You should only return the function calls in your response. "
    "Continue to output functions to call until you have fulfilled the user's request to the "
    "best of your ability."
)
EXAMPLE = (
    SEVERAL + '\n\nExample: asked "Find the area of circles with radius 2 and 5." with a function '
    'circle_area(radius), answer [{"name": "circle_area", "arguments": {"radius": 2}}, '
    '{"name": "circle_area", "arguments": {"radius": 5}}]'
)
PROMPTS: dict[str, str | None] = {
    "template": None,
    "several": SEVERAL,
    "bfcl": BFCL,
    "example": EXAMPLE,
}
FORMATS = ("json", "tool_call", "fenced")


@dataclass(frozen=True, slots=True)
class Variant:
    """One way of asking: ``name`` is ``format[+prompt][+tauX]``, e.g. ``json+several+tau0.01``."""

    name: str
    fmt: str
    prompt: str
    tau: float | None
    all_parallel: bool = False  # "+par": every case may answer with several calls

    @classmethod
    def parse(cls, name: str) -> Variant:
        parts = name.split("+")
        fmt, prompt, tau, all_parallel = parts[0], "template", None, False
        if fmt not in FORMATS:
            raise ConfigError(f"variant {name!r}: format must be one of {', '.join(FORMATS)}")
        for part in parts[1:]:
            if part in PROMPTS:
                prompt = part
            elif part == "par":
                all_parallel = True
            elif part.startswith("tau"):
                try:
                    tau = float(part[3:])
                except ValueError as exc:
                    raise ConfigError(f"variant {name!r}: bad threshold {part!r}") from exc
            else:
                raise ConfigError(
                    f"variant {name!r}: unknown part {part!r}; prompts: {', '.join(PROMPTS)}; "
                    "thresholds: tau<number>"
                )
        return cls(name, fmt, prompt, tau, all_parallel)


def wrapped_output(fmt: str, rt: Any) -> Callable[[BfclCase], tuple[Any, Any]] | None:
    """For a non-JSON format, a function giving each case its grammar and parser."""
    if fmt == "json":
        return None
    from pask_agent.grammars.compiler import make_compiler
    from pask_agent.grammars.json.tool_grammar import tool_call_ebnf
    from pask_agent.runtime.turns.constraint import OutputSpec

    tok = rt.tokenizer
    compiler = make_compiler(tok, rt.engine.vocab_size, allow=("<tool_call>", "</tool_call>"))

    def output(case: BfclCase) -> tuple[Any, Any]:
        ebnf = tool_call_ebnf(case.tools(), tool_choice="required", parallel=False)
        body = ebnf.replace("root ::= ", "one_call ::= ", 1)
        if fmt == "tool_call":
            block = '"<tool_call>\\n" one_call "\\n</tool_call>"'
            root = f'root ::= {block} ("\\n" {block})*' if case.parallel else f"root ::= {block}"
        else:
            inner = '"[" one_call (", " one_call)* "]"' if case.parallel else "one_call"
            root = f'root ::= "```json\\n" {inner} "\\n```"'
        compiled = compiler.compile_grammar(root + "\n" + body, root_rule_name="root")
        return OutputSpec("tools", compiled, None, case.tools()), parse_wrapped

    return output


def parse_wrapped(text: str) -> list[dict[str, Any]]:
    """Calls from ``<tool_call>`` blocks or a fenced JSON block; [] when it does not parse."""
    blocks = re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, flags=re.S)
    if not blocks:
        fenced = re.fullmatch(r"```json\n(.*)\n```", text.strip(), flags=re.S)
        blocks = [fenced.group(1)] if fenced else []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        try:
            value = json.loads(block)
        except json.JSONDecodeError:
            return []
        calls.extend(value if isinstance(value, list) else [value])
    return calls


async def run_variant(
    variant: Variant, cases: Sequence[BfclCase], *, model: str, max_new_tokens: int
) -> tuple[list[Row], Summary]:
    from pask_agent.runtime.config import RuntimeConfig
    from pask_agent.runtime.runtime import Runtime

    config = RuntimeConfig(max_batch=max(16, len(cases)), continue_calls_at=variant.tau)
    async with Runtime.open(model, config=config) as rt:
        workload = BfclWorkload(
            max_new_tokens=max_new_tokens,
            system=PROMPTS[variant.prompt],
            output=wrapped_output(variant.fmt, rt),
            output_name=variant.fmt,
            parallel=True if variant.all_parallel else None,
        )
        rows = await run_cases(workload, rt, cases, Config("full", 1.0), run=provenance())
    (summary,) = summarize_rows(rows)
    return rows, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pask_agent.eval.fullkv_variants")
    parser.add_argument("--variants", required=True, help="comma-separated variant names")
    parser.add_argument("--cases-per-category", type=int, default=10)
    parser.add_argument("--categories", default=",".join(NON_LIVE_CATEGORIES))
    parser.add_argument("--split", default="dev", choices=("calibration", "dev"))
    parser.add_argument("--model", default="default")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--out", default="results/fullkv_variants")
    args = parser.parse_args(argv)
    variants = [Variant.parse(v.strip()) for v in args.variants.split(",") if v.strip()]
    categories = [c.strip() for c in args.categories.split(",") if c.strip()]
    cases = load_split(args.split, args.cases_per_category, categories)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    store = out.with_suffix(".json")
    done: dict[str, Any] = json.loads(store.read_text()) if store.is_file() else {"runs": {}}
    for variant in variants:
        rows, summary = anyio.run(
            lambda v=variant: run_variant(
                v, cases, model=args.model, max_new_tokens=args.max_new_tokens
            )
        )
        with out.with_suffix(".jsonl").open("a", encoding="utf-8") as f:
            for r in rows:
                f.write(
                    json.dumps({"variant": variant.name, **r.to_json(BfclWorkload.group_key)})
                    + "\n"
                )
        done["runs"][f"{variant.name}@{args.split}:{','.join(categories)}"] = {
            "variant": variant.name,
            "split": args.split,
            "categories": categories,
            "cases_per_category": args.cases_per_category,
            "summary": asdict(summary),
            **provenance(),
        }
        store.write_text(json.dumps(done, indent=1) + "\n", encoding="utf-8")
        _write_markdown(out.with_suffix(".md"), done)
        print(f"{variant.name}: {summary.overall:.3f} {summary.accuracy}", flush=True)
    return 0


def _write_markdown(path: Path, done: dict[str, Any]) -> None:
    runs = list(done["runs"].values())
    table = markdown_table([_summary(r) for r in runs])
    lines = [
        "# Full KV on the BFCL dev split: how the model is asked",
        "",
        table,
        "",
        "| variant | split | categories | cases/category | commit |",
        "|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['variant']} | {r['split']} | {', '.join(r['categories'])} | "
            f"{r['cases_per_category']} | {r['git_commit'][:10]} |"
        )
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _summary(run: dict[str, Any]) -> Summary:
    """A stored run's summary as the harness's (runs stored before it lack a few fields)."""
    s = {k: v for k, v in run["summary"].items() if k in Summary.__dataclass_fields__}
    return Summary(**{
        "correct": round(s["overall"] * s["cases"]), "errors": 0, "fallbacks": {},
        "measured_b_prompt": None, "measured_b_answer": None,
        **s, "config": run["variant"], "label": run["variant"], "policy": "full",
    })  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
