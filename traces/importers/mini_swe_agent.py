"""mini-swe-agent trajectories (`*.traj.json`, SWE-agent/mini-swe-agent).

One JSON object `{info, messages, trajectory_format}`: `messages` is the exact list the
model saw, OpenAI-style. Version 2 uses tool calling (assistant `tool_calls` with
`reasoning_content` where the model returns it; results are `role: tool`); version 1
is text only (a ```bash block in the assistant text, the observation as a user
message), which is kept as text. Each message's `extra` holds the raw response (model
name) and a Unix timestamp. The final `role: exit` entry holds the submission: it goes
to Session.meta, not to the messages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..formats import Format, register
from ..session import Session
from . import _openai
from ._common import iso_time, json_document, load_document, looks_like_document

NAME = "mini-swe-agent"


def _is_traj(doc: Any) -> bool:
    if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
        return False
    fmt = doc.get("trajectory_format")
    info = doc.get("info") if isinstance(doc.get("info"), dict) else {}
    return (isinstance(fmt, str) and fmt.startswith("mini-swe-agent")) or "mini_version" in info


def detect(path: Path, head: bytes) -> bool:
    return looks_like_document(head) and _is_traj(json_document(path))


def load(path: Path) -> list[Session]:
    doc = load_document(path)
    if not _is_traj(doc):
        raise ValueError(f"{path}: not a mini-swe-agent trajectory (no messages / trajectory_format)")
    info = doc.get("info") or {}
    config_model = ((info.get("config") or {}).get("model") or {}).get("model_name")
    session = Session(id=str(doc.get("instance_id") or path.name.removesuffix(".traj.json")), format=NAME,
                      source=str(path))
    session.meta = {k: info[k] for k in ("exit_status", "mini_version", "model_stats") if k in info}
    session.meta["trajectory_format"] = doc.get("trajectory_format")
    if config_model:
        session.meta["model"] = config_model
    skipped: dict[str, int] = {}
    for m in doc["messages"]:
        if not isinstance(m, dict):
            continue
        if m.get("role") == "exit":
            session.meta["submission"] = m.get("content")
            continue
        if not _openai.is_message(m):
            skipped[str(m.get("role"))] = skipped.get(str(m.get("role")), 0) + 1
            continue
        extra = m.get("extra") if isinstance(m.get("extra"), dict) else {}
        response = extra.get("response") if isinstance(extra.get("response"), dict) else {}
        msg = _openai.convert(m, model=response.get("model") or config_model, timestamp=iso_time(extra.get("timestamp")))
        if m.get("role") == "tool" and "returncode" in extra:
            msg.meta["returncode"] = extra["returncode"]
        session.messages.append(msg)
    _openai.link_tool_names(session.messages)
    if "submission" not in session.meta and info.get("submission"):
        session.meta["submission"] = info["submission"]
    for role, n in sorted(skipped.items()):
        session.warnings.append(f"skipped {n} messages of unknown role {role!r}")
    return [session]


register(Format(NAME, "mini-swe-agent trajectory (*.traj.json)", detect, load))
