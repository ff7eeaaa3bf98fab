"""The real app under uvicorn in a thread, on an ephemeral port, for the server tests."""

from __future__ import annotations

import time
from typing import Any

import httpx

from pask_agent.runtime.config import RuntimeConfig
from pask_agent.server import ServerSettings, create_app
from pask_agent.server.loopback import LoopbackServer

SMOL = "smol"


def function_tool(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    """An OpenAI ``tools`` entry, as clients send it."""
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


TIME = function_tool(
    "get_time", "Get the local time in a city.", {"city": {"type": "string"}}, ["city"]
)


class ThreadServer(LoopbackServer):
    """The package's loopback server, plus a reader of its Prometheus metrics."""

    def metric(self, name: str) -> float:
        """One unlabelled sample of ``/metrics`` (``name`` as Prometheus writes it)."""
        text = httpx.get(f"{self.base_url}/metrics").text
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)

    def wait_for_metric(self, name: str, value: float, timeout_s: float = 20.0) -> float:
        deadline = time.monotonic() + timeout_s
        seen = self.metric(name)
        while seen != value and time.monotonic() < deadline:
            time.sleep(0.05)
            seen = self.metric(name)
        return seen


def smol_server(loaded: Any, **settings: Any) -> ThreadServer:
    runtime = settings.pop("runtime", RuntimeConfig())
    app = create_app(
        ServerSettings(model="smollm2-135m", served_model_name=SMOL, runtime=runtime, **settings),
        loaded=loaded,
    )
    return ThreadServer(app)
