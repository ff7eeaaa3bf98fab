"""The calibration report: every measurement behind a table, as JSON and as Markdown.

The table keeps only what serving needs; the report keeps how it was chosen — Runtime-V and
Runtime-D per bucket, every candidate's development failure rate and nominal cost, the choice,
and the App. D.7 responsibility–distortion mismatch — so a reader can check the selection.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_report(path: Path, report: dict[str, Any]) -> None:
    """``path`` (JSON) and the same stem with ``.md``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    path.with_suffix(".md").write_text(markdown(report), encoding="utf-8")


def _groups(r: dict[str, Any], key: str = "dev_groups") -> str:
    values = r.get(key) or {}
    if key == "dev_groups":
        return ", ".join(f"{g or '(none)'} {n}" for g, n in values.items()) or "one group"
    return ", ".join(f"{g or '(none)'} {_pct(v)} %" for g, v in values.items()) or "–"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def markdown(r: dict[str, Any]) -> str:
    lines = [
        "# PASK calibration report",
        "",
        f"Command: `{r['command']}`  ",
        f"Commit: `{r['git_commit']}`; machine: {r['machine']}; {r['cpu_count']} CPUs, "
        f"{r.get('workers', 1)} worker(s), {r.get('dtype', '')} replay; wall time "
        f"**{r['wall_seconds']:.0f} s** over {r.get('runs', 1)} run(s).",
        "",
        f"Traces: {r['cal_traces']} calibration ({r['cal_ok']} correct), {r['dev_traces']} "
        f"development ({r['dev_ok']} correct). Replay reproduces the recorded token at "
        f"{_pct(r['stable_fraction'])} % of contested decisions.",
        "",
        "Files: "
        + ", ".join(
            f"`{t['path']}` ({t['n']} lines, sha256 `{t['sha256'][:12]}…`)" for t in r["traces"]
        ),  # fmt: skip
        "",
        f"**Decode choice:** {r['decode_choice']['name']} → B_D = "
        f"{r['decode_choice']['budget_decode']}. **Prompt choice:** "
        + "; ".join(_prompt_choices(r["prefill_choice"]))
        + ".",
        "",
        "Development failures are averaged over trace groups with equal weight "
        f"({_groups(r)}); the chosen candidates' failure rate per group: decode "
        f"{_groups(r, 'decode_choice_by_group')}, prompt {_groups(r, 'prefill_choice_by_group')}.",
        "",
        "## Decode candidates (development failure rate vs nominal cost)",
        "",
        "| candidate | nominal B_D | dev failures (%) |",
        "|---|---|---|",
    ]
    for c in r["decode_candidates"]:
        lines.append(f"| {c['name']} | {c['cost']:.3f} | {_pct(c['dev_error'])} |")
    lines += ["", "## Prompt candidates (decode all H)", "",
              "| threshold pair | upgrade order | B (or B_P) | B_P asked | B_P its plans keep "
              "| dev failures (%) |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for c in r["prefill_candidates"]:
        lines.append(
            f"| {c['pair']} | {c.get('order', 'distortion')} | {c['budget']} | "
            f"{c.get('asked_b_p', '–')} | "
            f"{c.get('realized_b_p', '–')} | {_pct(c['dev_error'])} |"
        )
    for stage in ("decode", "prefill"):
        lines += ["", f"## Runtime-V and Runtime-D, {stage} buckets", "",
                  "| bucket | group | tokens | V̄(L) % | V̄(R) % | D(L) | D(R) |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for b in r[stage]:
            if b["tokens"]:
                lines.append(
                    f"| {b['bucket']} | {b['group']} | {b['tokens']} | {_pct(b['V_L'])} | "
                    f"{_pct(b['V_R'])} | {b['D_L']:.3g} | {b['D_R']:.3g} |"
                )
    lines += ["", "## Responsibility–distortion mismatch (paper App. D.7)", "",
              "Top 20 % of buckets by task sensitivity V̄ (those with V̄ > 0): how many are also "
              "in the top 20 % by distortion D (recall), and how many sit in D's bottom half "
              "(mismatch).", "",
              "| stage | action | buckets | sensitive | recall@20 % | mismatch 20/50 % |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for stage, by_action in r["mismatch"].items():
        for action, m in by_action.items():
            lines.append(
                f"| {stage} | {action} | {m['buckets']} | {m['sensitive']} | "
                f"{_pct(m['recall_at_20'])} | {_pct(m['mismatch_20_50'])} |"
            )
    return "\n".join(lines) + "\n"


def _prompt_choices(choice: dict[str, Any] | list[dict[str, Any]]) -> list[str]:
    """One phrase per budget's prompt choice (reports before several budgets held one dict)."""
    if isinstance(choice, dict):
        order = choice.get("order", "distortion")
        return [
            f"threshold pair {choice['pair']}, {order} order → B_P = {choice['budget_prefill']}"
        ]
    return [
        (f"at B = {c['budget']:g}: " if c["budget"] is not None else "")
        + f"{c['choice']} → B_P = {c['budget_prefill']}"
        for c in choice
    ]
