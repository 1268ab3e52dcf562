"""`jumpahead serve` as a user runs it: a subprocess that loads the default model,
answers on 127.0.0.1, and exits cleanly on Ctrl-C."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx

from .serving import free_port, interrupt


def test_serve_subprocess_answers_and_stops_on_sigint():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "jumpahead.app.cli", "serve", "--port", str(port), "--max-batch", "2",
         "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "server did not come up"
                time.sleep(0.3)
        assert health.status_code == 200 and health.json()["max_batch"] == 2
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120,
                       json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 2
    finally:
        code = interrupt(proc, timeout=30)
    assert code == 0


def test_serve_bad_model_exits_2():
    out = subprocess.run([sys.executable, "-m", "jumpahead.app.cli", "serve", "--model", "/nonexistent/model"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "cannot load model" in out.stderr
