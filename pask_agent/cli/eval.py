"""``pask-agent eval <eval>``: the accuracy evals under KV policies and budgets.

Each subcommand is the eval module's own command (``python -m pask_agent.eval.<module>``):
the same argument builder, so the flags, their names and defaults are the same in both places
(``eval/harness_args.py`` for the shared ones). Results go to ``<out>.{jsonl,json,md,png}``.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# subcommand -> (eval module, help)
EVALS: dict[str, tuple[str, str]] = {
    "bfcl": ("pask_agent.eval.bfcl_eval", "BFCL non-live, official AST checker"),
    "sql": ("pask_agent.eval.sql_eval", "text-to-SQL execution accuracy (SQLiteAssistant)"),
    "structured": ("pask_agent.eval.structured_eval", "BFCL cases as runtime.call outputs"),
    "multiturn": ("pask_agent.eval.multiturn_eval", "conversations chained from BFCL cases"),
    "extract": ("pask_agent.eval.extract_eval", "long outputs: records extracted from documents"),
    "agent": ("pask_agent.eval.agent_eval", "sandbox conversations that must read their history"),
}
# not an eval of its own: it runs the evals above (and the benches) into results/current/
HEADLINE = ("pask_agent.eval.headline", "every README headline, re-measured into one folder")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("eval", help="accuracy evals (BFCL, SQL, ...) under KV policies")
    evals = p.add_subparsers(dest="eval", required=True)
    for name, (module, text) in EVALS.items():
        m = import_module(module)
        e = evals.add_parser(name, help=text, description=text)
        m.add_arguments(e)
        e.set_defaults(func=m.run)
    module, text = HEADLINE
    h = evals.add_parser("headline", help=text, description=text)
    import_module(module).add_arguments(h)
    h.set_defaults(func=import_module(module).run)
