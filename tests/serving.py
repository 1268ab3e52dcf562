"""Helpers for tests that run the real server: uvicorn in a thread, `jumpahead serve`
subprocesses, script-mode engines. The servers themselves are jumpahead.live.server_process's
(serve_app, ServerProcess), which the benches use too."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
from jumpahead.live.server_process import ServerProcess, free_port, serve_app  # noqa: F401  (free_port: the tests')

SCRIPT_SLICE = 1024  # max_asserted for script-mode test engines: a whole turn in one round


def interrupt(proc: subprocess.Popen, timeout: float) -> int:
    """Stop a server process with Ctrl-C, as a user would; its exit code (killed and
    raised if it does not stop within `timeout`)."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


@contextlib.contextmanager
def serve(engine: Any, **app_kwargs: Any) -> Iterator[str]:
    """Run create_app(engine, **app_kwargs) with uvicorn in a thread; yield its base URL."""
    from jumpahead.proxy.server import create_app

    with serve_app(create_app(engine, **app_kwargs), timeout=30, name="uvicorn-test") as url:
        yield url


def cli_process(args: list[str], env: dict[str, str] | None = None, cwd: Path | str | None = None) -> subprocess.Popen[str]:
    """`python -m jumpahead.app.cli ARGS` (unbuffered, `env` added to the environment), its stdout and
    stderr together in `proc.stdout` as text; not waited for."""
    return subprocess.Popen([sys.executable, "-m", "jumpahead.app.cli", *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


def wait_health(proc: subprocess.Popen[str], url: str, timeout: float, *, ok: bool = False,
                poll: float = 0.3) -> httpx.Response:
    """GET url/health until it answers (with `ok`, until it answers 200): that answer. Asserts on
    the way that `proc` (a cli_process) is still running and that `timeout` seconds have not passed."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"the server exited {proc.returncode}:\n{proc.stdout.read()[-3000:]}"
        try:
            health = httpx.get(f"{url}/health", timeout=2)
            if health.status_code == 200 or not ok:
                return health
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the server did not come up"
        time.sleep(poll)


def rows_idle(url: str, timeout: float) -> bool:
    """Whether the server at `url` reports no rows running or waiting within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = httpx.get(f"{url}/health").json()
        if health["rows_running"] == 0 and health["rows_waiting"] == 0:
            return True
        time.sleep(0.1)
    return False


def sse_events(response: Any) -> list[tuple[str, dict]]:
    """(event name, data) of each server-sent event of a streamed httpx response."""
    events, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            events.append((name, json.loads(line.removeprefix("data: "))))
    return events


def start_serve(args: list[str], cwd: Path) -> ServerProcess:
    """`jumpahead serve --max-batch 2 --log-level warning --no-ssd-cache ARGS` started in
    `cwd` (its log there too) on a free port; not waited for: call its wait_healthy(timeout),
    and stop() it at the end."""
    fd, log = tempfile.mkstemp(prefix="serve-", suffix=".log", dir=cwd)
    os.close(fd)
    return ServerProcess(["--max-batch", "2", "--log-level", "warning", "--no-ssd-cache", *args], log,
                         cwd=cwd, wait=False)


@contextlib.contextmanager
def engine_of(loaded_model: Any, **config: Any) -> Iterator[Any]:
    """An Engine over the session's model with EngineConfig(**config), closed at the end."""
    from jumpahead.engine.engine import Engine, EngineConfig

    model, tokenizer, info = loaded_model
    eng = Engine(model, tokenizer, info, EngineConfig(**config))
    try:
        yield eng
    finally:
        eng.close()


def script_engine(loaded_model: Any, max_batch: int = 4) -> Any:
    """An Engine over the session's model whose asserted slices hold a whole scripted turn."""
    from jumpahead.engine.engine import Engine, EngineConfig

    model, tokenizer, info = loaded_model
    return Engine(model, tokenizer, info, EngineConfig(max_batch=max_batch, max_asserted=SCRIPT_SLICE))


def chat_prompt(tokenizer: Any, text: str) -> list[int]:
    """One user message through the chat template, ready for a GenerationRequest."""
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)


def run_rows(engine: Any, requests: list[Any]) -> list[dict[str, Any]]:
    """Run GenerationRequests together on an in-process engine: per row its tokens, their
    kinds and the final chunk's usage.fill (a row that ended in an error fails the test)."""
    import asyncio

    async def one(req: Any) -> dict[str, Any]:
        tokens, kinds, fill = [], [], None
        async for chunk in engine.stream(req):
            tokens += chunk.tokens
            kinds += chunk.kinds
            if chunk.finish_reason is not None:
                assert chunk.error is None, chunk.error
                fill = chunk.fill
        return {"tokens": tokens, "kinds": kinds, "fill": fill}

    async def all_rows() -> list[dict[str, Any]]:
        return await asyncio.gather(*[one(r) for r in requests])

    return asyncio.run(all_rows())


def frozen_width_policy() -> Any:
    """The scheduler's width policy at this CPU's default costs, never refitted from the
    rounds it times. Tests that check which proposals a round carries use it: a fit on a
    loaded machine (a test suite beside other work) can price every proposal out, so
    nothing would be verified; the fit itself is tested on given rounds (test_ragged)."""
    from jumpahead.engine.schedule.width_policy import WidthPolicy

    class FrozenWidthPolicy(WidthPolicy):
        def observe_round(self, tokens: int, width: int, seconds: float) -> None:
            return None

    return FrozenWidthPolicy()
