"""SWE-agent trajectories (`*.traj`, SWE-agent/SWE-agent).

One JSON object `{trajectory, history, info, ...}`. `history` is the message list the
model saw (role system / user / assistant / tool, with `agent`, `message_type`,
`is_demo`); `trajectory` repeats each step as {response, thought, action, observation}.
History is read; trajectory only where history is missing.

With function calling (SWE-agent 1.x) assistant entries carry OpenAI `tool_calls` and
observations are `role: tool` with `tool_call_ids`. With the text parsers (thought_action,
SWE-agent 0.x) the model writes its command in a fenced block and SWE-agent runs it in
its shell; such an action is normalised to a call of `bash` with {"command": action}
(id "swe-<n>", meta["synthetic_tool_call"]), the assistant text keeps the thought only
(the full output stays in meta["raw_output"]), and the next user observation becomes
the tool result answering it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from jumpahead.core.turn import Message, ToolCall

from ..formats import Format, register
from ..session import Session
from . import _openai
from ._common import content_text, json_document, load_document, looks_like_document

NAME = "swe-agent"


def _is_traj(doc: Any) -> bool:
    return (isinstance(doc, dict) and isinstance(doc.get("trajectory"), list)
            and (isinstance(doc.get("history"), list) or "info" in doc))


def detect(path: Path, head: bytes) -> bool:
    return looks_like_document(head) and _is_traj(json_document(path))


def _model_name(doc: dict[str, Any]) -> str | None:
    config = doc.get("replay_config")
    if isinstance(config, str):
        try:
            config = orjson.loads(config)
        except orjson.JSONDecodeError:
            return None
    model = ((config or {}).get("agent") or {}).get("model") if isinstance(config, dict) else None
    return model.get("name") if isinstance(model, dict) else None


def _action_call(action: str, n: int) -> ToolCall:
    return ToolCall(name="bash", arguments={"command": action.strip("\n")}, id=f"swe-{n}")


def _from_history(history: list[Any], model: str | None, session: Session) -> None:
    pending: str | None = None  # a synthetic call waiting for its observation
    skipped = 0
    for item in history:
        if not _openai.is_message(item):
            skipped += 1
            continue
        role = item["role"]
        meta = {k: item[k] for k in ("agent", "message_type", "is_demo") if k in item}
        if role == "assistant" and not item.get("tool_calls") and isinstance(item.get("action"), str) \
                and item["action"].strip():
            call = _action_call(item["action"], len(session.messages))
            thought = item.get("thought") if isinstance(item.get("thought"), str) else content_text(item.get("content"))
            session.messages.append(Message(
                role="assistant", content=thought, tool_calls=[call], model=model,
                meta={**meta, "synthetic_tool_call": True, "raw_output": content_text(item.get("content"))}))
            pending = call.id
            continue
        msg = _openai.convert(item, model=model)
        msg.meta.update(meta)
        if role == "tool" and not msg.tool_call_id and item.get("tool_call_ids"):
            msg.tool_call_id = item["tool_call_ids"][0]
        if role == "user" and pending is not None and not item.get("is_demo"):
            msg.role, msg.tool_call_id, msg.name = "tool", pending, "bash"
        pending = None
        session.messages.append(msg)
    if skipped:
        session.warnings.append(f"skipped {skipped} history entries that are not messages")


def _from_trajectory(steps: list[Any], model: str | None, session: Session) -> None:
    for step in steps:
        if not isinstance(step, dict):
            continue
        action = step.get("action") if isinstance(step.get("action"), str) else ""
        calls = [_action_call(action, len(session.messages))] if action.strip() else []
        session.messages.append(Message(role="assistant", content=str(step.get("thought") or ""),
                                               tool_calls=calls, model=model,
                                               meta={"synthetic_tool_call": True} if calls else {}))
        if calls and step.get("observation") is not None:
            session.messages.append(Message(role="tool", content=str(step["observation"]),
                                                   tool_call_id=calls[0].id, name="bash"))


def load(path: Path) -> list[Session]:
    doc = load_document(path)
    if not _is_traj(doc):
        raise ValueError(f"{path}: not a SWE-agent trajectory (no trajectory[] / history[])")
    model = _model_name(doc)
    session = Session(id=path.name.removesuffix(".traj"), format=NAME, source=str(path))
    info = doc.get("info") if isinstance(doc.get("info"), dict) else {}
    session.meta = {k: info[k] for k in ("exit_status", "submission", "model_stats", "swe_agent_version") if k in info}
    if model:
        session.meta["model"] = model
    if doc.get("history"):
        _from_history(doc["history"], model, session)
    else:
        session.warnings.append("no history[]: messages rebuilt from trajectory[] (system and task prompts absent)")
        _from_trajectory(doc["trajectory"], model, session)
    _openai.link_tool_names(session.messages)
    return [session]


register(Format(NAME, "SWE-agent trajectory (*.traj)", detect, load))
