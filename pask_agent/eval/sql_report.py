"""What the SQL eval reports beyond the harness's table: per configuration, accuracy by
difficulty and database, SQLite's refusals for column bindings, questions a shown example
already answered, the vote's k-curve and ceiling, and runs paired against earlier baseline
runs (``--baseline``) by question id, with how often their candidates wrote the same SQL.

The JSON keeps the keys of the reports written before the harness (``configs``,
``paired_vs_baseline``), so scripts that read them keep working.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from pask_agent.eval.harness_rows import Row
from pask_agent.eval.paired import compare_paired, paired_table
from pask_agent.eval.sql_scoring import (
    accuracy,
    binding_errors,
    candidates_of,
    display_name,
    k_curve,
    same_candidates,
    vote_ceiling,
)


def summarize(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Per configuration: accuracy overall, by difficulty and by database; measured B."""
    by_config: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        by_config[display_name(r)].append(r)

    def acc(rs: list[Row]) -> dict[str, Any]:
        return accuracy(r.correct for r in rs)

    out = []
    for name, rs in by_config.items():
        groups: dict[str, dict[str, list[Row]]] = {"difficulty": {}, "db": {}}
        for r in rs:
            groups["difficulty"].setdefault(r.group, []).append(r)
            groups["db"].setdefault(str(r.detail.get("db", "")), []).append(r)
        k = max(len(candidates_of(r)) for r in rs)
        out.append(
            {
                "config": name,
                "policy": rs[0].policy,
                "budget": rs[0].budget,
                "overall": acc(rs),
                "example_matches": sum(bool(r.detail.get("example_match")) for r in rs),
                "outside_examples": acc([r for r in rs if not r.detail.get("example_match")]),
                "by_difficulty": {d: acc(v) for d, v in sorted(groups["difficulty"].items())},
                "by_db": {d: acc(v) for d, v in sorted(groups["db"].items())},
                "errors": sum(not r.valid_call for r in rs),
                "binding_errors": binding_errors(rs),
                "mean_measured_b": round(sum(r.measured.measured_b for r in rs) / len(rs), 4),
                "max_measured_b": max(r.measured.measured_b for r in rs),
                "k_curve": k_curve(rs, range(1, k + 1)),
                "vote_ceiling": vote_ceiling(rs),
                "seconds": round(sum(r.seconds for r in rs), 1),
            }
        )
    return out


def paired_against(rows: Sequence[Row], baseline: Sequence[Row]) -> list[tuple[str, Any]]:
    """Each configuration against the baseline run, paired by question id."""
    base = {r.id: r.correct for r in baseline}
    by_config: dict[str, dict[str, bool]] = defaultdict(dict)
    for r in rows:
        by_config[display_name(r)][r.id] = r.correct
    return [(name, compare_paired(hits, base)) for name, hits in by_config.items()]


def sections(rows: Sequence[Row], baselines: Sequence[Sequence[Row]]) -> tuple[dict[str, Any], str]:
    """The SQL report's JSON fields and Markdown sections."""
    summaries = summarize(rows)
    lines = ["## SQL details", ""]
    lines += ["Candidates SQLite refused, and how many for a column not in its tables:", ""]
    for s in summaries:
        b = s["binding_errors"]
        lines.append(
            f"- {s['config']}: {b['candidates_refused']} of {b['candidates_total']} candidates "
            f"refused, {b['candidates']} for a column binding; {b['answers']} chosen answers"
        )
    lines += ["", "Questions whose gold result equals a worked example's the prompt showed:", ""]
    for s in summaries:
        o = s["outside_examples"]
        rest = f"{100 * o['accuracy']:.1f} % ({o['correct']}/{o['n']})" if o["n"] else "-"
        lines.append(f"- {s['config']}: {s['example_matches']}; accuracy on the others {rest}")
    lines += ["", "Voting among the first k candidates (accuracy %):", ""]
    for s in summaries:
        curve = ", ".join(f"k={k}: {100 * v:.1f}" for k, v in s["k_curve"].items())
        c = s["vote_ceiling"]
        lines.append(
            f"- {s['config']}: {curve}; any candidate right (no vote can do better): "
            f"{100 * c['accuracy']:.1f} ({c['correct']}/{c['n']})"
        )
    paired: list[dict[str, Any]] = []
    for base in baselines:
        pairs = paired_against(rows, base)
        name = display_name(base[0])
        same = same_candidates(rows, base)
        paired += [
            {"baseline": name, "config": n, **asdict(c), "same_candidates": same.get(n, (0, 0))}
            for n, c in pairs
        ]
        (b,) = summarize(base)
        errors = b["binding_errors"]
        lines += [
            "",
            f"Paired against the baseline run ({name}: {100 * b['overall']['accuracy']:.1f} %, "
            f"{errors['candidates']} of {errors['candidates_total']} candidates refused for a "
            f"column binding):",
            "",
            paired_table(pairs, reference="baseline"),
        ]
        ratios = [
            f"{s['config']} {s['overall']['accuracy'] / b['overall']['accuracy']:.2f}x"
            for s in summaries
            if b["overall"]["accuracy"]
        ]
        lines += ["", "Accuracy over the baseline's: " + ", ".join(ratios) + "."]
        shown = ", ".join(f"{n} {v[0]} of {v[1]}" for n, v in same.items())
        lines += ["", f"Candidates with the baseline's SQL (same question and seed): {shown}."]
    lines += ["", "| config | id | ok | predicted SQL |", "|---|---|---|---|"]
    for r in rows:
        sql = str(r.detail.get("predicted_sql", "")).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {display_name(r)} | {r.id} | {'yes' if r.correct else 'no'} | `{sql}` |")
    return {"configs": summaries, "paired_vs_baseline": paired}, "\n".join(lines) + "\n"
