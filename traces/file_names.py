"""Session ids as file names: a trace file (traces/recorder.py), an imported session
(`jumpahead import`) and a live run's traces are named `<safe_file_stem(id)>.jsonl`/`.json`.

Session ids come from clients (headers, body fields, imported files; see
proxy/session_identity.py), so they are never used raw in a path.
"""

from __future__ import annotations

import hashlib
import re

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_file_stem(session: str, limit: int = 96) -> str:
    """`session` as a file name stem: only [A-Za-z0-9._-], no leading dot, bounded length,
    with a short hash when anything was changed so distinct ids stay distinct."""
    cleaned = _SAFE.sub("_", session).lstrip(".")[:limit]
    if cleaned != session or not cleaned:
        cleaned = f"{cleaned[: limit - 13]}-{hashlib.sha256(session.encode()).hexdigest()[:12]}".lstrip("-.")
    return cleaned
