"""Codex CLI rollout files (~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<id>.jsonl).

Each line is a `RolloutLine` (codex-rs/protocol/src/protocol.rs): `{"timestamp", "type",
"payload"}` with type `session_meta`, `response_item` (a Responses API item,
codex-rs/protocol/src/models.rs `ResponseItem`), `turn_context` (the model for the next
turn), `compacted`, `event_msg` (UI events that mirror the items). Early rollouts (2025)
wrote a bare meta object first and bare `ResponseItem`s after it; both are read.

The items of one model response (reasoning, assistant message, function / custom /
local-shell calls) become one assistant message; a response ends at the next input item
(user or developer message, tool output) or at a `token_count` event, which Codex writes
after every response. Reasoning text comes from the item's `content` where present, else
its `summary`; encrypted-only reasoning is counted in meta. `event_msg` lines otherwise
duplicate the items and are not read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from jumpahead.core.turn import Message, ToolCall

from ..formats import Format, register
from ..session import Session
from ._common import compaction_message, content_text, first_dicts, join_texts, parse_arguments, read_jsonl

NAME = "codex"
_LINE_TYPES = {"session_meta", "response_item", "turn_context", "event_msg", "compacted"}
_OUTPUT_ITEMS = {"reasoning", "function_call", "custom_tool_call", "local_shell_call", "web_search_call"}
_RESULT_ITEMS = {"function_call_output", "custom_tool_call_output"}
_BARE_ITEMS = _OUTPUT_ITEMS | _RESULT_ITEMS | {"message"}


def detect(path: Path, head: bytes) -> bool:
    rows = first_dicts(path, head, 12)
    if any(r.get("type") in _LINE_TYPES and isinstance(r.get("payload"), dict) for r in rows):
        return True
    # the early bare layout: a meta object, then bare response items; only under Codex's file name
    return (path.name.startswith("rollout-") and len(rows) > 1 and "id" in rows[0] and "timestamp" in rows[0]
            and any(r.get("type") in _BARE_ITEMS for r in rows[1:]))


def _normalise(rows: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], str | None]]:
    """(line type, payload, timestamp) for both layouts."""
    out = []
    for i, row in enumerate(rows):
        if row.get("type") in _LINE_TYPES and isinstance(row.get("payload"), dict):
            out.append((row["type"], row["payload"], row.get("timestamp")))
        elif "record_type" in row:
            continue  # early layout's state snapshots
        elif i == 0 and "id" in row and "timestamp" in row and row.get("type") not in _BARE_ITEMS:
            out.append(("session_meta", row, row.get("timestamp")))
        elif isinstance(row.get("type"), str):
            out.append(("response_item", row, None))
    return out


def _output_text(output: Any) -> str:
    """A tool output: a string, content items, or the early `{content, success}` object."""
    if isinstance(output, str):
        return output
    if isinstance(output, dict):
        return content_text(output.get("content"), "\n")
    if isinstance(output, list):
        return content_text(output, "\n")
    return "" if output is None else orjson.dumps(output).decode()


def _reasoning_text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, list):
        texts = [c.get("text") or "" for c in content if isinstance(c, dict)]
        if any(t.strip() for t in texts):
            return join_texts(texts)
    summary = item.get("summary")
    if isinstance(summary, list):
        return join_texts([s.get("text") or "" for s in summary if isinstance(s, dict)])
    return ""


def _call(item: dict[str, Any]) -> ToolCall | None:
    kind = item.get("type")
    cid = item.get("call_id") or item.get("id") or ""
    if kind == "function_call":
        return ToolCall(name=item.get("name") or "", arguments=parse_arguments(item.get("arguments")), id=cid)
    if kind == "custom_tool_call":  # freeform tools (apply_patch): the input is raw text
        return ToolCall(name=item.get("name") or "", arguments=item.get("input") or "", id=cid)
    if kind == "local_shell_call":
        return ToolCall(name="local_shell", arguments=item.get("action") or {}, id=cid)
    if kind == "web_search_call":  # runs on OpenAI's side: no output item follows
        return ToolCall(name="web_search", arguments=item.get("action") or {}, id=cid)
    return None


def load(path: Path) -> list[Session]:
    warnings: list[str] = []
    lines = _normalise(read_jsonl(path, warnings))
    session = Session(id=path.stem, format=NAME, source=str(path), warnings=warnings)
    model: str | None = None
    current: Message | None = None  # the assistant message of the response being read
    names: dict[str, str] = {}
    unknown: dict[str, int] = {}

    def assistant(ts: str | None) -> Message:
        nonlocal current
        if current is None:
            current = Message(role="assistant", model=model, timestamp=ts, meta={"_texts": [], "_reasoning": []})
            session.messages.append(current)
        return current

    def close() -> None:
        nonlocal current
        current = None

    for kind, payload, ts in lines:
        if kind == "session_meta":
            session.id = str(payload.get("id") or session.id)
            session.meta.update({k: payload[k] for k in ("cwd", "cli_version", "originator", "source", "model_provider",
                                                         "timestamp", "git") if k in payload})
            instructions = payload.get("base_instructions") or payload.get("instructions")
            if isinstance(instructions, dict):
                instructions = instructions.get("text")
            if isinstance(instructions, str) and instructions.strip():
                session.messages.append(Message(role="system", content=instructions, timestamp=ts,
                                                       meta={"kind": "instructions"}))
        elif kind == "turn_context":
            model = payload.get("model") or model
        elif kind == "compacted":
            close()
            session.messages.append(compaction_message(payload.get("message") or "", None, timestamp=ts,
                                                       replacement_items=len(payload.get("replacement_history") or [])
                                                       or None))
        elif kind == "event_msg":
            if payload.get("type") == "token_count":
                close()
        elif kind == "response_item":
            itype = payload.get("type")
            if itype == "message" and payload.get("role") == "assistant":
                assistant(ts).meta["_texts"].append(content_text(payload.get("content")))
            elif itype == "message":
                close()
                role = payload.get("role")
                session.messages.append(Message(
                    role="user" if role == "user" else "system", content=content_text(payload.get("content")),
                    timestamp=ts, meta={} if role in ("user", "system") else {"original_role": role}))
            elif itype == "reasoning":
                msg = assistant(ts)
                text = _reasoning_text(payload)
                if text:
                    msg.meta["_reasoning"].append(text)
                elif payload.get("encrypted_content"):
                    msg.meta["encrypted_reasoning"] = msg.meta.get("encrypted_reasoning", 0) + 1
            elif itype in _OUTPUT_ITEMS:
                call = _call(payload)
                if call is not None:
                    assistant(ts).tool_calls.append(call)
                    names[call.id] = call.name
            elif itype in _RESULT_ITEMS:
                close()
                cid = payload.get("call_id") or ""
                session.messages.append(Message(role="tool", content=_output_text(payload.get("output")),
                                                       tool_call_id=cid, name=names.get(cid), timestamp=ts))
            elif itype in ("ghost_snapshot", "compaction", "compaction_summary", "other"):
                continue  # harness state / encrypted server-side compaction: nothing readable for the model
            else:
                unknown[str(itype)] = unknown.get(str(itype), 0) + 1
    for m in session.messages:
        if m.role == "assistant":
            m.content = join_texts(m.meta.pop("_texts", []))
            m.reasoning = join_texts(m.meta.pop("_reasoning", []))
    for itype, n in sorted(unknown.items()):
        warnings.append(f"skipped {n} response items of unknown type {itype!r}")
    return [session]


register(Format(NAME, "Codex CLI rollout JSONL (~/.codex/sessions/.../rollout-*.jsonl)", detect, load))
