"""Plain OpenAI chat logs: the `messages` of chat-completions requests.

Accepted shapes: a JSON object with "messages" (a request body, optionally with the
response's "choices", whose first message is appended); a JSON list of messages; JSONL
of messages; and a list (JSON or JSONL) of request bodies. Agents resend the whole
history on every request, so consecutive bodies whose messages extend the previous
ones form one session (its messages are the union, in order); a body that does not
extend the session so far starts a new one. An assistant message first seen in body k
was written by request k-1, so it gets that request's model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jumpahead.core.turn import Message

from ..formats import Format, register
from ..session import Session
from . import _openai
from ._common import first_dicts, json_document, looks_like_document, read_jsonl

NAME = "openai-messages"


def _is_body(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("messages"), list) and all(
        _openai.is_message(m) for m in value["messages"][:5])


def _shape(values: list[Any]) -> str | None:
    sample = values[:5]
    if sample and all(_openai.is_message(v) for v in sample):
        return "messages"
    if sample and all(_is_body(v) for v in sample):
        return "bodies"
    return None


def detect(path: Path, head: bytes) -> bool:
    if looks_like_document(head):
        doc = json_document(path)
        if doc is not None:
            return _is_body(doc) or (isinstance(doc, list) and _shape(doc) is not None)
    rows = first_dicts(path, head, 10)
    return len(rows) > 0 and _shape(rows) is not None


def _key(m: Message) -> tuple[Any, ...]:
    """What must match for a resent message to count as the same (agents re-serialise)."""
    return (m.role, (m.content or "").strip(), m.tool_call_id, tuple((c.name, c.arguments) for c in m.tool_calls))


def _from_bodies(bodies: list[dict[str, Any]], path: Path, warnings: list[str]) -> list[Session]:
    sessions: list[Session] = []
    keys: list[tuple[Any, ...]] = []
    prev_model: str | None = None
    for n, body in enumerate(bodies):
        msgs = [_openai.convert(m) for m in body["messages"] if _openai.is_message(m)]
        new_keys = [_key(m) for m in msgs]
        extends = bool(sessions) and new_keys[: len(keys)] == keys
        if not extends:
            sessions.append(Session(id=f"{path.stem}" + (f"-{len(sessions)}" if sessions else ""), format=NAME,
                                    source=str(path), warnings=warnings if not sessions else []))
            keys, prev_model = [], None
        session = sessions[-1]
        for m in msgs[len(keys):]:
            if m.role == "assistant":
                m.model = prev_model
            session.messages.append(m)
        keys = new_keys
        prev_model = body.get("model") if isinstance(body.get("model"), str) else prev_model
        if isinstance(body.get("tools"), list):
            session.tools = body["tools"]
        session.meta.setdefault("requests", 0)
        session.meta["requests"] += 1
        session.meta["model"] = prev_model
    for s in sessions:
        _openai.link_tool_names(s.messages)
    return sessions


def _from_messages(messages: list[Any], path: Path, warnings: list[str], body: dict[str, Any] | None) -> Session:
    model = body.get("model") if body and isinstance(body.get("model"), str) else None
    session = Session(id=str((body or {}).get("id") or path.stem), format=NAME, source=str(path), warnings=warnings)
    skipped = 0
    for m in messages:
        if _openai.is_message(m):
            session.messages.append(_openai.convert(m, model=model))
        else:
            skipped += 1
    choices = (body or {}).get("choices")
    if isinstance(choices, list) and choices and _openai.is_message((choices[0] or {}).get("message")):
        session.messages.append(_openai.convert(choices[0]["message"], model=model))
    if skipped:
        warnings.append(f"skipped {skipped} entries that are not chat messages")
    if body and isinstance(body.get("tools"), list):
        session.tools = body["tools"]
    if model:
        session.meta["model"] = model
    _openai.link_tool_names(session.messages)
    return session


def load(path: Path) -> list[Session]:
    warnings: list[str] = []
    doc = json_document(path)
    if doc is None:
        rows: list[Any] = read_jsonl(path, warnings)
    elif isinstance(doc, dict):
        if not _is_body(doc):
            raise ValueError(f"{path}: a JSON object without a chat \"messages\" list")
        return [_from_messages(doc["messages"], path, warnings, doc)]
    elif isinstance(doc, list):
        rows = doc
    else:
        raise ValueError(f"{path}: neither chat messages nor request bodies")
    shape = _shape(rows)
    if shape == "bodies":
        bodies = [r for r in rows if _is_body(r)]
        if len(bodies) < len(rows):
            warnings.append(f"skipped {len(rows) - len(bodies)} entries that are not request bodies")
        return _from_bodies(bodies, path, warnings)
    if shape == "messages":
        return [_from_messages(rows, path, warnings, None)]
    raise ValueError(f"{path}: neither chat messages nor request bodies")


register(Format(NAME, "OpenAI chat messages: {\"messages\"}, a list or JSONL of messages, or of request bodies",
                detect, load))
