"""The OpenAI-compatible server (``pask-agent serve``): routes, translation, SSE, errors, metrics.

``create_app(ServerSettings(...))`` returns the ASGI app; ``pask-agent serve`` runs it with
uvicorn. Names resolve on first use (PEP 562): ``check_bind`` needs neither torch nor a model,
so the CLI refuses a bad bind before it pays for them.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ServerSettings": "pask_agent.server.app",
    "create_app": "pask_agent.server.app",
    "check_bind": "pask_agent.server.auth",
}

__all__ = ["ServerSettings", "check_bind", "create_app"]

if TYPE_CHECKING:
    from pask_agent.server.app import ServerSettings, create_app
    from pask_agent.server.auth import check_bind


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
