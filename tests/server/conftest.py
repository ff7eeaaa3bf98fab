"""Servers for the server tests (``server_harness.py``), shared per session."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from server_harness import ThreadServer, smol_server


@pytest.fixture(scope="session")
def smol(smollm2: Any) -> Iterator[ThreadServer]:
    """One SmolLM2 server (Full KV by default) for the tests that do not need their own."""
    with smol_server(smollm2) as server:
        yield server


@pytest.fixture(scope="session")
def client(smol: ThreadServer) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{smol.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
