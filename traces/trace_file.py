"""Reading jumpahead's own trace files (written by traces/recorder.py).

A trace file is JSONL: a `session` header line, then one `turn` line per answered
request. Since version 2 a turn line may store only what it adds to an earlier turn of
the file (traces/delta.py); the reader gives every turn whole. A server killed
mid-write leaves at most one partial last line; a reader must still give every
complete turn, so a line that does not parse is skipped with a warning, never an error.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson

from .delta import DeltaError, decode

log = logging.getLogger(__name__)

FORMAT = "jumpahead-trace"  # the header's "format": tells our files from other JSONL sessions
VERSION = 2  # 2: turn lines may be deltas of earlier ones (version 1 files read the same way)


def is_header(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("type") == "session" and obj.get("format") == FORMAT


def read_trace(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """(header, turns, warnings) of a trace file.

    The header is the first `session` line ({} when there is none: a warning). A later
    `session` line (the server restarted and appended to the same session) is kept
    under header["resumed"]. Turns keep file order.
    """
    p = Path(path)
    header: dict[str, Any] = {}
    turns: list[dict[str, Any]] = []
    warnings: list[str] = []

    def warn(message: str) -> None:
        log.warning("%s", message)
        warnings.append(message)

    whole: dict[Any, dict[str, Any]] = {}  # turn index -> the whole turn (the base of later deltas)

    def _take(obj: Any, n: int) -> None:
        nonlocal header
        kind = obj.get("type") if isinstance(obj, dict) else None
        if kind == "turn":
            if "delta" in obj:
                of = obj["delta"].get("of") if isinstance(obj["delta"], dict) else None
                base = whole.get(of)
                if base is None:
                    warn(f"{p} line {n}: skipped turn {obj.get('index')!r}: it extends turn {of!r}, "
                         "which the file does not hold whole")
                    return
                try:
                    obj = decode(obj, base)
                except DeltaError as exc:
                    warn(f"{p} line {n}: skipped turn {obj.get('index')!r}: {exc}")
                    return
            whole[obj.get("index")] = obj
            turns.append(obj)
        elif kind == "session":
            if not header:
                header = obj
            else:
                header.setdefault("resumed", []).append(obj)
        else:
            warn(f"{p} line {n}: skipped a line of unknown type {kind!r}")

    with p.open("rb") as fh:
        for n, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                # no newline after it: the write in flight when the server died
                what = "a corrupt line" if raw.endswith(b"\n") else "a half-written last line"
                warn(f"{p} line {n}: skipped {what} ({len(raw)} bytes): {exc}")
                continue
            _take(obj, n)
    if not header:
        warn(f"{p}: no session header line")
    return header, turns, warnings
