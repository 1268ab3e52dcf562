"""OpenAI chat-completions messages -> SessionMessages (shared by the plain-messages,
mini-swe-agent and SWE-agent importers, whose files hold such messages)."""

from __future__ import annotations

import re
from typing import Any

from jumpahead.core.turn import Message, ToolCall
from ._common import content_text, count_images, parse_arguments

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool",
          "function": "tool"}
# some servers log reasoning inline (Qwen, DeepSeek-R1 distills): <think>...</think> first
_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.S)


def is_message(value: Any) -> bool:
    return isinstance(value, dict) and value.get("role") in _ROLES


def tool_calls(msg: dict[str, Any]) -> list[ToolCall]:
    calls = []
    for call in msg.get("tool_calls") or []:
        if not isinstance(call, dict):
            continue
        fn = call.get("function") if isinstance(call.get("function"), dict) else call
        calls.append(ToolCall(name=fn.get("name") or "", arguments=parse_arguments(fn.get("arguments")),
                              id=call.get("id") or ""))
    legacy = msg.get("function_call")
    if isinstance(legacy, dict) and legacy.get("name"):  # the pre-tools `function_call` field
        calls.append(ToolCall(name=legacy["name"], arguments=parse_arguments(legacy.get("arguments"))))
    return calls


def reasoning_of(msg: dict[str, Any]) -> str:
    for key in ("reasoning_content", "reasoning", "thinking"):
        value = msg.get(key)
        if isinstance(value, str) and value.strip():
            return value
    blocks = msg.get("thinking_blocks")  # litellm's Anthropic thinking blocks
    if isinstance(blocks, list):
        return "\n\n".join(b.get("thinking") or "" for b in blocks if isinstance(b, dict)).strip()
    return ""


def convert(msg: dict[str, Any], *, model: str | None = None, timestamp: str | None = None) -> Message:
    """One OpenAI-style message. Unknown roles must be filtered by the caller (is_message)."""
    role = _ROLES[msg["role"]]
    content = content_text(msg.get("content"))
    meta: dict[str, Any] = {}
    if msg["role"] not in ("system", "user", "assistant", "tool"):
        meta["original_role"] = msg["role"]
    images = count_images(msg.get("content"))
    if images:
        meta["images"] = images
    out = Message(role=role, content=content, timestamp=timestamp, meta=meta)  # type: ignore[arg-type]
    if role == "assistant":
        out.reasoning = reasoning_of(msg)
        if not out.reasoning:
            m = _THINK.match(content)
            if m:
                out.reasoning, out.content = m.group(1).strip(), content[m.end():]
                meta["inline_think"] = True
        out.tool_calls = tool_calls(msg)
        out.model = model
    elif role == "tool":
        out.tool_call_id = msg.get("tool_call_id")
        out.name = msg.get("name")
    elif msg.get("name"):
        out.name = msg["name"]
    return out


def link_tool_names(messages: list[Message]) -> None:
    """Fill a tool result's name from the call it answers, where the file omits it."""
    names = {c.id: c.name for m in messages if m.role == "assistant" for c in m.tool_calls if c.id}
    for m in messages:
        if m.role == "tool" and not m.name and m.tool_call_id:
            m.name = names.get(m.tool_call_id)
