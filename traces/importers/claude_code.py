"""Claude Code session JSONL (~/.claude/projects/<project>/<session-id>.jsonl).

Each line is an entry: `user` / `assistant` (an Anthropic message in `message`),
`system` (compact_boundary, hook and timing notes), `summary` (a title), `progress`,
`file-history-snapshot`, `queue-operation`. Claude Code writes one line per content
block while it streams, so one assistant message (one model call) spans several lines
sharing `message.id`; they are merged into one message here, also where tool results
were written between them. A user line's `tool_result` blocks become tool messages (in
block order) and its text blocks a user message after them, as the API saw them.

A `compact_boundary` followed by the user entry with `isCompactSummary` is a compaction:
the summary becomes a user message with meta["compaction"] (nothing earlier kept), so
Session.turn() starts later contexts at the summary, as Claude Code does.

Subagents: entries with `isSidechain` and the messages of `agent_progress` entries
belong to other conversations; each subagent becomes its own Session after the main one
(id "<session>/agent-<agentId>").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jumpahead.core.turn import Message, ToolCall

from ..formats import Format, register
from ..session import Session
from ._common import compaction_message, content_text, count_images, first_dicts, join_texts, read_jsonl

NAME = "claude-code"
_SILENT = {"progress", "file-history-snapshot", "queue-operation", "summary", "system", "attachment"}


def detect(path: Path, head: bytes) -> bool:
    for row in first_dicts(path, head):
        kind = row.get("type")
        if kind in ("user", "assistant", "system", "progress") and "sessionId" in row and "uuid" in row:
            return True
        if (kind == "summary" and "leafUuid" in row) or (kind == "file-history-snapshot" and "snapshot" in row):
            return True
    return False


class _Builder:
    """Turns one conversation's entries into a Session (main or subagent)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.by_message_id: dict[str, Message] = {}
        self.call_names: dict[str, str] = {}
        self.compact_pending: dict[str, Any] | None = None
        self.seen: set[str] = set()

    def add(self, entry: dict[str, Any]) -> None:
        kind = entry.get("type")
        msg = entry.get("message")
        if not isinstance(msg, dict):
            return
        uuid = entry.get("uuid")
        if isinstance(uuid, str):
            if uuid in self.seen:  # progress events may repeat a subagent's entry
                return
            self.seen.add(uuid)
        if kind == "assistant":
            self._assistant(entry, msg)
        elif kind == "user":
            self._user(entry, msg)

    def _assistant(self, entry: dict[str, Any], msg: dict[str, Any]) -> None:
        mid = msg.get("id") or entry.get("uuid") or ""
        target = self.by_message_id.get(mid) if mid else None
        if target is None:
            model = msg.get("model")
            target = Message(role="assistant", model=None if model == "<synthetic>" else model,
                                    timestamp=entry.get("timestamp"),
                                    meta={"message_id": mid, **({"synthetic": True} if model == "<synthetic>" else {})})
            target.meta["_texts"], target.meta["_thinking"] = [], []
            if mid:
                self.by_message_id[mid] = target
            self.session.messages.append(target)
        content = msg.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        for block in blocks:
            if not isinstance(block, dict):
                continue
            btype = block.get("type")
            if btype == "text":
                target.meta["_texts"].append(block.get("text") or "")
            elif btype == "thinking":
                target.meta["_thinking"].append(block.get("thinking") or "")
            elif btype == "redacted_thinking":
                target.meta["redacted_thinking"] = target.meta.get("redacted_thinking", 0) + 1
            elif btype in ("tool_use", "server_tool_use"):
                call = ToolCall(name=block.get("name") or "", arguments=block.get("input") or {},
                                       id=block.get("id") or "")
                target.tool_calls.append(call)
                self.call_names[call.id] = call.name
        usage = msg.get("usage")
        if usage:
            target.meta["usage"] = usage  # every streamed line repeats it; the last one is final
        if msg.get("stop_reason"):
            target.meta["stop_reason"] = msg["stop_reason"]

    def _user(self, entry: dict[str, Any], msg: dict[str, Any]) -> None:
        ts = entry.get("timestamp")
        content = msg.get("content")
        if entry.get("isCompactSummary"):
            info = self.compact_pending or {}
            self.session.messages.append(compaction_message(content_text(content), None, timestamp=ts,
                                                            tokens_before=info.get("preTokens"),
                                                            trigger=info.get("trigger")))
            self.compact_pending = None
            return
        meta: dict[str, Any] = {}
        if entry.get("isMeta"):
            meta["is_meta"] = True
        if isinstance(content, list):
            texts = []
            for block in content:
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "tool_result":
                    cid = block.get("tool_use_id") or ""
                    rmeta = {"is_error": True} if block.get("is_error") else {}
                    self.session.messages.append(Message(
                        role="tool", content=content_text(block.get("content"), "\n"), tool_call_id=cid,
                        name=self.call_names.get(cid), timestamp=ts, meta=rmeta))
                elif block.get("type") == "text":
                    texts.append(block.get("text") or "")
            images = count_images(content)
            if images:
                meta["images"] = images
            if texts or images:
                self.session.messages.append(Message(role="user", content=join_texts(texts), timestamp=ts,
                                                            meta=meta))
            return
        self.session.messages.append(Message(role="user", content=content_text(content), timestamp=ts, meta=meta))

    def finish(self) -> Session:
        for m in self.session.messages:
            if m.role == "assistant" and "_texts" in m.meta:
                m.content = join_texts(m.meta.pop("_texts"))
                m.reasoning = join_texts(m.meta.pop("_thinking"))
        return self.session


def load(path: Path) -> list[Session]:
    warnings: list[str] = []
    rows = read_jsonl(path, warnings)
    sid = next((r["sessionId"] for r in rows if isinstance(r.get("sessionId"), str)), path.stem)
    main = _Builder(Session(id=sid, format=NAME, source=str(path), warnings=warnings))
    subagents: dict[str, _Builder] = {}
    ignored: dict[str, int] = {}
    unknown: dict[str, int] = {}
    titles: list[str] = []

    def sub(agent: str) -> _Builder:
        if agent not in subagents:
            subagents[agent] = _Builder(Session(id=f"{sid}/agent-{agent}", format=NAME, source=str(path),
                                                meta={"subagent": agent, "parent_session": sid}))
        return subagents[agent]

    for row in rows:
        kind = row.get("type")
        if kind in ("user", "assistant"):
            if row.get("isSidechain"):
                sub(str(row.get("agentId") or "sidechain")).add(row)
            else:
                main.add(row)
        elif kind == "system" and row.get("subtype") == "compact_boundary":
            main.compact_pending = row.get("compactMetadata") or {}
        elif kind == "progress" and isinstance(row.get("data"), dict) and row["data"].get("type") == "agent_progress":
            data = row["data"]
            if isinstance(data.get("message"), dict):
                b = sub(str(data.get("agentId") or row.get("parentToolUseID") or "agent"))
                b.session.meta.setdefault("parent_tool_use_id", row.get("parentToolUseID"))
                b.add(data["message"])
        elif kind == "summary":
            if row.get("summary"):
                titles.append(row["summary"])
        elif kind in _SILENT:
            key = f"{kind}:{row.get('subtype') or (row.get('data') or {}).get('type') or ''}".rstrip(":")
            ignored[key] = ignored.get(key, 0) + 1
        else:
            unknown[str(kind)] = unknown.get(str(kind), 0) + 1

    session = main.finish()
    first = next((r for r in rows if r.get("type") in ("user", "assistant") and not r.get("isSidechain")), {})
    session.meta.update({k: first[k] for k in ("cwd", "version", "gitBranch") if k in first})
    if titles:
        session.meta["titles"] = titles
    session.meta["ignored_entries"] = ignored  # hooks, bash progress, snapshots: no model context
    for kind, n in sorted(unknown.items()):
        warnings.append(f"skipped {n} entries of unknown type {kind!r}")
    if subagents:
        session.meta["subagents"] = [b.session.id for b in subagents.values()]
    return [session] + [b.finish() for b in subagents.values()]


register(Format(NAME, "Claude Code session JSONL (~/.claude/projects)", detect, load))
