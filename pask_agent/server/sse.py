"""Server-sent events as OpenAI streams them: ``data: <json>\\n\\n`` lines, then ``[DONE]``.

Only the wire format lives here; what the events say is ``responses.py``'s and when they are
sent (and what a disconnect cancels) is ``chat.py``'s.
"""

from __future__ import annotations

import json
from typing import Any

HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # proxies must not hold tokens back
]
DONE = b"data: [DONE]\n\n"


def event(data: dict[str, Any]) -> bytes:
    """One event carrying a JSON object (a chunk, or an ``{"error": ...}`` mid-stream)."""
    return (
        b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"
    )


def parse_events(body: str) -> list[dict[str, Any] | str]:
    """The events of an SSE body: JSON objects, and ``"[DONE]"``; for tests and clients."""
    out: list[dict[str, Any] | str] = []
    for block in body.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out
