"""pi coding agent sessions (badlogic/pi-mono, packages/coding-agent).

One JSONL file per session, first line a `session` header. Version 1 (no `version`
field) is a linear list of entries; versions 2 and 3 link entries by `id` / `parentId`
into a tree, and the active branch is the path from the last entry (the leaf) to the
root (session-manager.ts `buildSessionContext`). Version 1 is read as the chain of its
lines, exactly as pi's own migration does (`migrateV1ToV2`; a compaction's
`firstKeptEntryIndex` counts file lines, header included).

What the Session holds: every message on the active branch, once, in order, so each
assistant message is one model call. A `compaction` entry becomes a user message with
pi's own summary wording at the point it happened, with meta["compaction"]["first_kept"]
naming the first earlier message pi kept; Session.turn() rebuilds the context pi sent
after it (summary, kept messages, later messages). Entries off the active branch are
counted in a warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jumpahead.core.turn import Message, ToolCall

from ..formats import Format, register
from ..session import Session
from ._common import compaction_message, content_text, count_images, first_dicts, join_texts, read_jsonl

NAME = "pi"

# messages.ts: how pi renders its own synthetic messages for the model
COMPACTION_PREFIX = "The conversation history before this point was compacted into the following summary:\n\n<summary>\n"
COMPACTION_SUFFIX = "\n</summary>"
BRANCH_PREFIX = "The following is a summary of a branch that this conversation came back from:\n\n<summary>\n"
BRANCH_SUFFIX = "</summary>"

# entry types that carry no message for the model
_SILENT = {"model_change", "thinking_level_change", "label", "session_info", "custom"}
_ENTRY_TYPES = _SILENT | {"message", "compaction", "branch_summary", "custom_message"}


def detect(path: Path, head: bytes) -> bool:
    rows = first_dicts(path, head, 8)
    if not rows or rows[0].get("type") != "session" or "id" not in rows[0]:
        return False
    # Claude Code and Codex never write a `session` line; require pi's entry shapes after it
    return all(r.get("type") in _ENTRY_TYPES for r in rows[1:]) and ("cwd" in rows[0] or "version" in rows[0])


def _bash_text(msg: dict[str, Any]) -> str:
    """messages.ts bashExecutionToText: a `!command` the user ran, as the model sees it."""
    text = f"Ran `{msg.get('command', '')}`\n"
    output = msg.get("output")
    text += f"```\n{output}\n```" if output else "(no output)"
    exit_code = msg.get("exitCode")
    if msg.get("cancelled"):
        text += "\n\n(command cancelled)"
    elif exit_code not in (None, 0):
        text += f"\n\nCommand exited with code {exit_code}"
    if msg.get("truncated") and msg.get("fullOutputPath"):
        text += f"\n\n[Output truncated. Full output: {msg['fullOutputPath']}]"
    return text


def _assistant(msg: dict[str, Any], timestamp: str | None) -> Message:
    texts, thinking, calls = [], [], []
    redacted = 0
    for block in msg.get("content") or []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            texts.append(block.get("text") or "")
        elif kind == "thinking":
            if block.get("redacted"):
                redacted += 1
            thinking.append(block.get("thinking") or "")
        elif kind == "toolCall":
            calls.append(ToolCall(name=block.get("name") or "", arguments=block.get("arguments") or {},
                                         id=block.get("id") or ""))
    meta: dict[str, Any] = {k: msg[k] for k in ("provider", "api", "stopReason", "errorMessage", "usage") if k in msg}
    if redacted:
        meta["redacted_thinking"] = redacted
    return Message(role="assistant", content=join_texts(texts), reasoning=join_texts(thinking),
                          tool_calls=calls, model=msg.get("model"), timestamp=timestamp, meta=meta)


def _message(msg: dict[str, Any], timestamp: str | None, warnings: list[str]) -> Message | None:
    role = msg.get("role")
    if role == "assistant":
        return _assistant(msg, timestamp)
    if role == "user":
        images = count_images(msg.get("content"))
        meta = {"images": images} if images else {}
        return Message(role="user", content=content_text(msg.get("content")), timestamp=timestamp, meta=meta)
    if role == "toolResult":
        return Message(role="tool", content=content_text(msg.get("content"), "\n"),
                              tool_call_id=msg.get("toolCallId"), name=msg.get("toolName"), timestamp=timestamp,
                              meta={"is_error": True} if msg.get("isError") else {})
    if role == "bashExecution":
        if msg.get("excludeFromContext"):
            return None  # `!!command`: shown to the user, never sent to the model
        return Message(role="user", content=_bash_text(msg), timestamp=timestamp, meta={"kind": "bashExecution"})
    if role in ("custom", "hookMessage"):
        return Message(role="user", content=content_text(msg.get("content")), timestamp=timestamp,
                              meta={"kind": "custom", "custom_type": msg.get("customType")})
    if role == "branchSummary":
        return Message(role="user", content=BRANCH_PREFIX + (msg.get("summary") or "") + BRANCH_SUFFIX,
                              timestamp=timestamp, meta={"kind": "branch_summary"})
    warnings.append(f"skipped a message with unknown role {role!r}")
    return None


def _active_branch(entries: list[dict[str, Any]], version: int) -> list[dict[str, Any]]:
    """The entries from the root to the leaf (the last entry), as pi builds its context."""
    if version < 2:
        return entries
    by_id = {e["id"]: e for e in entries if isinstance(e.get("id"), str)}
    if not entries:
        return []
    path, seen = [], set()
    current: dict[str, Any] | None = entries[-1]
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        path.append(current)
        parent = current.get("parentId")
        current = by_id.get(parent) if parent else None
    path.reverse()
    return path


def load(path: Path) -> list[Session]:
    warnings: list[str] = []
    rows = read_jsonl(path, warnings)
    header = rows[0] if rows and rows[0].get("type") == "session" else {}
    version = int(header.get("version") or 1)
    entries = rows[1:] if header else rows
    # v1: compaction points at a file line; remember each entry's line (header is line 0)
    line_of = {id(e): i + (1 if header else 0) for i, e in enumerate(entries)}
    branch = _active_branch(entries, version)
    if len(branch) < len(entries):
        warnings.append(f"skipped {len(entries) - len(branch)} entries off the active branch")

    session = Session(id=str(header.get("id") or path.stem), format=NAME, source=str(path), warnings=warnings)
    session.meta = {k: header[k] for k in ("cwd", "timestamp", "provider", "modelId", "parentSession", "branchedFrom")
                    if k in header}
    session.meta["pi_version"] = version
    first_message_of: dict[int, int] = {}  # id(entry) -> index of the first message at or after it
    pending: list[int] = []
    unknown: dict[str, int] = {}
    compactions: list[tuple[dict[str, Any], int]] = []

    for entry in branch:
        pending.append(id(entry))
        kind = entry.get("type")
        ts = entry.get("timestamp")
        msg: Message | None = None
        if kind == "message" and isinstance(entry.get("message"), dict):
            msg = _message(entry["message"], ts, warnings)
        elif kind == "custom_message":
            msg = Message(role="user", content=content_text(entry.get("content")), timestamp=ts,
                                 meta={"kind": "custom", "custom_type": entry.get("customType")})
        elif kind == "branch_summary" and entry.get("summary"):
            msg = Message(role="user", content=BRANCH_PREFIX + entry["summary"] + BRANCH_SUFFIX, timestamp=ts,
                                 meta={"kind": "branch_summary"})
        elif kind == "compaction":
            msg = compaction_message(COMPACTION_PREFIX + (entry.get("summary") or "") + COMPACTION_SUFFIX, None,
                                     timestamp=ts, tokens_before=entry.get("tokensBefore"))
            compactions.append((entry, len(session.messages)))
        elif kind == "session_info" and entry.get("name"):
            session.meta["name"] = entry["name"]
        elif kind not in _SILENT:
            unknown[str(kind)] = unknown.get(str(kind), 0) + 1
        if msg is not None:
            for key in pending:
                first_message_of[key] = len(session.messages)
            pending = []
            session.messages.append(msg)

    # resolve each compaction's first kept entry to a message index
    by_line = {line_of[id(e)]: e for e in entries}
    by_id = {e.get("id"): e for e in entries if e.get("id")}
    for entry, at in compactions:
        target = by_id.get(entry["firstKeptEntryId"]) if entry.get("firstKeptEntryId") else None
        if target is None and isinstance(entry.get("firstKeptEntryIndex"), int):
            target = by_line.get(entry["firstKeptEntryIndex"])
        kept = first_message_of.get(id(target)) if target is not None else None
        session.messages[at].meta["compaction"]["first_kept"] = kept if kept is not None and kept < at else None
    for kind, n in sorted(unknown.items()):
        warnings.append(f"skipped {n} entries of unknown type {kind!r}")
    return [session]


register(Format(NAME, "pi coding agent session JSONL (linear v1 and tree v2/v3)", detect, load))
