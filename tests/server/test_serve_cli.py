"""``pask-agent serve`` as a process: it refuses an open bind, starts, answers, and stops."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from pask_agent.cli import main

# its subprocesses load a model of their own: this worker's default model goes meanwhile
pytestmark = pytest.mark.usefixtures("no_default_model_here")

SERVE = [sys.executable, "-m", "pask_agent.cli", "serve"]


def test_refuses_non_loopback_without_key(capsys: pytest.CaptureFixture[str]) -> None:
    # refused before any model is looked up, so the unknown model never matters
    assert main(["serve", "--host", "0.0.0.0", "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "--api-key" in err and "0.0.0.0" in err


def test_serve_starts_answers_and_stops() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    proc = subprocess.Popen(
        [*SERVE, "--model", "smollm2-135m", "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() - started < 120, "the server did not come up"
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        startup_s = time.monotonic() - started
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.create(
            model="smollm2-135m", messages=[{"role": "user", "content": "Hi"}], max_tokens=3
        )
        assert r.usage.completion_tokens == 3
        print(f"\npask-agent serve (SmolLM2): /health answered {startup_s:.1f} s after launch")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0
