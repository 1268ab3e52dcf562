"""Responses compaction items: the compacted context, sealed, as the client carries it.

OpenAI's `POST /v1/responses/compact` (and server-side compaction, `context_management`)
hands the client an opaque item `{"type": "compaction", "encrypted_content": ...}`
that stands for the whole conversation before it. jumpahead's item carries the
compacted messages themselves (JSON, sealed with the server's key: proxy/signing.py),
so a later request that sends the item back gets exactly the same messages, hence the
same prompt tokens and prefix-cache hits, with no server-side memory: it survives
restarts under `JUMPAHEAD_SIGNING_KEY` and works with `store: false`. An item that
does not verify (altered, or another server's) is a 400: dropping it would silently
lose everything it replaced.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from jumpahead.core.errors import invalid_request
from .signing import Signer
from jumpahead.core.turn import Message, ToolCall

FORMAT = 1  # version of the sealed payload
ROLES = ("system", "user", "assistant", "tool")


def _message_json(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role}
    for key in ("content", "reasoning", "tool_call_id", "name"):
        if getattr(m, key) is not None:
            out[key] = getattr(m, key)
    if m.tool_calls:
        out["tool_calls"] = [[c.id, c.name, c.arguments] for c in m.tool_calls]
    return out


def _message(raw: Any) -> Message:
    """One message back from the payload (the payload verified, so a bad shape is our bug
    or an old format: ValueError)."""
    if not isinstance(raw, dict) or raw.get("role") not in ROLES:
        raise ValueError(f"bad message {raw!r}")
    texts = {k: raw.get(k) for k in ("content", "reasoning", "tool_call_id", "name")}
    if any(v is not None and not isinstance(v, str) for v in texts.values()):
        raise ValueError(f"bad message fields {raw!r}")
    calls = []
    for call in raw.get("tool_calls") or []:
        if not (isinstance(call, list) and len(call) == 3 and all(isinstance(x, str) for x in call)):
            raise ValueError(f"bad tool call {call!r}")
        calls.append(ToolCall(call[1], call[2], id=call[0]))
    return Message(raw["role"], texts["content"], reasoning=texts["reasoning"], tool_calls=calls,
                   tool_call_id=texts["tool_call_id"], name=texts["name"])


def seal_messages(messages: list[Message], signer: Signer) -> str:
    """The `encrypted_content` standing for `messages` (the conversation without the
    request's instructions, which do not carry over)."""
    payload = {"v": FORMAT, "messages": [_message_json(m) for m in messages]}
    return signer.seal_context(orjson.dumps(payload).decode())


def compaction_item(messages: list[Message], signer: Signer) -> dict[str, Any]:
    return {"type": "compaction", "id": f"cmp_{uuid.uuid4().hex}", "encrypted_content": seal_messages(messages, signer)}


def open_item(item: dict[str, Any], signer: Signer, param: str) -> list[Message]:
    """The messages a compaction input item stands for. Raises APIError(400) when its
    `encrypted_content` is missing, altered or not this server's."""
    sealed = item.get("encrypted_content")
    if not isinstance(sealed, str) or not sealed:
        raise invalid_request(f"{param}.encrypted_content must be the non-empty string a compaction returned",
                              param=f"{param}.encrypted_content")
    text = signer.open_context(sealed)
    if text is None:
        raise invalid_request(
            f"{param} is a compaction item this server did not issue, or one that was altered: its "
            "encrypted_content does not verify. Send the items it replaced instead, or compact again on this "
            "server (POST /v1/responses/compact)", param=f"{param}.encrypted_content", code="invalid_compaction_item")
    try:
        payload = orjson.loads(text)
        if not isinstance(payload, dict) or payload.get("v") != FORMAT:
            raise ValueError(f"format {payload.get('v') if isinstance(payload, dict) else payload!r}")
        return [_message(m) for m in payload.get("messages") or []]
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise invalid_request(f"{param}: the compaction item's content is not one this server version reads ({exc})",
                              param=f"{param}.encrypted_content", code="invalid_compaction_item") from None


def compact_threshold(body: dict[str, Any]) -> int | None:
    """The token count above which a /v1/responses request is compacted first
    (`context_management: [{"type": "compaction", "compact_threshold": N}]`); 0 when
    the entry names no threshold (the caller uses 80% of the model's window); None
    without context_management. 400 when malformed."""
    value = body.get("context_management")
    if value is None:
        return None
    if not isinstance(value, list):
        raise invalid_request("context_management must be an array of {\"type\": \"compaction\", "
                              "\"compact_threshold\": N} entries", param="context_management")
    found: int | None = None
    for i, entry in enumerate(value):
        param = f"context_management[{i}]"
        if not isinstance(entry, dict):
            raise invalid_request(f"{param} must be an object, got {type(entry).__name__}", param=param)
        if entry.get("type") != "compaction":
            raise invalid_request(f"{param}.type must be \"compaction\" (the only context management served), "
                                  f"got {entry.get('type')!r}", param=f"{param}.type")
        threshold = entry.get("compact_threshold", 0)
        threshold = 0 if threshold is None else threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0 \
                or (threshold == 0 and "compact_threshold" in entry and entry["compact_threshold"] is not None):
            raise invalid_request(f"{param}.compact_threshold must be a positive integer (prompt tokens), "
                                  f"got {entry.get('compact_threshold')!r}", param=f"{param}.compact_threshold")
        found = threshold if found is None or (threshold and threshold < found) else found
    return found


def default_threshold(context_length: int) -> int:
    """`compact_threshold` left out: compact past 80% of the window."""
    return max(1, context_length * 4 // 5)
