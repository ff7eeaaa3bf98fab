"""Who may use the server: a bearer token on ``/v1/*``, and no open bind beyond loopback.

Kept apart from the app (and free of torch) so ``pask-agent serve`` refuses a bad bind at
once, before seconds of imports and model loading.
"""

from __future__ import annotations

import hmac
import ipaddress

from starlette.types import ASGIApp, Receive, Scope, Send

from pask_agent.errors import ConfigError
from pask_agent.server.errors import APIError


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse to serve beyond loopback without an API key.

    Raises
    ------
    ConfigError
        ``host`` is not a loopback address (or ``localhost``) and no ``api_key`` is set.
    """
    if api_key:
        return
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigError(
            f"refusing to bind {host!r} without an API key: anyone who reaches it could use the "
            "model; pass --api-key (clients send it as a bearer token) or bind 127.0.0.1"
        )


class BearerAuth:
    """Pure ASGI guard for ``/v1/*`` (streams and disconnects pass through untouched)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                error = APIError(
                    401, "missing or incorrect API key: send 'Authorization: Bearer <key>'",
                    code="invalid_api_key",
                )  # fmt: skip
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
