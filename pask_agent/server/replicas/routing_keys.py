"""Which replica a request belongs to: its routing key, and a replica for a key no one owns yet.

A conversation's KV and budget ledger live in one replica's runtime, so every turn of it must
reach that replica. The key says which conversation a request continues:

1. ``x-conversation-id`` header, or the body's ``conversation_id`` (the runtime's own
   conversation: its KV is kept between turns); else the body's ``user`` field, which keeps
   one user's requests together (a user may hold several conversations at once, so it is
   never taken for a conversation id);
2. otherwise the conversation's opening (tools and the messages up to the first user
   message), so a client that resends its history without an id still lands where that
   history was seen;
3. otherwise (no JSON body: ``/v1/models``) none, and the least-loaded replica answers.

A key no replica owns yet goes to its rendezvous choice (highest hash of key and replica id):
every ingress computes the same replica without sharing a table, and when a replica leaves
only its own keys move.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from pask_agent.server.protocol import CONVERSATION_HEADER

_CONVERSATIONS_PATH = "/v1/conversations/"


def route_key(method: str, path: str, headers: Mapping[str, str], body: bytes) -> str | None:
    """The routing key of one request (see the module docstring), or None for any replica."""
    if path.startswith(_CONVERSATIONS_PATH):
        return f"conversation:{path[len(_CONVERSATIONS_PATH) :]}"
    given = headers.get(CONVERSATION_HEADER)
    if given:
        return f"conversation:{given}"
    if method != "POST" or not body:
        return None
    try:
        parsed = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # the replica answers the 400
    if not isinstance(parsed, dict):
        return None
    for field, kind in (("conversation_id", "conversation"), ("user", "user")):
        value = parsed.get(field)
        if isinstance(value, str) and value:
            return f"{kind}:{value}"
    opening = _opening(parsed)
    if opening is None:
        return None
    digest = hashlib.sha256(json.dumps(opening, sort_keys=True).encode()).hexdigest()[:32]
    return f"prefix:{digest}"


def _opening(body: dict[str, Any]) -> list[Any] | None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    head: list[Any] = [body.get("tools")]
    for message in messages:
        head.append(message)
        if isinstance(message, dict) and message.get("role") == "user":
            break
    return head


def rendezvous(key: str, replicas: Iterable[str]) -> str | None:
    """The replica (by id) with the highest hash of ``key`` and its id; None when none."""
    best, best_score = None, b""
    for replica in replicas:
        score = hashlib.blake2b(f"{key}\0{replica}".encode(), digest_size=8).digest()
        if best is None or score > best_score:
            best, best_score = replica, score
    return best
