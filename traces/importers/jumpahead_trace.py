"""Importer for jumpahead's own traces (`serve --trace-dir`), format "jumpahead".

A trace holds one line per answered turn, each with the whole context the client
sent. The Session is the last turn's context as the client sent it (the
`request_context` where policies rewrote it) plus the last answer; each earlier
assistant message in it is replaced by the answer the recorder saw for that turn
(with its reasoning, and meta: provenance runs, timings, usage, turn index), and the
tool results between answers are the ones the next turn's context carries.

One session id can carry several conversations (Claude Code sends side requests,
such as title generation, under the main session's id). Turns are chained by
context: a turn continues the chain whose last context is a prefix of its own. Each
chain becomes a Session; the one with the most turns comes first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from jumpahead.core.turn import Message, ToolCall

from ..formats import Format, register
from ..session import Session
from ..trace_file import is_header, read_trace
from ..turn_json import response_format_from_json


def detect(path: Path, head: bytes) -> bool:
    first = head.split(b"\n", 1)[0]
    try:
        return is_header(orjson.loads(first))
    except orjson.JSONDecodeError:
        return False


def _client_messages(turn: dict[str, Any]) -> list[dict[str, Any]]:
    ctx = turn.get("request_context") or turn.get("context") or {}
    return [m for m in ctx.get("messages") or [] if isinstance(m, dict)]


def _key(m: dict[str, Any]) -> tuple:
    """What must match for a later context to extend an earlier one. An assistant
    message is matched by its calls' names only: clients re-serialize answers."""
    if m.get("role") == "assistant":
        return ("assistant", tuple(c.get("name") for c in m.get("tool_calls") or []))
    return (m.get("role"), m.get("content") or "", m.get("tool_call_id"))


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError:
            return raw  # kept as the model wrote it
    return raw


def _calls(raw: list[Any] | None) -> list[ToolCall]:
    return [ToolCall(name=str(c.get("name", "")), arguments=_arguments(c.get("arguments")), id=str(c.get("id") or ""))
            for c in raw or [] if isinstance(c, dict)]


def _client_message(m: dict[str, Any]) -> Message:
    role = m.get("role") if m.get("role") in ("system", "user", "assistant", "tool") else "user"
    return Message(role=role, content=m.get("content") or "", reasoning=m.get("reasoning") or "",
                          tool_calls=_calls(m.get("tool_calls")), tool_call_id=m.get("tool_call_id"), name=m.get("name"))


def _meta(turn: dict[str, Any]) -> dict[str, Any]:
    response = turn.get("response") or {}
    ctx = turn.get("context") or {}
    meta = {"runs": response.get("runs", []), "timings": turn.get("timings", {}),
            "usage": turn.get("usage", {}), "turn_index": turn.get("index"),
            # what replay needs to ask for this turn as the server did (Session.turn)
            "tool_choice": ctx.get("tool_choice"), "thinking": ctx.get("thinking"),
            "methods": turn.get("methods", []), "prompt_tokens": turn.get("prompt_tokens"),
            "finish_reason": response.get("finish_reason")}
    fmt = response_format_from_json(ctx)
    if fmt is not None:
        meta["response_format"] = fmt.as_openai()  # the grammar replay asks for again
    if turn.get("continues"):
        meta["continues"] = True  # the runs hold only the continuation of the client's prefix
    return meta


def _answer(turn: dict[str, Any], model: str | None) -> Message:
    r = turn.get("response") or {}
    return Message(role="assistant", content=r.get("content") or "", reasoning=r.get("reasoning") or "",
                          tool_calls=_calls(r.get("tool_calls")), model=model, timestamp=turn.get("started"),
                          meta=_meta(turn))


def _chains(turns: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    lasts: list[list[tuple]] = []  # per chain: the keys of its last context
    chains: list[list[dict[str, Any]]] = []
    for turn in turns:
        keys = [_key(m) for m in _client_messages(turn)]
        best = -1
        for i, last in enumerate(lasts):
            if len(last) <= len(keys) and keys[: len(last)] == last and (best < 0 or len(last) > len(lasts[best])):
                best = i
        if best < 0:
            lasts.append(keys)
            chains.append([turn])
        else:
            lasts[best] = keys
            chains[best].append(turn)
    return chains


def _session(chain: list[dict[str, Any]], header: dict[str, Any], sid: str, path: Path) -> Session:
    model = header.get("model")
    last = chain[-1]
    base = _client_messages(last)
    messages = [_client_message(m) for m in base]
    warnings = []
    superseded = 0
    for turn in chain[:-1]:
        slot = len(_client_messages(turn)) - (1 if turn.get("continues") else 0)
        if slot >= len(messages):  # the same context asked again (a retry): the later answer stands
            superseded += 1
            continue
        if messages[slot].role != "assistant":
            warnings.append(f"turn {turn.get('index')}: the next context has no assistant message at {slot}")
            continue
        if turn.get("continues"):  # the client's message holds the prefix and the answer
            messages[slot].meta = _meta(turn)
            messages[slot].model = model
        else:
            answer = _answer(turn, model)
            client = messages[slot].tool_calls
            if [c.name for c in client] == [c.name for c in answer.tool_calls]:
                for ours, theirs in zip(answer.tool_calls, client):  # the ids the tool results refer to
                    ours.id = theirs.id or ours.id
            messages[slot] = answer
    answer = _answer(last, model)
    if last.get("continues") and messages and messages[-1].role == "assistant":
        prefix = messages.pop()
        answer.content = (prefix.content or "") + (answer.content or "")
        answer.reasoning = (prefix.reasoning or "") + (answer.reasoning or "")
    messages.append(answer)
    ctx = last.get("request_context") or last.get("context") or {}
    tools = [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description") or "",
                                               "parameters": t.get("parameters")}}
             for t in ctx.get("tools") or [] if isinstance(t, dict) and t.get("name")]
    meta = {"created": header.get("created"), "model": model, "server": header.get("server", {}),
            "turns_recorded": len(chain), "turn_indices": [t.get("index") for t in chain],
            "protocols": sorted({str(t.get("protocol")) for t in chain})}
    if superseded:
        meta["superseded_turns"] = superseded
    return Session(id=sid, format="jumpahead", messages=messages, tools=tools, source=str(path), meta=meta,
                   warnings=warnings)


def load(path: Path) -> list[Session]:
    header, turns, warnings = read_trace(path)
    sid = str(header.get("session") or path.stem)
    # A turn the client left before it ended (the user interrupted the agent) is in the
    # trace, but it is not part of the conversation: the next context goes on without it.
    cancelled = [t.get("index") for t in turns if (t.get("response") or {}).get("finish_reason") == "cancelled"]
    turns = [t for t in turns if (t.get("response") or {}).get("finish_reason") != "cancelled"]
    chains = sorted(_chains(turns), key=len, reverse=True)
    sessions = [_session(chain, header, sid if i == 0 else f"{sid}#{i}", path) for i, chain in enumerate(chains)]
    if not sessions:  # a header and no complete turn (the server died in its first turn)
        sessions = [Session(id=sid, format="jumpahead", source=str(path), meta={"turns_recorded": 0})]
    sessions[0].warnings[:0] = warnings
    if cancelled:
        sessions[0].meta["cancelled_turns"] = cancelled
    return sessions


FORMAT = register(Format("jumpahead", "jumpahead's own traces (serve --trace-dir): one JSONL file per session",
                         detect, load))
