"""Helpers every importer shares: robust JSON / JSONL reading, sniffing a file's head,
text out of content blocks, timestamps, tool-call arguments.

No agent ships a maintained Python parser for its own session files (pi, Claude Code,
Codex, opencode write them from TypeScript or Rust; mini-swe-agent, SWE-agent and
OpenHands write plain JSON), so each importer walks the documented shape itself.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

import orjson

from jumpahead.core.content import content_texts
from jumpahead.core.turn import Message

# (path, mtime_ns, size) -> parsed document, or None where it is not one JSON document.
# Several detectors ask for the same file; it is read and parsed once.
_DOC_CACHE: dict[tuple[str, int, int], Any] = {}
_NOT_JSON = object()


def head_values(head: bytes, limit: int = 40) -> list[Any]:
    """The JSON values on the first complete lines of `head` (a file's first bytes).

    Lines that do not parse are skipped (the last line of a head is often cut short).
    """
    out: list[Any] = []
    for line in head.split(b"\n")[:limit]:
        line = line.strip()
        if not line:
            continue
        try:
            out.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    return out


def head_dicts(head: bytes, limit: int = 40) -> list[dict[str, Any]]:
    return [v for v in head_values(head, limit) if isinstance(v, dict)]


def first_dicts(path: Path, head: bytes, limit: int = 40) -> list[dict[str, Any]]:
    """The JSON objects on a JSONL file's first lines. Where the head holds fewer than two
    complete lines (one huge tool output can exceed it), the lines are read from the file."""
    rows = head_dicts(head, limit)
    if len(rows) >= 2 or head.count(b"\n") >= 2:
        return rows
    rows = []
    try:
        with path.open("rb") as fh:
            for _ in range(min(limit, 4)):
                line = fh.readline()
                if not line:
                    break
                try:
                    value = orjson.loads(line)
                except orjson.JSONDecodeError:
                    break
                if isinstance(value, dict):
                    rows.append(value)
    except OSError:
        return []
    return rows


def json_document(path: Path) -> Any:
    """The file parsed as one JSON document, or None where it is not one (JSONL, text)."""
    try:
        st = path.stat()
    except OSError:
        return None
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    if key not in _DOC_CACHE:
        try:
            value: Any = orjson.loads(path.read_bytes())
        except (orjson.JSONDecodeError, OSError):
            value = _NOT_JSON
        _DOC_CACHE.clear()  # keep only the latest file: imports run file by file
        _DOC_CACHE[key] = value
    value = _DOC_CACHE[key]
    return None if value is _NOT_JSON else value


def looks_like_document(head: bytes) -> bool:
    """Cheap pre-check before parsing a whole file: it starts like a JSON object or list."""
    stripped = head.lstrip()
    return stripped[:1] in (b"{", b"[")


def load_document(path: Path) -> Any:
    """The file as one JSON document; ValueError naming the problem where it is not."""
    value = json_document(path)
    if value is None:
        raise ValueError(f"{path}: not a JSON document")
    return value


def read_jsonl(path: Path, warnings: list[str]) -> list[dict[str, Any]]:
    """Every JSON object line of a JSONL file; bad lines become warnings, never errors."""
    out: list[dict[str, Any]] = []
    bad: list[int] = []
    with path.open("rb") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError:
                bad.append(n)
                continue
            if isinstance(value, dict):
                out.append(value)
            else:
                bad.append(n)
    if bad:
        shown = ", ".join(str(n) for n in bad[:5]) + (" ..." if len(bad) > 5 else "")
        warnings.append(f"skipped {len(bad)} line(s) that are not JSON objects (line {shown})")
    return out


TEXT_TYPES = ("text", "input_text", "output_text")


def join_texts(parts: list[str], sep: str = "\n\n") -> str:
    """Join text blocks, dropping whitespace-only ones (streaming leaves "\\n\\n" blocks)."""
    return sep.join(p for p in parts if p and p.strip())


def content_text(content: Any, sep: str = "\n\n") -> str:
    """Plain text out of a message's content: a string, or a list of typed blocks (the
    text ones count; images, tool blocks and what a format adds are left out)."""
    if isinstance(content, str):
        return content
    texts = content_texts(content, _block_text)
    return str(content) if texts is None else join_texts(texts, sep)


def _block_text(block: Any, where: str) -> str | None:
    if isinstance(block, dict) and (block.get("type") in TEXT_TYPES or "type" not in block):
        text = block.get("text")
        return text if isinstance(text, str) else None
    return None


def count_images(content: Any) -> int:
    if not isinstance(content, list):
        return 0
    return sum(1 for b in content if isinstance(b, dict) and b.get("type") in ("image", "input_image", "image_url"))


def iso_time(value: Any) -> str | None:
    """An ISO-8601 UTC time from an ISO string or Unix seconds / milliseconds."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        return value or None
    if isinstance(value, (int, float)):
        seconds = value / 1000.0 if value > 1e11 else float(value)  # ms since ~1973 exceed 1e11
        try:
            stamp = _dt.datetime.fromtimestamp(seconds, tz=_dt.timezone.utc)
        except (OverflowError, OSError, ValueError):
            return None
        return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return None


def parse_arguments(raw: Any) -> Any:
    """Tool-call arguments as a JSON value: JSON text is parsed, other text kept as it is."""
    if isinstance(raw, str):
        text = raw.strip()
        if text[:1] in ("{", "["):
            try:
                return orjson.loads(text)
            except orjson.JSONDecodeError:
                return raw
        return raw if raw else {}
    if raw is None:
        return {}
    return raw


def compaction_message(text: str, first_kept: int | None, *, role: str = "user", timestamp: str | None = None,
                       **extra: Any) -> Message:
    """A compaction summary as a message. `meta["compaction"]["first_kept"]` is the index in
    Session.messages of the first earlier message still in context after the compaction
    (None: nothing earlier is kept); Session.turn() builds later contexts from it."""
    info = {"first_kept": first_kept, **{k: v for k, v in extra.items() if v is not None}}
    return Message(role=role, content=text, timestamp=timestamp, meta={"compaction": info})  # type: ignore[arg-type]

