"""OpenHands evaluation output (`output.jsonl`, written by evaluation/utils/shared.py).

Each line is one benchmark instance, an `EvalOutput` dumped as JSON: `instance_id`,
`instruction` (the task as given), `history` (the agent's event list, the same events as
an OpenHands trajectory; older outputs hold `[action, observation]` pairs instead),
`metadata` (agent class, `llm_config.model`, dataset, ...), `test_result`, `metrics`,
`error` and the `instance` itself. Every line becomes its own Session (id: the instance
id), its messages read from the history by the event-stream importer (openhands.py).

An instance whose history holds no user message (an empty history: it failed before the
agent started) gets its instruction as the user message, so each session holds its task.
A JSON list of such objects (or a single one) is read the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jumpahead.core.turn import Message

from ..formats import Format, register
from ..session import Session
from ._common import first_dicts, json_document, looks_like_document, read_jsonl

NAME = "openhands-eval"
_OUTPUT_KEYS = ("test_result", "instruction", "metadata", "metrics")


def _is_output(row: Any) -> bool:
    return (isinstance(row, dict) and isinstance(row.get("instance_id"), (str, int))
            and (row.get("history") is None or isinstance(row.get("history"), list))
            and "history" in row and any(k in row for k in _OUTPUT_KEYS))


def _events(history: list[Any] | None) -> list[Any]:
    """The history as one event list: `[action, observation]` pairs are flattened."""
    out: list[Any] = []
    for item in history or []:
        if isinstance(item, (list, tuple)):
            out.extend(e for e in item if isinstance(e, dict) and e)  # {} stands for "no observation"
        else:
            out.append(item)
    return out


def _looks_like_events(events: list[Any]) -> bool:
    return all(isinstance(e, dict) and ("action" in e or "observation" in e) for e in events[:10])


def _rows_for_detection(path: Path, head: bytes) -> list[Any]:
    rows: list[Any] = first_dicts(path, head, 4)
    if len(rows) < 2 and looks_like_document(head):  # one JSON document: an object or a list of them
        doc = json_document(path)
        if isinstance(doc, dict):
            rows = [doc]
        elif isinstance(doc, list):
            rows = doc[:4]
    return rows


def detect(path: Path, head: bytes) -> bool:
    rows = _rows_for_detection(path, head)
    return bool(rows) and all(_is_output(r) and _looks_like_events(_events(r.get("history"))) for r in rows)


def _session(row: dict[str, Any], sid: str, path: Path) -> Session:
    # imported here: importing openhands.py registers its format, and detection must try
    # this one (a history inside an instance) before that one (a bare history)
    from .openhands import add_events

    metadata = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
    llm = metadata.get("llm_config") if isinstance(metadata.get("llm_config"), dict) else {}
    model = llm.get("model") if isinstance(llm.get("model"), str) else None
    session = Session(id=sid, format=NAME, source=str(path))
    add_events(session, _events(row.get("history")))
    if not any(m.role == "user" for m in session.messages) and isinstance(row.get("instruction"), str):
        session.messages.insert(0, Message(role="user", content=row["instruction"],
                                                  meta={"from_instruction": True}))
    for m in session.messages:  # text-era actions name no model: the run's configured one wrote them
        if m.role == "assistant" and m.model is None:
            m.model = model
    metrics = row.get("metrics") if isinstance(row.get("metrics"), dict) else {}
    session.meta.update({
        "instance_id": row["instance_id"],
        "model": model,
        "agent_class": metadata.get("agent_class"),
        "dataset": metadata.get("dataset"),
        "test_result": row.get("test_result"),
        "error": row.get("error"),
        "metrics": {k: metrics[k] for k in ("accumulated_cost", "accumulated_token_usage") if k in metrics},
    })
    if row.get("error"):
        session.warnings.append(f"the instance ended with an error: {str(row['error']).splitlines()[0][:200]}")
    return session


def load(path: Path) -> list[Session]:
    warnings: list[str] = []
    doc = json_document(path)
    if doc is None:
        rows: list[Any] = read_jsonl(path, warnings)
    else:
        rows = [doc] if isinstance(doc, dict) else doc if isinstance(doc, list) else []
    outputs = [r for r in rows if _is_output(r)]
    if not outputs:
        raise ValueError(f"{path}: not an OpenHands evaluation output (lines with instance_id and history)")
    if len(outputs) < len(rows):
        warnings.append(f"skipped {len(rows) - len(outputs)} entries without instance_id and history")
    sessions: list[Session] = []
    seen: dict[str, int] = {}
    for row in outputs:
        sid = str(row["instance_id"])
        seen[sid] = seen.get(sid, 0) + 1
        if seen[sid] > 1:  # a rerun appended to the same file: keep both, apart
            sid = f"{sid}#{seen[sid]}"
        sessions.append(_session(row, sid, path))
    sessions[0].warnings[:0] = warnings
    return sessions


register(Format(NAME, "OpenHands evaluation output JSONL (one instance per line: instance_id, history, ...)",
                detect, load))
