"""The OpenAI-compatible server (``pask-agent serve``): routes, translation, SSE, errors, metrics.

``create_app(ServerSettings(...))`` returns the ASGI app; ``pask-agent serve`` runs it with
uvicorn.
"""

from pask_agent.server.app import ServerSettings, check_bind, create_app

__all__ = ["ServerSettings", "check_bind", "create_app"]
