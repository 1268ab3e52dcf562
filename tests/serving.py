"""Helpers for tests that run the real server: uvicorn in a thread, script-mode engines."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(engine: Any, **app_kwargs: Any) -> Iterator[str]:
    """Run create_app(engine, **app_kwargs) with uvicorn in a thread; yield its base URL."""
    import uvicorn

    from jumpahead.proxy.server import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine, **app_kwargs), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def script_engine(loaded_model: Any, max_batch: int = 4) -> Any:
    """An Engine over the session's model whose asserted slices hold a whole scripted turn."""
    from jumpahead.engine.engine import Engine, EngineConfig

    model, tokenizer, info = loaded_model
    return Engine(model, tokenizer, info, EngineConfig(max_batch=max_batch, max_asserted=SCRIPT_SLICE))
