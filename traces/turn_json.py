"""A `Turn` and its `Message`s as plain JSON and back.

A trace stores the context the model saw (after policies) in this form (its `context`),
so replay and analysis rebuild the exact Turn without knowing the protocol it arrived
in; an imported Session stores its messages in the same form (traces/session.py).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from jumpahead.engine.types import SamplingParams
from jumpahead.core.turn import Message, ResponseFormat, Tool, ToolCall, ToolChoice, Turn


def call_to_json(call: ToolCall) -> dict[str, Any]:
    out: dict[str, Any] = {"name": call.name, "arguments": call.arguments, "id": call.id}
    if call.issues:
        out["issues"] = list(call.issues)
    return out


def message_to_json(m: Message) -> dict[str, Any]:
    """Only the fields a message has (a tool result has no tool_calls, ...): smaller files.
    Reasoning "" and None stay apart (an imported session's round trip is exact)."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.reasoning is not None:
        out["reasoning"] = m.reasoning
    if m.tool_calls:
        out["tool_calls"] = [call_to_json(c) for c in m.tool_calls]
    for key in ("tool_call_id", "name", "model", "timestamp"):
        if getattr(m, key) is not None:
            out[key] = getattr(m, key)
    if m.meta:
        out["meta"] = m.meta
    return out


# Beyond messages, tools, sampling and thinking, a context keeps what shapes the answer:
# a response format (a grammar strict fill follows) and whether the answer continues the
# last assistant message, so replay asks as the client did. Not kept: the per-request
# `jumpahead` options (a replay arm sets its own), metadata, user, and
# parallel_tool_calls (the body has it; a recorded answer already holds the calls it
# allowed, and replay forces that answer).
# Traces written before the typed Turn kept the protocol's own format field under
# "extra" (chat `response_format`, Responses `text.format`, Anthropic
# `output_config.format`); `response_format_from_json` reads both.
_OLD_FORMAT_FIELDS = ("response_format", "text", "output_config")


def response_format_from_json(d: dict[str, Any]) -> ResponseFormat | None:
    """The response format a recorded context (or a message's replay meta) asks for."""
    if d.get("response_format") is not None:
        return ResponseFormat.from_wire(d["response_format"])
    extra = d.get("extra")
    if not isinstance(extra, dict):
        return None
    for key in _OLD_FORMAT_FIELDS:
        value = extra.get(key)
        fmt = ResponseFormat.from_wire(value if key == "response_format" else
                                       value.get("format") if isinstance(value, dict) else None)
        if fmt is not None:
            return fmt
    return None


def _sampling_to_json(s: SamplingParams) -> dict[str, Any]:
    out = asdict(s)
    out["logit_bias"] = {str(k): v for k, v in s.logit_bias.items()}  # JSON keys are text
    return out


def turn_to_json(turn: Turn) -> dict[str, Any]:
    out = {
        "messages": [message_to_json(m) for m in turn.messages],
        "tools": [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in turn.tools],
        "tool_choice": {"mode": turn.tool_choice.mode, "name": turn.tool_choice.name},
        "sampling": _sampling_to_json(turn.sampling),
        "max_tokens": turn.max_tokens,
        "stop": list(turn.stop),
        "thinking": turn.thinking,
        "model": turn.model,
    }
    if turn.response_format is not None:
        out["response_format"] = turn.response_format.as_openai()
    if turn.continue_final:
        out["continue_final"] = True
    return out


def message_from_json(d: dict[str, Any]) -> Message:
    """The message `message_to_json` wrote (arguments given as a JSON value, as session
    files written before the one model hold them, become their JSON text)."""
    calls = [ToolCall(name=str(c.get("name", "")), arguments=c.get("arguments", "{}"), id=str(c.get("id") or ""),
                      issues=list(c.get("issues") or [])) for c in d.get("tool_calls") or []]
    return Message(role=d.get("role", "user"), content=d.get("content"), reasoning=d.get("reasoning"),
                   tool_calls=calls, tool_call_id=d.get("tool_call_id"), name=d.get("name"), model=d.get("model"),
                   timestamp=d.get("timestamp"), meta=dict(d.get("meta") or {}))


def turn_from_json(d: dict[str, Any]) -> Turn:
    """The Turn a recorded `context` describes (unknown sampling keys are ignored)."""
    raw = dict(d.get("sampling") or {})
    fields = set(SamplingParams.__dataclass_fields__)
    sampling = SamplingParams(**{k: v for k, v in raw.items() if k in fields and k != "logit_bias"})
    sampling.logit_bias = {int(k): float(v) for k, v in (raw.get("logit_bias") or {}).items()}
    choice = d.get("tool_choice") or {}
    return Turn(
        messages=[message_from_json(m) for m in d.get("messages") or []],
        tools=[Tool(t["name"], t.get("description") or "", t.get("parameters")) for t in d.get("tools") or []],
        tool_choice=ToolChoice(choice.get("mode", "auto"), choice.get("name")),
        sampling=sampling,
        max_tokens=d.get("max_tokens"),
        stop=list(d.get("stop") or []),
        thinking=d.get("thinking"),
        model=d.get("model"),
        response_format=response_format_from_json(d),
        continue_final=d.get("continue_final") is True,
    )
