"""Where jumpahead keeps its files: one definition, importable before mlx (engine/machine/blas.py)."""

from __future__ import annotations

import os
from pathlib import Path


def jumpahead_home() -> Path:
    """`$JUMPAHEAD_HOME`, else `$XDG_CACHE_HOME/jumpahead`, else `~/.cache/jumpahead`."""
    if home := os.environ.get("JUMPAHEAD_HOME"):
        return Path(home).expanduser()
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg).expanduser() / "jumpahead"
    return Path.home() / ".cache" / "jumpahead"
