"""`jumpahead serve` as a user runs it: a subprocess that loads the default model,
answers on 127.0.0.1, and exits cleanly on Ctrl-C."""

from __future__ import annotations

import subprocess
import sys

import httpx

from .serving import cli_process, free_port, interrupt, wait_health


def test_serve_subprocess_answers_and_stops_on_sigint():
    port = free_port()
    proc = cli_process(["serve", "--port", str(port), "--max-batch", "2", "--log-level", "warning"])
    try:
        health = wait_health(proc, f"http://127.0.0.1:{port}", timeout=180)
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
