"""An app served by uvicorn on 127.0.0.1:<ephemeral port> in a daemon thread.

Its own thread and event loop, as a separate server process would have: a client's loop never
runs server code, so a cancel reaches the server only through the socket. The soak and the
server tests use it to talk to a real server over real HTTP without a subprocess.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn


class LoopbackServer:
    """Context manager: starts ``app`` on loopback, exposes ``base_url``, stops it on exit."""

    def __init__(self, app: Any, *, start_timeout_s: float = 300.0) -> None:
        self.app = app
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, name="loopback-server", daemon=True)
        self.start_timeout_s = start_timeout_s
        self.base_url = ""
        self.failure: BaseException | None = None

    def _run(self) -> None:
        try:
            self.server.run()
        except BaseException as exc:  # noqa: BLE001 - uvicorn exits (SystemExit) on a failed startup
            self.failure = exc

    def __enter__(self) -> LoopbackServer:
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the loopback server did not start ({self.failure!r})")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
