"""Which agent session a request belongs to, from its headers and body.

Agents resend the whole history every turn; the recorder, the policies' per-session
memo (sticky compaction) and the trace file all key on one session id:

1. the client's own session id where it sends one: Claude Code's
   `X-Claude-Code-Session-Id` header (and `metadata.user_id`'s JSON `session_id`),
   pi and Codex's `session_id` header, opencode's `x-opencode-session`, an explicit
   `x-session-id` / `jumpahead.session` field, Codex's Responses `prompt_cache_key`;
2. else a hash of the conversation's first messages (system text and the first user
   message), which every later turn of the same conversation resends unchanged.

The id is sanitized for use in file names by traces/file_names.py `safe_file_stem`,
never used raw.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

SESSION_HEADERS = ("x-claude-code-session-id", "session_id", "session-id", "x-session-id",
                   "x-opencode-session", "x-opencode-session-id", "conversation_id", "x-conversation-id")


def _metadata_session(body: Mapping[str, Any]) -> str | None:
    meta = body.get("metadata")
    if not isinstance(meta, dict):
        return None
    for key in ("session_id", "conversation_id"):
        if isinstance(meta.get(key), str) and meta[key]:
            return meta[key]
    user = meta.get("user_id")
    if isinstance(user, str) and user.startswith("{"):
        try:
            parsed = orjson.loads(user)
        except orjson.JSONDecodeError:
            return None
        if isinstance(parsed, dict) and isinstance(parsed.get("session_id"), str) and parsed["session_id"]:
            return parsed["session_id"]
    return None


def client_session_id(headers: Mapping[str, str], body: Mapping[str, Any], asked: str | None = None) -> str | None:
    """The session id the client sent, if any (headers are matched case-insensitively);
    `asked`: the request's `jumpahead.session`."""
    lower = {k.lower(): v for k, v in headers.items()}
    for name in SESSION_HEADERS:
        value = lower.get(name)
        if value and value.strip():
            return value.strip()
    if asked:
        return asked
    found = _metadata_session(body)
    if found:
        return found
    key = body.get("prompt_cache_key")
    if isinstance(key, str) and key:
        return key
    return None


def conversation_session_id(turn: Any) -> str:
    """A stable id from the conversation's first system and user messages."""
    h = hashlib.sha256()
    seen_user = False
    for m in turn.messages:
        if m.role == "system":
            h.update(b"s\0" + (m.content or "").encode() + b"\0")
        elif m.role == "user":
            h.update(b"u\0" + (m.content or "").encode() + b"\0")
            seen_user = True
            break
    if not seen_user and turn.messages:
        h.update(b"f\0" + (turn.messages[0].content or "").encode())
    return "conv-" + h.hexdigest()[:16]


def session_id(headers: Mapping[str, str], body: Mapping[str, Any], turn: Any) -> str:
    return client_session_id(headers, body, turn.options.session) or conversation_session_id(turn)
