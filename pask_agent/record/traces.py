"""Recorded agent turns: what calibration learns from (paper §3.4, App. C.1).

One JSON object per line, one line per finished assistant turn::

    {"id": "parallel_12",                       # optional, for reports
     "messages": [{"role": "user", "content": "..."}],      # OpenAI chat format, the prompt
     "tools": [{"type": "function", "function": {...}}],    # and/or "sql_schema": "<DDL>";
                                                # neither: a plain text turn
     "tool_choice": "required", "parallel_tool_calls": true,
     "output": "[{\\"name\\": ...}]",           # the model's text, exactly as decoded
     "output_token_ids": [58, 4913, ...],       # the decoded ids (teacher forcing replays them)
     "model": {"name": "default", "weights_sha256": "1d96…"},
     "ok": true}                                # or "reference": {...} that a checker scores

A trace is a fact about one model: replaying its token ids through another model measures
nothing. So every trace names the model, and :func:`read_traces` refuses lines recorded with a
model other than the one it is asked about. ``ok`` is the turn's outcome when the recorder knew
it (an agent whose tool call ran); ``reference`` carries what a checker needs to score a
replayed output (``{"checker": "bfcl_ast", "case_id": ...}`` or
``{"checker": "sql_exec", "db": ..., "gold_sql": ...}``).

Writes are one ``os.write`` of a whole line on a file opened for appending, so concurrent
recorders (several runtimes, a LangChain agent beside a server) never interleave partial lines.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pask_agent.errors import ConfigError
from pask_agent.record.jsonl import json_lines

_REQUIRED = ("messages", "output", "output_token_ids", "model")


class TraceError(ConfigError):
    """A trace file is missing, empty, malformed, or recorded with another model."""


@dataclass(frozen=True, slots=True)
class ModelId:
    """Which weights produced a trace: the runtime's model name and the weights' SHA-256."""

    name: str
    weights_sha256: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "weights_sha256": self.weights_sha256}


@dataclass(frozen=True, slots=True)
class Trace:
    """One recorded assistant turn. Nested values are plain JSON; treat them as read-only."""

    messages: tuple[Mapping[str, Any], ...]
    output: str
    output_token_ids: tuple[int, ...]
    model: ModelId
    tools: tuple[Mapping[str, Any], ...] = ()
    sql_schema: str | None = None
    tool_choice: str = "auto"
    parallel_tool_calls: bool = True
    ok: bool | None = None
    reference: Mapping[str, Any] | None = None
    id: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def group(self) -> str:
        """The slice of the workload this turn belongs to (BFCL category, SQL difficulty):
        a top-level ``"group"`` field, else the reference's ``category``; ``""`` if neither.

        Development failure rates weigh every group equally, as a benchmark that averages
        over categories does, so a rare but fragile kind of turn is not outvoted."""
        ref = self.reference or {}
        group = self.extra.get("group") or ref.get("category") or ""
        return str(group)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id} if self.id else {}
        out["messages"] = [dict(m) for m in self.messages]
        if self.tools:
            out["tools"] = [dict(t) for t in self.tools]
        if self.sql_schema is not None:
            out["sql_schema"] = self.sql_schema
        out["tool_choice"] = self.tool_choice
        out["parallel_tool_calls"] = self.parallel_tool_calls
        out["output"] = self.output
        out["output_token_ids"] = list(self.output_token_ids)
        out["model"] = self.model.to_json()
        if self.ok is not None:
            out["ok"] = self.ok
        if self.reference is not None:
            out["reference"] = dict(self.reference)
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, data: Any, *, where: str = "trace") -> Trace:
        """Validate one decoded JSON line.

        Raises
        ------
        TraceError
            A required field is missing or has the wrong type (the message names it).
        """
        if not isinstance(data, dict):
            raise TraceError(f"{where}: a trace is a JSON object, got {type(data).__name__}")
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise TraceError(f"{where}: missing field(s) {', '.join(missing)}")
        messages = data["messages"]
        if not isinstance(messages, list) or not messages:
            raise TraceError(f"{where}: 'messages' must be a non-empty list of chat messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise TraceError(f"{where}: messages[{i}] needs a string 'role'")
        ids = data["output_token_ids"]
        if not isinstance(ids, list) or not all(isinstance(i, int) and i >= 0 for i in ids):
            raise TraceError(f"{where}: 'output_token_ids' must be a list of token ids")
        if not isinstance(data["output"], str):
            raise TraceError(f"{where}: 'output' must be the decoded text")
        model = data["model"]
        if not (
            isinstance(model, dict)
            and isinstance(model.get("name"), str)
            and isinstance(model.get("weights_sha256"), str)
        ):
            raise TraceError(f"{where}: 'model' must be {{'name': ..., 'weights_sha256': ...}}")
        tools = data.get("tools", [])
        if not isinstance(tools, list):
            raise TraceError(f"{where}: 'tools' must be a list of tool specs")
        ok, reference = data.get("ok"), data.get("reference")
        if ok is None and reference is None:
            raise TraceError(f"{where}: a trace needs 'ok' (its outcome) or a 'reference'")
        if ok is not None and not isinstance(ok, bool):
            raise TraceError(f"{where}: 'ok' must be true or false")
        if reference is not None and not isinstance(reference, dict):
            raise TraceError(f"{where}: 'reference' must be an object")
        known = {
            *_REQUIRED, "tools", "sql_schema", "tool_choice", "parallel_tool_calls", "ok",
            "reference", "id",
        }  # fmt: skip
        return cls(
            messages=tuple(messages),
            output=data["output"],
            output_token_ids=tuple(ids),
            model=ModelId(model["name"], model["weights_sha256"]),
            tools=tuple(tools),
            sql_schema=data.get("sql_schema"),
            tool_choice=str(data.get("tool_choice", "auto")),
            parallel_tool_calls=bool(data.get("parallel_tool_calls", True)),
            ok=ok,
            reference=reference,
            id=str(data.get("id", "")),
            extra={k: v for k, v in data.items() if k not in known},
        )


def append_trace(path: str | os.PathLike[str], trace: Trace) -> None:
    """Append one line atomically (a single ``write`` on an ``O_APPEND`` descriptor)."""
    line = (json.dumps(trace.to_json(), ensure_ascii=False) + "\n").encode("utf-8")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = os.write(fd, line)
        if written != len(line):  # regular files write whole; say so loudly if not
            raise OSError(f"short write to {path}: {written} of {len(line)} bytes")
    finally:
        os.close(fd)


def write_traces(path: str | os.PathLike[str], traces: Iterable[Trace]) -> int:
    """Write a whole trace file (replacing it, through a temporary file); returns the count."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    n = 0
    with tmp.open("w", encoding="utf-8") as f:
        for trace in traces:
            f.write(json.dumps(trace.to_json(), ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, target)
    return n


def iter_traces(path: str | os.PathLike[str]) -> Iterator[Trace]:
    """Yield validated traces line by line (blank lines skipped).

    Raises
    ------
    TraceError
        The file is missing, or a line is not JSON or not a valid trace (line number given).
    """
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"no trace file at {p}")
    for where, data in json_lines(p, TraceError):
        yield Trace.from_json(data, where=where)


def read_traces(path: str | os.PathLike[str], *, model: ModelId | None = None) -> list[Trace]:
    """All traces of a file, checked to be non-empty and, if ``model`` is given, its own.

    Raises
    ------
    TraceError
        Missing, empty or malformed file, or a trace recorded with another model.
    """
    traces = list(iter_traces(path))
    if not traces:
        raise TraceError(f"{path} holds no traces; record some first (pask-agent traces record)")
    if model is not None:
        for i, t in enumerate(traces, 1):
            if t.model != model:
                raise TraceError(
                    f"{path}: trace {i} ({t.id or 'no id'}) was recorded with model "
                    f"{t.model.name!r} (weights {t.model.weights_sha256[:12]}…), not "
                    f"{model.name!r} (weights {model.weights_sha256[:12]}…); record traces "
                    "with the model you calibrate"
                )
    return traces


def messages_json(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as plain JSON dicts (tool-call arguments included), for a trace line."""
    return json.loads(json.dumps([dict(m) for m in messages], default=str))
