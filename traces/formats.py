"""Importer registry: detect a session file's format and read it into a Session.

Each importer module registers itself with `register`; `load_session(path)` tries the
detectors in registration order and fails with a message naming every known format.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .session import Session


class UnknownFormat(ValueError):
    """A file no importer recognises."""


@dataclass
class Format:
    name: str
    description: str
    detect: Callable[[Path, bytes], bool]  # (path, the file's first 64 KiB) -> is it mine
    load: Callable[[Path], list[Session]]  # one file may hold several sessions


FORMATS: list[Format] = []


def register(fmt: Format) -> Format:
    FORMATS.append(fmt)
    return fmt


def known_formats() -> list[str]:
    _load_importers()
    return [f.name for f in FORMATS]


def _load_importers() -> None:
    from . import importers  # noqa: F401  (registers every built-in format)


def detect(path: str | Path) -> Format:
    _load_importers()
    p = Path(path)
    try:
        with p.open("rb") as fh:
            head = fh.read(1 << 16)
    except OSError as exc:
        raise UnknownFormat(f"cannot read {p}: {exc}") from None
    for fmt in FORMATS:
        try:
            if fmt.detect(p, head):
                return fmt
        except Exception:  # a detector must never break detection of other formats
            continue
    names = ", ".join(f.name for f in FORMATS)
    raise UnknownFormat(f"{p}: not a session format jumpahead knows (known: {names})")


def load_sessions(path: str | Path, format: str | None = None) -> list[Session]:
    """Every session in the file, read by the named format or the detected one."""
    _load_importers()
    if format is not None:
        found = [f for f in FORMATS if f.name == format]
        if not found:
            raise UnknownFormat(f"unknown format {format!r} (known: {', '.join(f.name for f in FORMATS)})")
        return found[0].load(Path(path))
    return detect(path).load(Path(path))


def load_session(path: str | Path, format: str | None = None) -> Session:
    """The file's first (normally only) session."""
    sessions = load_sessions(path, format)
    if not sessions:
        raise UnknownFormat(f"{path}: no session in the file")
    return sessions[0]
