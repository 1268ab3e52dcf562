"""Install the real agent clients the end-to-end tests drive, into a scratch cache.

npm clients go into one `npm install --prefix DIR`; Python clients each get a venv of
their own (their pins conflict with ours and with each other). Versions are pinned to
the ones the captured fixtures came from. The cache lives in $JUMPAHEAD_CLIENTS_DIR
(default ~/.cache/jumpahead/clients) and is reused across runs; an install that did
not finish is redone. Run `python tests/agent_clients.py` to install them all ahead.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

NPM_CLIENTS = {  # executable -> package spec
    "claude": "@anthropic-ai/claude-code@2.1.197",
    "pi": "@mariozechner/pi-coding-agent@0.73.1",
}
PY_CLIENTS = {  # executable -> package spec
    "aider": "aider-chat==0.86.2",
    "mini": "mini-swe-agent==2.4.6",
}
INSTALL_TIMEOUT_S = 900


class InstallError(RuntimeError):
    pass


def clients_dir() -> Path:
    root = os.environ.get("JUMPAHEAD_CLIENTS_DIR")
    return Path(root) if root else Path.home() / ".cache" / "jumpahead" / "clients"


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One installer at a time per cache (parallel test runs share it)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(argv: list[str], what: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(f"installing {what} failed: {exc}") from exc
    if done.returncode != 0:
        raise InstallError(f"installing {what} failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")


def _marker(folder: Path, spec: str) -> Path:
    return folder / f".installed-{spec.replace('/', '_').replace('@', '_').replace('=', '_')}"


def npm_client(name: str) -> Path:
    """The executable of an npm client, installed on first use."""
    spec = NPM_CLIENTS[name]
    folder = clients_dir() / "npm"
    exe = folder / "node_modules" / ".bin" / name
    with _locked(clients_dir()):
        if not (_marker(folder, spec).exists() and exe.exists()):
            npm = shutil.which("npm")
            if npm is None:
                raise InstallError("npm is not on PATH (install Node.js 18+)")
            _run([npm, "install", "--prefix", str(folder), "--no-audit", "--no-fund", "--loglevel=error", spec], spec)
            if not exe.exists():
                raise InstallError(f"{spec} installed but {exe} is missing")
            _marker(folder, spec).touch()
    return exe


def python_client(name: str) -> Path:
    """The executable of a Python client, installed into a venv of its own on first use."""
    spec = PY_CLIENTS[name]
    folder = clients_dir() / f"venv-{name}"
    exe = folder / "bin" / name
    with _locked(clients_dir()):
        if not (_marker(folder, spec).exists() and exe.exists()):
            if folder.exists():
                shutil.rmtree(folder)
            _run([sys.executable, "-m", "venv", str(folder)], f"a venv for {spec}")
            _run([str(folder / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", spec],
                 spec)
            if not exe.exists():
                raise InstallError(f"{spec} installed but {exe} is missing")
            _marker(folder, spec).touch()
    return exe


def main() -> int:
    for name in NPM_CLIENTS:
        print(name, npm_client(name))
    for name in PY_CLIENTS:
        print(name, python_client(name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
