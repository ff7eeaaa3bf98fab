"""The harness's report: summaries per configuration, paired statistics against reference
policies, and the four files of a run (``<out>.jsonl``, ``.json``, ``.md``, ``.png``).

Every file says where it came from (``record/provenance.py``): each JSONL row its commit, the
JSON and Markdown the command, commit and machine, the PNG the same in its text chunks. Files
of separate runs (shards, or runs made apart) merge into one report with ``merge``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pask_agent.errors import ConfigError, PaskError
from pask_agent.eval.harness_rows import Row, RowFile, read_rows
from pask_agent.eval.paired import PairedComparison, compare_paired, paired_table
from pask_agent.eval.plots import plot_accuracy_vs_budget
from pask_agent.record.provenance import provenance

if TYPE_CHECKING:
    from pask_agent.eval.harness import Workload


@dataclass(frozen=True, slots=True)
class Summary:
    """One configuration over its cases: accuracy per group and overall, well-formed answers,
    and the measured budget three ways: ``measured_b`` = Σ live / Σ Full-KV bytes over cases,
    ``mean_b`` and ``max_b`` over the cases' own measured B; ``measured_b_prompt`` and
    ``measured_b_answer`` are the realized B_P and B_D (None where rows did not record the
    prompt's bytes). ``seconds`` sums the cases' latencies."""

    config: str
    label: str
    policy: str
    budget: float
    cases: int
    correct: int
    accuracy: dict[str, float]
    overall: float
    valid_rate: float
    errors: int
    measured_b: float
    mean_b: float
    max_b: float
    measured_b_prompt: float | None
    measured_b_answer: float | None
    fallbacks: dict[str, int]
    seconds: float


def summarize_rows(rows: Sequence[Row]) -> list[Summary]:
    """One summary per configuration, in the order configurations first appear."""
    by: dict[tuple[str, float], list[Row]] = {}
    for r in rows:
        by.setdefault((r.config, r.budget), []).append(r)
    return [_summary(rs) for rs in by.values()]


def _summary(rows: Sequence[Row]) -> Summary:
    groups: dict[str, list[bool]] = {}
    for r in rows:
        groups.setdefault(r.group, []).append(r.correct)
    full = sum(r.measured.full_kv_bytes for r in rows)
    measured = [r.measured for r in rows if r.measured.full_kv_bytes or r.measured.measured_b]
    per_case = [m.measured_b for m in measured]  # requests that raised measured nothing
    pooled = (
        sum(r.measured.kv_bytes for r in rows) / full
        if full
        else (sum(m.pooled_b for m in measured) / len(measured) if measured else 0.0)
    )  # rows without byte counts (older SQL files): the mean of their own ratios
    split = [r.measured for r in rows if r.measured.prompt_full_kv_bytes]
    b_p = b_d = None
    if split:
        b_p = sum(m.prompt_kv_bytes for m in split) / sum(m.prompt_full_kv_bytes for m in split)
        answer_full = sum(m.full_kv_bytes - m.prompt_full_kv_bytes for m in split)
        answer_kept = sum(m.kv_bytes - m.prompt_kv_bytes for m in split)
        b_d = answer_kept / answer_full if answer_full else None
    fallbacks: Counter[str] = Counter()
    for r in rows:
        fallbacks.update(r.measured.fallbacks)
    first = rows[0]
    return Summary(
        config=first.config,
        label=first.label,
        policy=first.policy,
        budget=first.budget,
        cases=len(rows),
        correct=sum(r.correct for r in rows),
        accuracy={g: sum(v) / len(v) for g, v in groups.items()},
        overall=sum(r.correct for r in rows) / len(rows),
        valid_rate=sum(r.valid_call for r in rows) / len(rows),
        errors=sum(bool(r.error) and not r.valid_call for r in rows),
        measured_b=pooled,
        mean_b=sum(per_case) / len(per_case) if per_case else 0.0,
        max_b=max(per_case, default=0.0),
        measured_b_prompt=b_p,
        measured_b_answer=b_d,
        fallbacks=dict(fallbacks),
        seconds=round(sum(r.seconds for r in rows), 2),
    )


def paired_against(
    rows: Sequence[Row], references: Sequence[str]
) -> dict[str, list[tuple[str, PairedComparison]]]:
    """Per reference (a configuration or policy name): every other configuration against it on
    the cases both answered, at the same budget (a reference run at one budget, as Full KV is,
    pairs with every budget). A configuration that is itself an earlier reference is not paired
    again, so ``full,pask_plain`` gives pask vs full, pask_plain vs full, pask vs pask_plain."""
    configs: dict[tuple[str, float], dict[str, bool]] = {}
    names: dict[tuple[str, float], tuple[str, str]] = {}
    for r in rows:
        configs.setdefault((r.config, r.budget), {})[r.id] = r.correct
        names[(r.config, r.budget)] = (r.label, r.policy)
    out: dict[str, list[tuple[str, PairedComparison]]] = {}
    earlier: list[tuple[str, float]] = []
    for ref in references:
        mine = [k for k in configs if k[0] == ref] or [k for k in configs if names[k][1] == ref]
        if not mine:
            continue
        pairs = []
        for key, correct in configs.items():
            if key in mine or key in earlier:
                continue
            same = [k for k in mine if k[1] == key[1]] or (mine if len(mine) == 1 else [])
            if same:
                pairs.append((names[key][0], compare_paired(correct, configs[same[0]])))
        out[ref] = pairs
        earlier += mine
    return out


def markdown_table(summaries: Sequence[Summary], *, groups: Sequence[str] = ()) -> str:
    """Accuracy (%) per group and overall, well-formed answers and measured ``B``."""
    seen = list(dict.fromkeys(g for s in summaries for g in s.accuracy))
    cols = [g for g in groups if g in seen] + [g for g in seen if g not in groups]
    head = ["configuration", "target B", *cols, "overall", "valid", "measured B", "mean B",
            "max B", "B_P", "B_D", "fallbacks", "n", "s/case"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        row = [s.config, f"{s.budget:.2f}"]
        row += [f"{100 * s.accuracy[c]:.1f}" if c in s.accuracy else "–" for c in cols]
        row += [f"{100 * s.overall:.1f} ({s.correct}/{s.cases})", f"{100 * s.valid_rate:.1f}"]
        row += [f"{b:.3f}" for b in (s.measured_b, s.mean_b, s.max_b)]
        stages = (s.measured_b_prompt, s.measured_b_answer)
        row += ["–" if b is None else f"{b:.3f}" for b in stages]
        latency = f"{s.seconds / s.cases:.1f}" if s.seconds else "–"  # older rows: unknown
        row += [str(sum(s.fallbacks.values())), str(s.cases), latency]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def write_report(
    out: Path,
    workload: Workload,
    rows: Sequence[Row],
    run: Mapping[str, Any],
    settings: Mapping[str, Any],
    references: Sequence[str],
    note: str,
) -> list[Summary]:
    """Write ``<out>.json``, ``<out>.md`` and (with rows) ``<out>.png``; the rows' JSONL is the
    run's own (``RowFile``). ``run`` is the provenance taken when the run started."""
    out.parent.mkdir(parents=True, exist_ok=True)
    summaries = summarize_rows(rows)
    paired = paired_against(rows, references)
    extra_json, extra_md = workload.report(rows) if rows else ({}, "")
    commits = Counter(r.git_commit for r in rows)
    body = {
        "workload": workload.name, "note": note, **run, "settings": dict(settings),
        "row_commits": dict(commits), "summaries": [asdict(s) for s in summaries],
        **{f"paired_vs_{ref}": {n: asdict(c) for n, c in p} for ref, p in paired.items()},
        **extra_json,
    }  # fmt: skip
    out.with_suffix(".json").write_text(
        json.dumps(body, indent=2, default=str) + "\n", encoding="utf-8"
    )
    groups = getattr(workload, "groups", ())
    md = [f"# {workload.title}", "", markdown_table(summaries, groups=groups)]
    for ref, pairs in paired.items():
        if pairs:
            table = paired_table(pairs, reference=ref)
            md += [f"## Against {ref} on the same cases (paired)", "", table]
    if extra_md:
        md.append(extra_md)
    if rows:
        png = plot_accuracy_vs_budget(
            summaries, out.with_suffix(".png"), title=workload.title, metadata=_png_text(run)
        )
        md.append(f"![accuracy vs measured B]({png.name})\n")
    if len(commits) > 1:
        md.append("Rows by commit: " + ", ".join(f"`{c}` {n}" for c, n in commits.items()) + "\n")
    md.append(f"{note}\n\nCommand: `{run['command']}` at commit `{run['git_commit']}` on "
              f"{run['machine']}.\n")  # fmt: skip
    out.with_suffix(".md").write_text("\n".join(md), encoding="utf-8")
    return summaries


def _png_text(run: Mapping[str, Any]) -> dict[str, str]:
    return {"Source": f"{run['command']} at commit {run['git_commit']} on {run['machine']}"}


def part_path(part: Path, workload: Workload) -> Path:
    """The JSONL of a part named by its file, its output stem, or its output folder."""
    if part.suffix == ".jsonl":
        return part
    return (workload.stem(part) if part.is_dir() else part).with_suffix(".jsonl")


def merge(
    workload: Workload,
    parts: Sequence[Path],
    out: Path,
    *,
    references: Sequence[str] = ("full",),
    keep_first: bool = False,
    transform: Any = None,
) -> list[Summary]:
    """Join the rows of runs made apart (shards, or earlier runs) into one set of files, with
    summaries and paired statistics over all of them; ``transform(rows)`` may rewrite them
    first (a re-vote). Full KV's rows come first, then configurations as they appear; within
    one, cases in the workload's order when it knows them all (else as the parts hold them).

    Raises
    ------
    ConfigError
        A part is missing, or two parts hold the same (configuration, budget, case) and
        ``keep_first`` is off.
    """
    rows: dict[tuple[str, float, str], Row] = {}
    notes = []
    for part in parts:
        path = part_path(part, workload)
        for r in read_rows(path, workload):
            if r.key in rows and not keep_first:
                raise ConfigError(f"{part}: {r.key} appears in two parts")
            rows.setdefault(r.key, r)
        meta = path.with_suffix(".json")
        if meta.is_file():
            info = json.loads(meta.read_text(encoding="utf-8"))
            notes.append(f"{part}: {info.get('command', '')} at {info.get('git_commit', '')}")
        else:
            notes.append(str(part))
    merged = list(rows.values())
    if transform is not None:
        merged = list(transform(merged))
    order = list(dict.fromkeys((r.config, r.budget) for r in merged))
    full = {(r.config, r.budget) for r in merged if r.policy == "full"}
    order.sort(key=lambda c: c not in full)
    merged = [r for c in order for r in merged if (r.config, r.budget) == c]
    position = _case_order(workload)
    if all(r.id in position for r in merged):  # shards back in case order, as one run wrote
        rank = {c: i for i, c in enumerate(order)}
        merged.sort(key=lambda r: (rank[(r.config, r.budget)], position[r.id]))
    settings = {"workload": workload.name, "merged_from": [str(p) for p in parts]}
    write_files(out, workload, merged, settings, references, "Merged from: " + "; ".join(notes))
    return summarize_rows(merged)


def _case_order(workload: Workload) -> dict[str, int]:
    """Each case's place in the workload's case list (empty when its cases cannot be read)."""
    try:
        return {workload.case_id(c): i for i, c in enumerate(workload.cases())}
    except PaskError:
        return {}


def write_files(
    out: Path,
    workload: Workload,
    rows: Sequence[Row],
    settings: Mapping[str, Any],
    references: Sequence[str] = ("full",),
    note: str = "",
) -> dict[str, Any]:
    """All four files for ``rows`` made elsewhere (merged, re-voted), with this command's
    provenance; returns the JSON written."""
    RowFile(out.with_suffix(".jsonl"), workload).rewrite(rows)
    write_report(out, workload, rows, provenance(), settings, references, note)
    return json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
