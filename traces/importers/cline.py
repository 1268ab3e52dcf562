"""Cline task histories (`tasks/<task id>/api_conversation_history.json`; Roo Code, a
fork, writes the same file).

The file is the Anthropic-style message list Cline sends: `user` / `assistant` messages
whose content is a string or typed blocks. The first user message holds the task in
`<task>` tags and every user message ends with `<environment_details>`. Tool use comes in
two shapes, both read here:

- XML in the assistant's text (Cline's system prompt asks for it; every version until
  native tool calling): `<read_file><path>a.py</path></read_file>`. The tags are parsed
  as Cline's own parser does (src/core/assistant-message/parse-assistant-message.ts):
  a known tool's opening tag starts a call, known parameter tags inside it are its
  arguments, and inside a parameter only that parameter's closing tag counts;
  write_to_file's content runs to its last `</content>`. A call left open at the end of
  the text was still run by Cline, so it counts (meta["partial_call"]). The visible text
  is what lies outside the calls. Results come back as text blocks in the next user
  message: a header `[read_file for 'a.py'] Result:` followed by the output in the same
  block (newer versions) or in the blocks after it (older ones), or a note that the call
  was not run (`Tool [x] was not executed because ...`, `Skipping tool [x] ...`).
- Native tool calling (newer versions): `tool_use` blocks in the assistant message and
  `tool_result` blocks (with `tool_use_id`) in the next user message. Some versions wrote
  native calls with the XML era's text results; those are matched like XML calls.

XML calls have no id: one is made ("cline-<message>-<call>") so results can name them.
A result is matched to the previous assistant message's first unanswered call of the
same name (else its first unanswered call). Assistant messages carry `thinking` blocks
as reasoning and `modelInfo.modelId` as the model.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from jumpahead.core.turn import Message, ToolCall

from ..formats import Format, register
from ..session import Session
from ._common import (content_text, count_images, iso_time, join_texts, json_document, load_document,
                      looks_like_document)

NAME = "cline"

# every tool name and parameter name Cline's parser has known (src/shared/tools.ts and
# src/core/assistant-message/index.ts across versions)
TOOLS = frozenset({
    "execute_command", "read_file", "write_to_file", "replace_in_file", "search_files", "list_files",
    "list_code_definition_names", "browser_action", "use_mcp_tool", "access_mcp_resource", "ask_followup_question",
    "plan_mode_respond", "act_mode_respond", "load_mcp_documentation", "attempt_completion", "new_task", "condense",
    "summarize_task", "report_bug", "new_rule", "web_fetch", "web_search", "focus_chain", "apply_patch",
    "generate_explanation", "use_skill", "use_subagents", "inspect_site",
})
PARAMS = frozenset({
    "command", "requires_approval", "path", "absolutePath", "content", "diff", "regex", "file_pattern", "recursive",
    "action", "url", "coordinate", "text", "query", "allowed_domains", "blocked_domains", "prompt", "server_name",
    "tool_name", "arguments", "uri", "question", "options", "response", "result", "context", "title",
    "what_happened", "steps_to_reproduce", "api_request_output", "additional_context", "needs_more_exploration",
    "task_progress", "timeout", "input", "from_ref", "to_ref", "skill_name", "prompt_1", "prompt_2", "prompt_3",
    "prompt_4", "prompt_5", "start_line", "end_line", "size",
})
_LAST_CLOSE = {"write_to_file", "new_rule"}  # whose `content` runs to its last closing tag
_TOOL_OPEN = re.compile("<(" + "|".join(sorted(TOOLS, key=len, reverse=True)) + ")>")
_PARAM_OPEN = re.compile("<(" + "|".join(sorted(PARAMS, key=len, reverse=True)) + ")>")
# "[read_file for 'a.py'] Result:" (the description may span lines: commands do)
_RESULT = re.compile(r"\[([\w.-]+)(?: for .*?)?\] Result:", re.S)
_NOT_RUN = re.compile(r"(?:Tool|Skipping tool) \[([\w.-]+)(?: for .*?)?\] (?:was not executed|was interrupted|due to)",
                      re.S)


def parse_xml_calls(text: str) -> tuple[str, list[tuple[str, dict[str, str]]], bool]:
    """(visible text, [(tool, params)], whether the last call was left open) of an
    assistant text written with Cline's XML tool tags."""
    visible: list[str] = []
    calls: list[tuple[str, dict[str, str]]] = []
    pos = 0
    while True:
        m = _TOOL_OPEN.search(text, pos)
        if m is None:
            visible.append(text[pos:])
            return join_texts([v.strip() for v in visible]), calls, False
        visible.append(text[pos:m.start()])
        name = m.group(1)
        params, end = _scan_params(text, m.end(), name)
        calls.append((name, params))
        if end is None:
            return join_texts([v.strip() for v in visible]), calls, True
        pos = end


def _scan_params(text: str, start: int, tool: str) -> tuple[dict[str, str], int | None]:
    """The parameters of the call whose opening tag ends at `start`, and the index after
    its closing tag (None: the text ends inside the call)."""
    params: dict[str, str] = {}
    close = f"</{tool}>"
    i = start
    while True:
        p = _PARAM_OPEN.search(text, i)
        c = text.find(close, i)
        if c != -1 and (p is None or c < p.start()):
            if tool in _LAST_CLOSE and "content" in params:  # a file that itself holds "</content>"
                body = text[start:c]
                first, last = body.find("<content>"), body.rfind("</content>")
                if first != -1 and last > first:
                    params["content"] = body[first + len("<content>"):last].strip()
            return params, c + len(close)
        if p is None:
            return params, None
        pname = p.group(1)
        pend = text.find(f"</{pname}>", p.end())
        if pend == -1:  # the text stops inside a parameter: Cline keeps what it has
            params[pname] = text[p.end():].strip()
            return params, None
        params[pname] = text[p.end():pend].strip()
        i = pend + len(pname) + 3


def _is_message_list(doc: Any) -> bool:
    return (isinstance(doc, list) and bool(doc)
            and all(isinstance(m, dict) and m.get("role") in ("user", "assistant") and "content" in m
                    for m in doc[:10]))


def _texts(msg: dict[str, Any]) -> list[str]:
    content = msg.get("content")
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)]


def _is_cline(doc: Any) -> bool:
    """Cline's own marks: the task in <task> tags, <environment_details>, modelInfo, or
    its tool results; a plain Anthropic message list is left to the generic reader."""
    if not _is_message_list(doc):
        return False
    for m in doc[:6]:
        if m.get("role") == "assistant" and isinstance(m.get("modelInfo"), dict):
            return True
        if m.get("role") == "user":
            for t in _texts(m):
                if "<task>" in t or "<environment_details>" in t or _RESULT.match(t):
                    return True
    return False


def detect(path: Path, head: bytes) -> bool:
    return looks_like_document(head) and head.lstrip()[:1] == b"[" and _is_cline(json_document(path))


class _Reader:
    """Walks the message list once, keeping the calls the next user message answers."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.pending: list[ToolCall] = []
        self.unanswered = 0

    def assistant(self, n: int, msg: dict[str, Any]) -> None:
        self.unanswered += len(self.pending)
        content = msg.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        blocks = [b for b in blocks if isinstance(b, dict)]
        native = any(b.get("type") == "tool_use" for b in blocks)
        texts, thinking, calls = [], [], []
        meta: dict[str, Any] = {"tool_format": "native" if native else "xml"}
        for b in blocks:
            kind = b.get("type")
            if kind == "text" and isinstance(b.get("text"), str):
                if native:
                    texts.append(b["text"])
                    continue
                visible, found, partial = parse_xml_calls(b["text"])
                texts.append(visible)
                calls += [ToolCall(name=name, arguments=params, id=f"cline-{n}-{len(calls) + j}")
                          for j, (name, params) in enumerate(found)]
                if partial:
                    meta["partial_call"] = True
            elif kind == "thinking":
                thinking.append(b.get("thinking") or "")
            elif kind == "redacted_thinking":
                meta["redacted_thinking"] = meta.get("redacted_thinking", 0) + 1
            elif kind == "tool_use":
                calls.append(ToolCall(name=b.get("name") or "", arguments=b.get("input") or {},
                                             id=b.get("id") or f"cline-{n}-{len(calls)}"))
        info = msg.get("modelInfo") if isinstance(msg.get("modelInfo"), dict) else {}
        if info.get("mode"):
            meta["mode"] = info["mode"]
        if isinstance(msg.get("metrics"), dict):
            meta["metrics"] = msg["metrics"]
        self.session.messages.append(Message(role="assistant", content=join_texts(texts),
                                                    reasoning=join_texts(thinking), tool_calls=calls,
                                                    model=info.get("modelId"), timestamp=iso_time(msg.get("ts")),
                                                    meta=meta))
        self.pending = list(calls)

    def _take(self, name: str | None = None, call_id: str | None = None) -> ToolCall | None:
        for c in self.pending:
            if (call_id is not None and c.id == call_id) or (call_id is None and c.name == name):
                self.pending.remove(c)
                return c
        if call_id is None and self.pending:
            return self.pending.pop(0)
        return None

    def _result(self, call: ToolCall, text: str, ts: str | None, **meta: Any) -> Message:
        msg = Message(role="tool", content=text, tool_call_id=call.id, name=call.name, timestamp=ts,
                             meta={k: v for k, v in meta.items() if v})
        self.session.messages.append(msg)
        return msg

    def user(self, msg: dict[str, Any]) -> None:
        content = msg.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        ts = iso_time(msg.get("ts"))
        texts: list[str] = []
        images = 0
        open_result: Message | None = None  # an older header block: the output follows in later blocks
        for b in blocks:
            if not isinstance(b, dict):
                continue
            kind = b.get("type")
            text = b.get("text") if kind == "text" and isinstance(b.get("text"), str) else None
            if kind == "tool_result":
                open_result = None
                call = self._take(call_id=str(b.get("tool_use_id") or ""))
                body = content_text(b.get("content"), "\n")
                if call is not None:
                    self._result(call, body, ts, is_error=bool(b.get("is_error")), images=count_images(b.get("content")))
                else:
                    texts.append(body)
                    self.session.warnings.append(f"a tool_result for {b.get('tool_use_id')!r} answers no call")
                continue
            marker = (_RESULT.match(text) or _NOT_RUN.match(text)) if text is not None else None
            if marker is not None:
                call = self._take(marker.group(1))
                if call is not None:  # the header stays: the model read it as part of the result
                    result = self._result(call, text, ts, not_run=marker.re is _NOT_RUN)
                    open_result = result if marker.re is _RESULT and not text[marker.end():].strip() else None
                    continue
            if open_result is not None and (text is None or not text.lstrip().startswith("<environment_details>")):
                if text is not None:
                    open_result.content = join_texts([open_result.content, text])
                elif kind == "image":
                    open_result.meta["images"] = open_result.meta.get("images", 0) + 1
                continue
            open_result = None
            if text is not None:
                texts.append(text)
            elif kind == "image":
                images += 1
        if texts or images:
            self.session.messages.append(Message(role="user", content=join_texts(texts), timestamp=ts,
                                                        meta={"images": images} if images else {}))


def load(path: Path) -> list[Session]:
    doc = load_document(path)
    if not _is_message_list(doc):
        raise ValueError(f"{path}: not a Cline api_conversation_history.json (a list of user / assistant messages)")
    # the task folder is named by the task id: tasks/<id>/api_conversation_history.json
    sid = path.parent.name if path.name == "api_conversation_history.json" and path.parent.name else path.stem
    session = Session(id=sid, format=NAME, source=str(path))
    reader = _Reader(session)
    skipped = 0
    for n, m in enumerate(doc):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            skipped += 1
        elif m["role"] == "assistant":
            reader.assistant(n, m)
        else:
            reader.user(m)
    if skipped:
        session.warnings.append(f"skipped {skipped} entries that are not user / assistant messages")
    session.meta["unanswered_calls"] = reader.unanswered + len(reader.pending)
    modes = sorted({m.meta["mode"] for m in session.messages if "mode" in m.meta})
    if modes:
        session.meta["modes"] = modes
    return [session]


register(Format(NAME, "Cline / Roo Code task history (api_conversation_history.json)", detect, load))
