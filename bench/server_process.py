"""A real `jumpahead serve` in a subprocess, for the load, disconnect and crash benches:
start it on a free loopback port, wait until /health answers, read its RSS, kill it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


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


class ServeError(RuntimeError):
    pass


def exit_on_sigterm() -> None:
    """Turn SIGTERM (`timeout`, CI) into SystemExit, so `finally` blocks stop the servers
    a bench started instead of leaving them running."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


class ServerProcess:
    """`python -m jumpahead.proxy.cli serve ARGS --port P`, its log in `log_path`."""

    def __init__(self, args: list[str], log_path: str | Path, start_timeout: float = 1200.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        self._log = self.log_path.open("ab")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jumpahead.proxy.cli", "serve", *args, "--port", str(self.port)],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
        )
        try:
            self._wait_healthy(start_timeout)
        except BaseException:
            self.kill()
            raise
        self.start_s = time.monotonic() - t0

    @property
    def pid(self) -> int:
        return self.proc.pid

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
                raise ServeError(f"jumpahead serve did not answer /health within {timeout:.0f} s")
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
