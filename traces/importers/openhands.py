"""OpenHands event streams (a JSON list of events, as in its trajectory exports and
tests/runtime/trajs/*.json).

Each event is an action (`action`, `args`) or an observation (`observation`, `content`,
`cause`), from `source` user / agent / environment. Agent actions produced by a tool call
carry `tool_call_metadata`: the function name, the call id and the whole `model_response`
(OpenAI-style, via litellm). One model response may yield several actions
(`total_calls_in_response`), so the assistant message is built once per response id from
the response itself: its text (OpenHands' `thought`), reasoning where the provider
returned it, every tool call with its arguments, and the model. Observations with
`tool_call_metadata` are the tool results. Agent messages without a tool call (`message`,
`finish`) are text-only assistant messages; a `system` action gives the system prompt
and the tools offered. State changes, recalls and environment events hold nothing the
model wrote or read as a message; they are counted in meta.

Histories from before function calling (CodeAct's text actions, as in 2024 evaluation
outputs) carry no `tool_call_metadata`: an agent action that runs something (`run`,
`run_ipython`, `read`, `edit`, `browse_interactive`, ...) is then one assistant message
with one call rebuilt from the action (id "oh-<event id>"), and the observation whose
`cause` is that event is its result. `add_events` is shared with the evaluation-output
importer (openhands_eval.py), whose lines each hold one such history.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jumpahead.core.turn import Message, ToolCall

from ..formats import Format, register
from ..session import Session
from . import _openai
from ._common import content_text, iso_time, json_document, load_document, looks_like_document

NAME = "openhands"
# agent actions that run a tool (openhands/core/schema/action.py); others are control flow
_RUNNABLE = {"run", "run_ipython", "read", "write", "edit", "browse", "browse_interactive", "call_tool_mcp",
             "delegate"}
_NOT_ARGS = {"thought", "impl_source", "translated_ipython_code", "security_risk", "confirmation_state",
             "is_confirmed", "hidden", "blocking", "wait_for_response"}


def _events(doc: Any) -> list[dict[str, Any]] | None:
    if isinstance(doc, dict):
        doc = doc.get("history") if isinstance(doc.get("history"), list) else doc.get("events")
    if not isinstance(doc, list) or not doc:
        return None
    sample = [e for e in doc[:10]]
    if all(isinstance(e, dict) and "source" in e and ("action" in e or "observation" in e) for e in sample):
        return doc
    return None


def detect(path: Path, head: bytes) -> bool:
    return looks_like_document(head) and _events(json_document(path)) is not None


def _response_message(response: dict[str, Any], ts: str | None) -> Message | None:
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    msg = choices[0].get("message")
    if not isinstance(msg, dict):
        return None
    return Message(role="assistant", content=content_text(msg.get("content")), reasoning=_openai.reasoning_of(msg),
                          tool_calls=_openai.tool_calls(msg), model=response.get("model"), timestamp=ts,
                          meta={"response_id": response.get("id"), "usage": response.get("usage")})


def _fallback_call(event: dict[str, Any], meta: dict[str, Any]) -> ToolCall:
    args = {k: v for k, v in (event.get("args") or {}).items() if k not in _NOT_ARGS}
    return ToolCall(name=meta.get("function_name") or event.get("action") or "", arguments=args,
                           id=meta.get("tool_call_id") or "")


def load(path: Path) -> list[Session]:
    events = _events(load_document(path))
    if events is None:
        raise ValueError(f"{path}: not an OpenHands event list (events with source and action / observation)")
    session = Session(id=path.stem, format=NAME, source=str(path))
    add_events(session, events)
    return [session]


def add_events(session: Session, events: list[Any]) -> None:
    """Append the messages of an OpenHands event list to `session` (meta["ignored_events"]
    counts the events that hold no message)."""
    by_response: dict[str, Message] = {}
    text_calls: dict[Any, ToolCall] = {}  # event id of a metadata-less action -> the call made for it
    ignored: dict[str, int] = {}

    def ignore(kind: str) -> None:
        ignored[kind] = ignored.get(kind, 0) + 1

    for event in events:
        if not isinstance(event, dict):
            ignore("not an object")
            continue
        ts = iso_time(event.get("timestamp"))
        source = event.get("source")
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        meta = event.get("tool_call_metadata") if isinstance(event.get("tool_call_metadata"), dict) else None
        if "action" in event:
            action = event["action"]
            if action == "system":
                session.messages.append(Message(role="system", content=str(args.get("content") or ""),
                                                       timestamp=ts))
                if isinstance(args.get("tools"), list):
                    session.tools = args["tools"]
            elif source == "user" and action == "message":
                session.messages.append(Message(role="user", content=str(args.get("content") or
                                                                                event.get("message") or ""),
                                                       timestamp=ts))
            elif source == "agent" and meta is not None:
                response = meta.get("model_response") if isinstance(meta.get("model_response"), dict) else {}
                rid = response.get("id")
                if rid and rid in by_response:
                    continue  # another action of a response already read
                msg = _response_message(response, ts) if response else None
                if msg is None:  # no response recorded: rebuild the call from the action itself
                    msg = Message(role="assistant", content=str(args.get("thought") or ""), timestamp=ts,
                                         tool_calls=[_fallback_call(event, meta)])
                if rid:
                    by_response[rid] = msg
                session.messages.append(msg)
            elif source == "agent" and action in _RUNNABLE:  # a text-era action: no recorded response
                call = _fallback_call(event, {"tool_call_id": f"oh-{event.get('id')}"})
                text_calls[event.get("id")] = call
                session.messages.append(Message(role="assistant", content=str(args.get("thought") or ""),
                                                       timestamp=ts, tool_calls=[call],
                                                       meta={"action": action, "rebuilt": True}))
            elif source == "agent" and action in ("message", "finish"):
                text = args.get("content") or args.get("final_thought") or args.get("thought") or event.get("message")
                session.messages.append(Message(role="assistant", content=str(text or ""), timestamp=ts,
                                                       meta={"action": action}))
            else:
                ignore(f"action:{action}")
        elif "observation" in event:
            if meta is not None:
                session.messages.append(Message(role="tool", content=str(event.get("content") or ""),
                                                       tool_call_id=meta.get("tool_call_id") or "",
                                                       name=meta.get("function_name"), timestamp=ts,
                                                       meta={"observation": event["observation"]}))
            elif event.get("cause") is not None and event.get("cause") in text_calls:
                call = text_calls.pop(event["cause"])
                session.messages.append(Message(role="tool", content=str(event.get("content") or ""),
                                                       tool_call_id=call.id, name=call.name, timestamp=ts,
                                                       meta={"observation": event["observation"]}))
            else:
                ignore(f"observation:{event['observation']}")
    session.meta["ignored_events"] = ignored


register(Format(NAME, "OpenHands event stream JSON (list of actions and observations)", detect, load))
