"""Dev check behind ``unlinked_schema``: on every SQL dev question, which tables the question
does not link to, whether the gold query reads any of them, and what share of the prompt's
tokens they hold. Writes ``sql_unlinked_dev.json`` next to this file.

Run: ``.venv/bin/python results/dev_checks/sql_unlinked_dev.py``
"""

import json
import statistics
from collections import Counter
from pathlib import Path

import sqlglot
from sqlglot import exp

from pask_agent.eval.sql_data import load_sample_questions
from pask_agent.grammars.prompt import render_tool_prompt
from pask_agent.grammars.span_labels import labels_for_tokens
from pask_agent.integrations.sql import SQLiteAssistant
from pask_agent.record.provenance import provenance
from pask_agent.runtime.models.loading import load_tokenizer

tokenizer = load_tokenizer("default")
questions = load_sample_questions(split="dev")
assistants: dict[str, SQLiteAssistant] = {}
rows = []
for q in questions.questions:
    if q.db not in assistants:
        assistants[q.db] = SQLiteAssistant(questions.db_path(q.db))
    a = assistants[q.db]
    text = render_tool_prompt(tokenizer, a.messages(q.question), None)
    labels = Counter(labels_for_tokens(text, a.label_spans(text, q.question), tokenizer))
    gold = {t.name.lower() for t in sqlglot.parse_one(q.gold_sql, read="sqlite").find_all(exp.Table)}
    unlinked = sorted(a.unlinked_for(q.question))
    rows.append({
        "id": q.id, "unlinked": unlinked, "gold_tables": sorted(gold),
        "gold_reads_unlinked": bool(gold & {t.lower() for t in unlinked}),
        "unlinked_share": labels["unlinked_schema"] / sum(labels.values()),
    })  # fmt: skip
summary = {
    "questions": len(rows),
    "gold_reads_an_unlinked_table": sum(r["gold_reads_unlinked"] for r in rows),
    "questions_with_an_unlinked_table": sum(bool(r["unlinked"]) for r in rows),
    "unlinked_share_of_prompt_tokens_mean": round(statistics.mean(r["unlinked_share"] for r in rows), 3),
}
out = Path(__file__).with_suffix(".json")
out.write_text(json.dumps({**provenance(), "summary": summary, "rows": rows}, indent=1) + "\n")
print(json.dumps(summary))
