"""Anthropic `context_management` on the wire: the request's edits, validated, and the answer's report.

Claude Code sends `context_management` on every request. The edits the API defines
(`clear_tool_uses_20250919`, `clear_thinking_20251015`) are parsed here into the typed,
protocol-neutral edits of core/turn.py (`ClearToolUsesEdit`, `ClearThinkingEdit`) with
every default filled in (`Turn.context_edits`); the policy runtime applies them as sticky
rewrites (policies/context_edits.py), so a tool use cleared at turn n stays cleared, byte
for byte, at n+1 and the prefix cache keeps hitting. What was applied comes back as
`context_management.applied_edits` (the message, or the stream's final message_delta),
read from `usage.report.context_edits`, where the runtime reports it with the details
(which messages, the tokens of each edit).

A malformed edit is a 400 naming the field; an edit type this server does not know
(e.g. `compact_20260112`) is ignored with a log line, as the Messages protocol ignores
other fields it does not serve.
"""

from __future__ import annotations

import logging
from typing import Any

from jumpahead.core.errors import invalid_request
from jumpahead.core.turn import (
    CLEAR_THINKING,
    CLEAR_TOOL_USES,
    ClearThinkingEdit,
    ClearToolUsesEdit,
    ContextEditSpec,
    Usage,
)

log = logging.getLogger(__name__)

APPLIED_FIELDS = ("type", "cleared_tool_uses", "cleared_thinking_turns", "cleared_input_tokens")


def _int_field(value: Any, where: str, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_request(f"{where} must be an integer, got {type(value).__name__}", param=where)
    if value < lo:
        raise invalid_request(f"{where} must be at least {lo}, got {value}", param=where)
    return value


def _counted(value: Any, where: str, kinds: tuple[str, ...], lo: int) -> tuple[str, int]:
    """A `{"type": KIND, "value": N}` object: (kind, N)."""
    if not isinstance(value, dict):
        raise invalid_request(f"{where} must be an object {{\"type\": ..., \"value\": ...}}", param=where)
    kind = value.get("type")
    if kind not in kinds:
        raise invalid_request(f"{where}.type must be {' or '.join(repr(k) for k in kinds)}, got {kind!r}",
                              param=f"{where}.type")
    if "value" not in value:
        raise invalid_request(f"{where}.value is required", param=f"{where}.value")
    return kind, _int_field(value["value"], f"{where}.value", lo)


def _names(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise invalid_request(f"{where} must be an array of tool names", param=where)
    return list(value)


def _clear_tool_uses(edit: dict[str, Any], where: str) -> ClearToolUsesEdit:
    out: dict[str, Any] = {}  # the fields given; the API's defaults are ClearToolUsesEdit's
    if edit.get("trigger") is not None:
        out["trigger_unit"], out["trigger"] = _counted(edit["trigger"], f"{where}.trigger",
                                                       ("input_tokens", "tool_uses"), 1)
    if edit.get("keep") is not None:
        out["keep"] = _counted(edit["keep"], f"{where}.keep", ("tool_uses",), 0)[1]
    if edit.get("clear_at_least") is not None:
        out["clear_at_least"] = _counted(edit["clear_at_least"], f"{where}.clear_at_least", ("input_tokens",), 0)[1]
    if edit.get("exclude_tools") is not None:
        out["exclude_tools"] = tuple(_names(edit["exclude_tools"], f"{where}.exclude_tools"))
    inputs = edit.get("clear_tool_inputs")
    if inputs is not None:
        if not isinstance(inputs, bool):
            inputs = tuple(_names(inputs, f"{where}.clear_tool_inputs"))  # bool, or the tools whose inputs go
        out["clear_tool_inputs"] = inputs
    return ClearToolUsesEdit(**out)


def _clear_thinking(edit: dict[str, Any], where: str) -> ClearThinkingEdit:
    raw = edit.get("keep")
    if raw == "all" or (isinstance(raw, dict) and raw.get("type") == "all"):
        return ClearThinkingEdit(keep="all")
    if raw is not None:
        return ClearThinkingEdit(keep=_counted(raw, f"{where}.keep", ("thinking_turns",), 0)[1])
    return ClearThinkingEdit()


PARSERS = {CLEAR_TOOL_USES: _clear_tool_uses, CLEAR_THINKING: _clear_thinking}


def parse_context_management(value: Any) -> list[ContextEditSpec]:
    """The request's edits, defaults filled in, in order; unknown edit types left out
    (logged). Raises APIError(400) naming the malformed field."""
    if not isinstance(value, dict):
        raise invalid_request("context_management must be an object with an 'edits' array",
                              param="context_management")
    raw = value.get("edits")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid_request("context_management.edits must be an array of edits", param="context_management.edits")
    edits: list[ContextEditSpec] = []
    for i, edit in enumerate(raw):
        where = f"context_management.edits[{i}]"
        if not isinstance(edit, dict):
            raise invalid_request(f"{where} must be an object", param=where)
        kind = edit.get("type")
        if not isinstance(kind, str) or not kind:
            raise invalid_request(f"{where}.type must be a non-empty string", param=f"{where}.type")
        parser = PARSERS.get(kind)
        if parser is None:
            log.info("%s: edit type %r is not served here; ignored", where, kind)
            continue
        if any(e.kind == kind for e in edits):
            raise invalid_request(f"{where}.type: {kind} is given twice", param=f"{where}.type")
        if kind == CLEAR_THINKING and edits:
            # the API's rule: thinking blocks are cleared before anything else is counted
            raise invalid_request(f"{where}.type: {CLEAR_THINKING} must be the first edit in context_management.edits",
                                  param=f"{where}.type")
        edits.append(parser(edit, where))
    return edits


def applied_edits(usage: Usage) -> dict[str, Any] | None:
    """The answer's `context_management` (None when the request sent none): what the
    policy runtime applied, as it put it into `usage.report` (`{"applied_edits": []}`
    where nothing was cleared)."""
    report = usage.report.context_edits
    if not isinstance(report, dict):
        return None
    return {"applied_edits": [{k: e[k] for k in APPLIED_FIELDS if k in e} for e in report.get("applied_edits", [])]}
