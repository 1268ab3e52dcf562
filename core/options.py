"""The per-request `jumpahead` object: one type, one parser, one schema.

Every wire protocol passes the body's `jumpahead` value to `parse_options`, which
answers a malformed object with a 400 naming the field, and carries the result on the
`Turn` (`Turn.options`). Nothing else reads the raw object. The OpenAPI description
(proxy/openapi.py) publishes `options_schema()`, generated from the fields below, so the
documented contract and the accepted one cannot drift apart (tests/test_request_options.py).

What the parser checks is the shape; what a value means is checked by its owner: a method
name by the engine (`Engine.validate`), a policy spec by policies/registry.py, compaction
options by the compaction policy. Each answers with its own 400.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from .errors import invalid_request

MAX_TOOL_CALLS = 64  # `tool_calls`: a grammar of exactly N calls; beyond this is no agent's turn


@dataclass(frozen=True)
class OracleCall:
    """An ideal tool call the live testbed's steering oracle may supply (live/oracle.py)."""

    name: str
    arguments: dict[str, Any]


def _doc(text: str, schema: dict[str, Any]) -> Any:
    return {"doc": text, "schema": schema}


_STR_LIST = {"type": "array", "items": {"type": "string"}}
_POLICY = {"anyOf": [{"type": "string"}, {"type": "object", "required": ["name"],
                                            "properties": {"name": {"type": "string"}}}]}


@dataclass(frozen=True)
class RequestOptions:
    """What a client may ask of jumpahead for one request. The defaults are "as the
    server was started" (`serve --methods`, `--policy`, ...)."""

    methods: tuple[str, ...] = field(default=(), metadata=_doc(
        "Proposal methods for this request (echo, ngram, draft, drafter, mtp, strict, none); "
        "absent or empty: the server's defaults.",
        {"anyOf": [{"type": "string"}, _STR_LIST]}))
    policies: tuple[str | dict[str, Any], ...] | None = field(default=None, metadata=_doc(
        "Policy specs (`NAME[:key=value,...]`, `module:Class`, or {\"name\": ..., options}) run on "
        "this request besides the server's; absent: only the server's.",
        {"anyOf": [_POLICY, {"type": "array", "items": _POLICY}]}))
    replace: bool = field(default=False, metadata=_doc(
        "With `policies`: run only the request's policies, not the server's.", {"type": "boolean"}))
    session: str | None = field(default=None, metadata=_doc(
        "The agent session this request belongs to (traces, per-session policy state); "
        "absent: from the client's session headers, else from the conversation's start.",
        {"type": "string", "minLength": 1}))
    tool_calls: int | None = field(default=None, metadata=_doc(
        "Under tool_choice required or a named function: exactly this many calls.",
        {"type": "integer", "minimum": 1, "maximum": MAX_TOOL_CALLS}))
    compaction: dict[str, str] | None = field(default=None, metadata=_doc(
        "Responses /compact: the compaction policy's options (mode, target, min_tokens, max_chars, "
        "summary_tokens).",
        {"type": "object", "additionalProperties": {"type": ["string", "integer", "boolean"]}}))
    oracle_output: str | None = field(default=None, metadata=_doc(
        "Replay: the recorded answer of this turn, which the oracle jump policy reads.", {"type": "string"}))
    oracle_calls: tuple[OracleCall, ...] = field(default=(), metadata=_doc(
        "Live testbed: the task's ideal calls, which the steering oracle arm supplies.",
        {"type": "array", "items": {"type": "object", "required": ["name", "arguments"],
                                    "properties": {"name": {"type": "string"}, "arguments": {"type": "object"}}}}))

    def to_json(self) -> dict[str, Any]:
        """The wire form of the options that differ from the defaults (parses back equal)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            if f.name == "oracle_calls":
                value = [{"name": c.name, "arguments": c.arguments} for c in value]
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out


OPTION_NAMES = tuple(f.name for f in fields(RequestOptions))


def options_schema() -> dict[str, Any]:
    """The JSON schema of the `jumpahead` object, from the fields' own descriptions."""
    # null counts as absent, for the object and each option, as the parser reads it
    props = {f.name: {"anyOf": [f.metadata["schema"], {"type": "null"}], "description": f.metadata["doc"]}
             for f in fields(RequestOptions)}
    return {"type": ["object", "null"], "description": "jumpahead's per-request options", "properties": props,
            "additionalProperties": False}


def _fail(name: str, message: str) -> Exception:
    return invalid_request(f"'jumpahead.{name}' {message}", param=f"jumpahead.{name}")


def _methods(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        raise _fail("methods", "must be a list of method names")
    return tuple(value)


def _policies(value: Any) -> tuple[str | dict[str, Any], ...]:
    if isinstance(value, (str, dict)):
        value = [value]
    if not isinstance(value, list):
        raise _fail("policies", "must be a list of policy specs")
    for i, item in enumerate(value):
        if not isinstance(item, str) and not (isinstance(item, dict) and isinstance(item.get("name"), str)):
            raise invalid_request(f"jumpahead.policies[{i}]: a policy is a spec string or an object with a "
                                  f"'name', got {str(item)[:80]!r}", param="jumpahead.policies")
    return tuple(value)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(name, "must be true or false")
    return value


def _text(name: str, value: Any, *, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise _fail(name, "must be a non-empty string" if not empty else "must be a string")
    return value


def _tool_calls(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOOL_CALLS:
        raise _fail("tool_calls", f"must be an integer from 1 to {MAX_TOOL_CALLS}")
    return value


def _compaction(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, (str, int, bool)) for v in value.values()):
        raise _fail("compaction", "must be an object of compaction policy options "
                                  "(mode, target, min_tokens, max_chars, summary_tokens)")
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}


def _oracle_calls(value: Any) -> tuple[OracleCall, ...]:
    if not isinstance(value, list):
        raise _fail("oracle_calls", "must be a list of {name, arguments} objects")
    out = []
    for i, item in enumerate(value):
        if not (isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("arguments"), dict)):
            raise invalid_request(f"jumpahead.oracle_calls[{i}] must be an object with a string 'name' and an "
                                  "object 'arguments'", param="jumpahead.oracle_calls")
        out.append(OracleCall(item["name"], item["arguments"]))
    return tuple(out)


_PARSERS = {
    "methods": _methods,
    "policies": _policies,
    "replace": lambda v: _flag("replace", v),
    "session": lambda v: _text("session", v, empty=False),
    "tool_calls": _tool_calls,
    "compaction": _compaction,
    "oracle_output": lambda v: _text("oracle_output", v),
    "oracle_calls": _oracle_calls,
}
assert set(_PARSERS) == set(OPTION_NAMES), "every option has its parser"


def parse_options(raw: Any) -> RequestOptions:
    """The body's `jumpahead` value as RequestOptions; APIError(400) naming the bad field.
    Absent or null is the defaults; an unknown key is refused (a misspelt option would
    otherwise be ignored without a word); a null value counts as absent."""
    if raw is None:
        return RequestOptions()
    if not isinstance(raw, dict):
        raise invalid_request("'jumpahead' must be an object", param="jumpahead")
    unknown = sorted(str(k) for k in raw if k not in _PARSERS)
    if unknown:
        raise invalid_request(f"unknown jumpahead option {', '.join(map(repr, unknown))} "
                              f"(known: {', '.join(OPTION_NAMES)})", param="jumpahead")
    return RequestOptions(**{k: _PARSERS[k](v) for k, v in raw.items() if v is not None})
