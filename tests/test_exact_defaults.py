"""Exact methods on by default: a fresh `jumpahead serve` runs echo and checked strict
fill for requests that name no methods; `--methods none` runs ordinary decoding.

The real CLI starts the real server on the embedded model (two subprocesses); a
copy-heavy request through the OpenAI SDK must get the same answer from both (exact
methods never change the output) while the default server's usage shows copied tokens
and the `none` server's only sampled ones.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from jumpahead.engine.methods.registry import SERVER_DEFAULT, describe, parse_methods

from .serving import start_serve

CONFIG = """server:
  host: 127.0.0.1
  port: 8080
  workers: 4
  timeout_seconds: 30
logging:
  level: info
  file: /var/log/app.log
"""


def test_parse_methods() -> None:
    assert parse_methods(None) == SERVER_DEFAULT == ("echo",)
    assert describe(parse_methods(None)) == ["echo", "strict"]
    assert describe(("ngram",)) == ["ngram", "strict"]
    assert parse_methods("none") == ("none",) and describe(("none",)) == []
    assert parse_methods("off") == ("off",)
    assert parse_methods("echo, strict") == ("echo", "strict")
    assert parse_methods("") == () and describe(()) == ["strict"]  # strict fill alone, as before
    with pytest.raises(ValueError, match="warp"):
        parse_methods("echo,warp")
    with pytest.raises(ValueError, match="cannot be combined"):
        parse_methods("none,echo")


@pytest.mark.slow  # two servers and two 48-token answers: minutes on a busy 2-core machine
def test_serve_runs_exact_methods_by_default(tmp_path: Path) -> None:
    openai = pytest.importorskip("openai")
    servers = {"default": start_serve([], tmp_path), "none": start_serve(["--methods", "none"], tmp_path)}
    try:
        urls = {k: server.wait_healthy(240) for k, server in servers.items()}
        health = {k: httpx.get(f"{u}/health", timeout=10).json()["methods"] for k, u in urls.items()}
        assert health == {"default": ["echo", "strict"], "none": []}, health
        messages = [{"role": "user", "content": f"Here is config.yaml:\n```yaml\n{CONFIG}```\n"
                                                "Set the port to 9090. Show the whole updated file."}]
        answers = {}
        for kind, url in urls.items():
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300)
            answers[kind] = client.chat.completions.create(model="local", messages=messages, max_tokens=48,
                                                           temperature=0)
        default, none = answers["default"], answers["none"]
        assert default.choices[0].message.content == none.choices[0].message.content
        assert default.usage.completion_tokens == none.usage.completion_tokens
        fill_default = default.usage.model_extra["fill"]
        fill_none = none.usage.model_extra["fill"]
        assert set(fill_none["tokens"]) == {"sampled"}, fill_none
        copied = fill_default["tokens"].get("echo", 0)
        assert copied > 0 and fill_default["verified"]["proposed"] > 0, fill_default
        assert fill_default["forwards"] < fill_none["forwards"], (fill_default, fill_none)
    finally:
        for server in servers.values():
            server.stop(timeout=30)


def test_serve_rejects_unknown_methods(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "jumpahead.app.cli", "serve", "--methods", "echo,warp"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert run.returncode == 2
    assert "warp" in run.stderr and "Traceback" not in run.stderr, run.stderr
