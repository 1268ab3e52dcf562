"""Helpers for tests that run the real server: uvicorn in a thread, `jumpahead serve`
subprocesses, script-mode engines. The servers themselves are jumpahead.live.server_process's
(serve_app, ServerProcess), which the benches use too."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def script_engine(loaded_model: Any, max_batch: int = 4) -> Any:
    """An Engine over the session's model whose asserted slices hold a whole scripted turn."""
    from jumpahead.engine.engine import Engine, EngineConfig

    model, tokenizer, info = loaded_model
    return Engine(model, tokenizer, info, EngineConfig(max_batch=max_batch, max_asserted=SCRIPT_SLICE))
