"""The real app under uvicorn in a thread, on an ephemeral port, for the server tests."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import uvicorn

from pask_agent.runtime.engine import RuntimeConfig
from pask_agent.server import ServerSettings, create_app

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


class ThreadServer:
    """``create_app(...)`` served by uvicorn on 127.0.0.1:<ephemeral> in a daemon thread."""

    def __init__(self, app: Any) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.base_url = ""
        self.failure: BaseException | None = None

    def _run(self) -> None:
        try:
            self.server.run()
        except BaseException as exc:  # noqa: BLE001 - uvicorn exits (SystemExit) on a failed startup
            self.failure = exc

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the test server did not start ({self.failure!r})")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

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
