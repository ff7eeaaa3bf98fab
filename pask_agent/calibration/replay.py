"""A recorded trace made ready for teacher forcing: prompt tokens and labels, output tags,
and what the grammar allowed at every decision.

Calibration never decodes. It replays what the model wrote under Full KV through the same
prompt renderer, grammar and tagger the server uses (``runtime/turns/prompting.py``), so every
output token gets the tag the online controller would have given it and every decision
position gets the legal-token mask that constrained its argmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xgrammar as xgr

from pask_agent.grammars.tags import SPAN_LABELS, Tag
from pask_agent.grammars.token_text import TokenTextStream
from pask_agent.record.traces import Trace, TraceError
from pask_agent.runtime.turns.outputs import OutputCompiler
from pask_agent.runtime.turns.prompting import prepare_turn

_LABEL_INDEX = {label: i for i, label in enumerate(SPAN_LABELS)}


@dataclass(frozen=True, slots=True, eq=False)
class ReplayedTrace:
    """One trace, replayed.

    Attributes
    ----------
    trace_id:
        The trace's id (or its line number).
    ok:
        Whether the recorded output was correct; only correct outputs can be broken.
    prompt_ids, output_ids:
        Token ids of the rendered prompt and of the recorded answer.
    prompt_labels:
        ``int64 [P]``: index into ``SPAN_LABELS`` of each prompt token.
    tags:
        The structural tag of each output token (None where the tagger has none).
    states:
        The parser state of each output token's tag (``""`` when untagged), for the reserve.
    allowed:
        ``int32 [T + 1, words]`` xgrammar bitmask of the tokens legal at each output position
        (row ``T`` is the position after the answer: legal there only if the model chose to
        stop). Rows are None when the turn had no grammar.
    between_calls:
        ``bool [T + 1]``: the position follows a finished parallel call, where the runtime
        may mask the closing bracket (``RuntimeConfig.continue_calls_at``).
    terminated:
        The grammar ended the answer by itself (no stop decision after the last token).
    """

    trace_id: str
    ok: bool
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    prompt_labels: np.ndarray
    tags: tuple[Tag | None, ...]
    allowed: torch.Tensor | None
    between_calls: np.ndarray
    terminated: bool

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def output_len(self) -> int:
        return len(self.output_ids)


class TraceReplayer:
    """Replays traces for one tokenizer; grammars are compiled once per tool set."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.outputs = OutputCompiler(tokenizer, vocab_size)

    def replay(self, trace: Trace, *, where: str = "trace") -> ReplayedTrace:
        """Render the trace's prompt and walk its output through grammar and tagger.

        Raises
        ------
        TraceError
            The trace has no tools (nothing structured to calibrate), or its output is not one
            the grammar accepts (recorded under another grammar or prompt format).
        """
        if trace.sql_schema is not None:
            turn, spec = self._sql_turn(trace, where)
        elif trace.tools:
            turn = prepare_turn(
                self.tokenizer,
                self.outputs,
                list(trace.messages),
                list(trace.tools),
                trace.tool_choice,
                trace.parallel_tool_calls,
                labels=True,
            )
            spec = turn.spec
        else:
            raise TraceError(
                f"{where}: a trace with neither tools nor sql_schema has no structure to calibrate"
            )
        assert turn.labels is not None
        constraint = spec.start()
        n = len(trace.output_token_ids)
        allowed = None
        if constraint.matcher is not None:
            allowed = xgr.allocate_token_bitmask(n + 1, self.vocab_size)
            xgr.reset_token_bitmask(allowed)
        stream = TokenTextStream(self.tokenizer)
        tags: list[Tag | None] = []
        between = np.zeros(n + 1, dtype=bool)
        for i, token in enumerate(trace.output_token_ids):
            between[i] = constraint.between_calls()
            if allowed is not None:
                constraint.fill_mask(allowed, i)
            if not constraint.accept(token):
                raise TraceError(
                    f"{where}: output token {i} ({token}) is not legal under this tool grammar; "
                    "the trace was recorded with another output format: record it again"
                )
            tags.append(constraint.tag(stream.push(token)))
        terminated = constraint.is_terminated()
        between[n] = constraint.between_calls()
        if allowed is not None and not terminated:
            constraint.fill_mask(allowed, n)
        return ReplayedTrace(
            trace_id=trace.id or where,
            ok=bool(trace.ok),
            prompt_ids=tuple(turn.prompt_ids),
            output_ids=tuple(trace.output_token_ids),
            prompt_labels=np.array([_LABEL_INDEX[x] for x in turn.labels], np.int64),
            tags=tuple(tags),
            allowed=allowed,
            between_calls=between,
            terminated=terminated,
        )

    def _sql_turn(self, trace: Trace, where: str) -> tuple[Any, Any]:
        """The SQL assistant's turn: its prompt (in the trace's messages) with the DDL labelled,
        and the grammar and tagger compiled from the recorded schema, as ``SQLiteAssistant``
        compiles them from the file."""
        from pask_agent.grammars.sql.grammar import compile_sql_grammar
        from pask_agent.grammars.sql.schema import DDLError, SqlSchema
        from pask_agent.grammars.sql.span_labels import label_ddl_spans
        from pask_agent.grammars.sql.tagger import SqlTagger

        assert trace.sql_schema is not None
        try:
            schema = SqlSchema.from_ddl(trace.sql_schema)
        except DDLError as exc:
            raise TraceError(f"{where}: its sql_schema is not DDL we can read: {exc}") from exc
        turn = prepare_turn(
            self.tokenizer, self.outputs, list(trace.messages), None, "none", False,
            labels=True, label_spans=lambda text: label_ddl_spans(text, schema),
        )  # fmt: skip
        spec = self.outputs.ebnf(
            "sql", compile_sql_grammar(schema), new_tagger=lambda: SqlTagger(schema), payload=schema
        )
        return turn, spec

    def replay_all(self, traces: Sequence[Trace], *, origin: str) -> list[ReplayedTrace]:
        return [self.replay(t, where=f"{origin}:{i + 1}") for i, t in enumerate(traces)]
