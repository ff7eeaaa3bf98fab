"""Structural tags: the parser's view of one generated token (paper §3.3, App. A.1, Table 5).

A tag is ``(cls, role, state, next)``. Function calling and text-to-SQL share the class
vocabulary and differ in roles and states. The policy table is keyed by these strings, so the
vocabularies here are the single source of truth for both the tagger and the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TagFamily = Literal["function_calling", "sql"]

# ``text``: prose an assistant writes under tool_choice auto/none, before a call or instead of
# one (the paper leaves mixed turns as future work; its vocabularies are the first three).
CLASSES: tuple[str, ...] = ("pure_scaffold", "schema_bearing", "free_generation", "text")
NEXTS: tuple[str, ...] = ("lookahead_critical", "no_lookahead")

FC_ROLES: tuple[str, ...] = (
    "scaffold_separator",
    "required",
    "optional",
    "dispatch_key",
    "text_body",
    "text_boundary",
)
FC_STATES: tuple[str, ...] = ("boundary", "critical")

SQL_ROLES: tuple[str, ...] = ("projection", "relation", "predicate", "outside_schema")
SQL_STATES: tuple[str, ...] = ("stable", "boundary", "critical")

VOCABULARIES: dict[str, dict[str, tuple[str, ...]]] = {
    "function_calling": {"cls": CLASSES, "role": FC_ROLES, "state": FC_STATES, "next": NEXTS},
    "sql": {"cls": CLASSES, "role": SQL_ROLES, "state": SQL_STATES, "next": NEXTS},
}

# Prompt-span labels for the prefill companion (App. A.3, Table 6), plus two of ours:
# ``template_text``, the chat template's own text apart from the messages' content
# (grammars/chat_spans.py), and ``unlinked_schema``, a definition the request does not link to
# (a SQL table whose name and values the question never mentions, grammars/sql/span_labels.py).
# A table written before a label existed lists a prefix of these; the labels it lacks plan by
# ``PolicyTable.prefill_entries`` (``LATER_LABEL_FALLBACK``, else ``prefill_default``).
SPAN_LABELS: tuple[str, ...] = (
    "protected_content",
    "schema_scaffold",
    "function_name",
    "parameter_key",
    "type_constraint",
    "enum_constraint",
    "schema_description",
    "template_text",
    "unlinked_schema",
)


@dataclass(frozen=True, slots=True)
class Tag:
    """One token's structural tag. ``parents()`` gives the fallback chain of App. B.1."""

    cls: str
    role: str
    state: str
    next: str

    def key(self) -> str:
        return f"{self.cls}/{self.role}/{self.state}/{self.next}"

    def parents(self) -> tuple[str, str, str, str]:
        """Lookup keys from most to least specific: (c,r,s,n) → (c,r,s) → (c,r) → c."""
        c, r, s = self.cls, self.role, self.state
        return (self.key(), f"{c}/{r}/{s}", f"{c}/{r}", c)

    def validate(self, family: TagFamily) -> None:
        vocab = VOCABULARIES[family]
        for field in ("cls", "role", "state", "next"):
            value = getattr(self, field)
            if value not in vocab[field]:
                raise ValueError(
                    f"{field}={value!r} is not in the {family} vocabulary {vocab[field]}"
                )
