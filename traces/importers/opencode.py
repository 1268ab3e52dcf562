"""opencode session exports (`opencode export <sessionID>`, cli/cmd/export.ts).

The export is one JSON object `{info, messages: [{info, parts}], todos}`: `info` is the
Session.Info, each message's `info` a MessageV2 User or Assistant, `parts` its typed parts
(session/message-v2.ts). One opencode assistant message may hold several model calls:
each `step-start` part opens a step, and the AI SDK sends each step to the model as its
own assistant message followed by its tool results (`toModelMessages`). So each step
becomes one assistant message here, followed by one tool message per `tool` part in it.

Tool parts carry both halves of a call: `state.input` (the arguments) and, when
`completed`, `state.output`; an `error` state's `error` text is the result; a pending or
running call is answered "[Tool execution was interrupted]" as opencode itself does.
User `compaction` parts start a compaction (opencode asks "What did we do so far?" and
the next assistant message, `summary: true`, answers with the summary).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jumpahead.core.turn import Message, ToolCall

from ..formats import Format, register
from ..session import Session
from ._common import iso_time, join_texts, json_document, load_document, looks_like_document

NAME = "opencode"
INTERRUPTED = "[Tool execution was interrupted]"


def _is_export(doc: Any) -> bool:
    return (isinstance(doc, dict) and isinstance(doc.get("info"), dict) and isinstance(doc.get("messages"), list)
            and all(isinstance(m, dict) and isinstance(m.get("info"), dict) and isinstance(m.get("parts"), list)
                    for m in doc["messages"][:5]))


def detect(path: Path, head: bytes) -> bool:
    return looks_like_document(head) and _is_export(json_document(path))


def _model(info: dict[str, Any]) -> str | None:
    if info.get("modelID"):
        return str(info["modelID"])
    model = info.get("model")  # user messages: {providerID, modelID}
    return str(model["modelID"]) if isinstance(model, dict) and model.get("modelID") else None


def _user(info: dict[str, Any], parts: list[dict[str, Any]], ts: str | None) -> Message:
    """toModelMessages: text parts (not `ignored`), files as notes, compaction and subtask prompts."""
    texts: list[str] = []
    meta: dict[str, Any] = {}
    for part in parts:
        kind = part.get("type")
        if kind == "text" and not part.get("ignored"):
            texts.append(part.get("text") or "")
        elif kind == "file":
            meta.setdefault("files", []).append(part.get("filename") or part.get("url"))
        elif kind == "compaction":
            texts.append("What did we do so far?")
            meta["compaction_request"] = {"auto": part.get("auto")}
        elif kind == "subtask":
            texts.append("The following tool was executed by the user")
    if info.get("system"):
        meta["system"] = info["system"]
    return Message(role="user", content=join_texts(texts), timestamp=ts, model=None, meta=meta)


def _steps(parts: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    steps: list[list[dict[str, Any]]] = []
    for part in parts:
        if part.get("type") == "step-start" or not steps:
            steps.append([])
        if part.get("type") != "step-start":
            steps[-1].append(part)
    return [s for s in steps if any(p.get("type") in ("text", "reasoning", "tool") for p in s)]


def _tool_result(part: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    state = part.get("state") or {}
    status = state.get("status")
    if status == "completed":
        meta = {"compacted": True} if (state.get("time") or {}).get("compacted") else {}
        return str(state.get("output") or ""), meta
    if status == "error":
        return str(state.get("error") or ""), {"is_error": True}
    return INTERRUPTED, {"is_error": True, "status": status}


def _assistant(info: dict[str, Any], parts: list[dict[str, Any]], ts: str | None) -> list[Message]:
    out: list[Message] = []
    for n, step in enumerate(_steps(parts)):
        texts = [p.get("text") or "" for p in step if p.get("type") == "text"]
        reasoning = [p.get("text") or "" for p in step if p.get("type") == "reasoning"]
        tools = [p for p in step if p.get("type") == "tool"]
        meta: dict[str, Any] = {"message_id": info.get("id"), "step": n}
        if info.get("summary"):
            meta["summary"] = True
        finish = next((p for p in step if p.get("type") == "step-finish"), None)
        if finish is not None:
            meta["tokens"] = finish.get("tokens")
        out.append(Message(
            role="assistant", content=join_texts(texts), reasoning=join_texts(reasoning), model=_model(info),
            timestamp=ts, meta=meta,
            tool_calls=[ToolCall(name=p.get("tool") or "", arguments=(p.get("state") or {}).get("input") or {},
                                        id=p.get("callID") or "") for p in tools]))
        for p in tools:
            text, rmeta = _tool_result(p)
            out.append(Message(role="tool", content=text, tool_call_id=p.get("callID") or "",
                                      name=p.get("tool"), timestamp=ts, meta=rmeta))
    return out


def load(path: Path) -> list[Session]:
    doc = load_document(path)
    if not _is_export(doc):
        raise ValueError(f"{path}: not an opencode export (no info and messages[] with info and parts)")
    info = doc["info"]
    session = Session(id=str(info.get("id") or path.stem), format=NAME, source=str(path))
    session.meta = {k: info[k] for k in ("title", "directory", "version", "parentID") if k in info}
    unknown_roles = 0
    for entry in doc["messages"]:
        minfo, parts = entry["info"], [p for p in entry["parts"] if isinstance(p, dict)]
        ts = iso_time((minfo.get("time") or {}).get("created"))
        role = minfo.get("role")
        if role == "user":
            if minfo.get("tools"):
                session.meta["tools_enabled"] = minfo["tools"]
            start = len(session.messages)
            session.messages.append(_user(minfo, parts, ts))
            if "compaction_request" in session.messages[start].meta:
                # opencode's later contexts start at the compaction request (filterCompacted)
                session.messages[start].meta["compaction"] = {"first_kept": None, "request": True}
        elif role == "assistant":
            if minfo.get("error") and not any(p.get("type") in ("text", "tool") for p in parts):
                session.warnings.append(f"skipped assistant message {minfo.get('id')} that failed with "
                                        f"{(minfo['error'] or {}).get('name', 'an error')}")
                continue
            session.messages.extend(_assistant(minfo, parts, ts))
        else:
            unknown_roles += 1
    if unknown_roles:
        session.warnings.append(f"skipped {unknown_roles} messages of unknown role")
    return [session]


register(Format(NAME, "opencode session export JSON (`opencode export <id>`)", detect, load))
