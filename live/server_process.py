"""Servers for the benches (and the tests, tests/serving.py):

- ServerProcess: a real `jumpahead serve` in a subprocess, for the load, disconnect and
  crash benches: start it on a free loopback port, wait until /health answers, read its
  RSS, kill it; `on_server` runs a bench's body against one;
- serve_app: an app (create_app(...)) under uvicorn in a thread of this process."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_of(pid: int) -> int | None:
    """Resident set size of a process in bytes (Linux /proc; None when unknown)."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def cpu_s_of(pid: int) -> float | None:
    """CPU seconds (user + system) a process has used (Linux /proc; None when unknown):
    what a request costs a server, robust to other load on the machine, unlike wall time."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class ServeError(RuntimeError):
    pass


def exit_on_sigterm() -> None:
    """Turn SIGTERM (`timeout`, CI) into SystemExit, so `finally` blocks stop the servers
    a bench started instead of leaving them running."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


class ServerProcess:
    """`python -m jumpahead.app.cli serve ARGS --port P` (or `command` ARGS --port P; in `cwd`, with `env` added to
    the environment), its log in `log_path`. The constructor waits until it answers,
    unless `wait` is False: then call wait_healthy (several servers start side by side)."""

    def __init__(self, args: list[str], log_path: str | Path, start_timeout: float = 1200.0, *,
                 cwd: str | Path | None = None, env: dict[str, str] | None = None, wait: bool = True,
                 command: list[str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        self._log = self.log_path.open("ab")
        self._t0 = time.monotonic()
        self.start_s = 0.0  # seconds from start to the first 200 of /health, once it answered
        self.proc = subprocess.Popen(
            [*(command or [sys.executable, "-m", "jumpahead.app.cli", "serve"]), *args, "--port", str(self.port)],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        if wait:
            self.wait_healthy(start_timeout)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_healthy(self, timeout: float = 1200.0) -> str:
        """Until /health answers 200; the base URL. ServeError (the server killed) when it
        exits first or does not answer within `timeout` seconds."""
        try:
            self._wait_healthy(timeout)
        except BaseException:
            self.kill()
            raise
        self.start_s = time.monotonic() - self._t0
        return self.url

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise ServeError(f"jumpahead serve exited with {self.proc.returncode} before answering; "
                                 f"log: {self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ServeError(f"jumpahead serve did not answer /health within {timeout:.0f} s; "
                                 f"log: {self.log_tail()}")
            time.sleep(0.1)

    def rss(self) -> int | None:
        return rss_of(self.proc.pid)

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer would."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)
        self._log.close()

    def stop(self, timeout: float = 30.0) -> int:
        """Ctrl-C; SIGKILL if it does not stop in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=60)
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def on_server(bench: str, serve_args: list[str], log_path: Path, body: Callable[[ServerProcess], T]) -> T | None:
    """Start `jumpahead serve serve_args`, return body(server), stop the server. None, with
    a line on stderr, when the server does not start or a ServeError stops the body."""
    try:
        server = ServerProcess(serve_args, log_path)
    except ServeError as exc:
        print(f"jumpahead bench {bench}: {exc}", file=sys.stderr)
        return None
    try:
        return body(server)
    except ServeError as exc:
        print(f"jumpahead bench {bench}: {exc}", file=sys.stderr)
        return None
    finally:
        server.stop()


@contextlib.contextmanager
def serve_app(app: Any, timeout: float = 60.0, name: str = "uvicorn") -> Iterator[str]:
    """`app` under uvicorn in a daemon thread on a free loopback port; yields its base URL
    and stops the server on exit."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
