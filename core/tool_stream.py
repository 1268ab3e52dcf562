"""Stream a JSON tool call's arguments while the model is still writing them.

Hermes-style calls (`{"name": ..., "arguments": {...}}` between the call markers) are
read with jiter's partial mode, a maintained incremental JSON parser (the one the
Anthropic and OpenAI SDKs use for the same job), instead of a hand-written scanner:
it turns any prefix of a JSON text into the value parsed so far.

The arguments are streamed in the form the finished call reports them,
`orjson.dumps(arguments)` (compact, keys in the model's order), so the concatenated
deltas equal the non-streamed `arguments`. What is emitted is always a prefix of that
final text: the partial value is serialized, then the closers jiter invented and
anything still able to change (a trailing number, a half-written escape) are held
back until more text arrives.
"""

from __future__ import annotations

from typing import Any

import jiter
import orjson

_CLOSERS = '"]}'
_NUMBER = "0123456789.eE+-"


def partial_json(text: str, *, trailing_strings: bool = True) -> Any:
    """The value parsed from a prefix of a JSON text; None where jiter cannot read it."""
    try:
        return jiter.from_json(text.encode(), partial_mode="trailing-strings" if trailing_strings else "on")
    except ValueError:
        return None


def _arguments_of(value: Any) -> Any:
    if not isinstance(value, dict):
        return None
    return value.get("arguments", value.get("parameters"))


def stable_prefix(arguments: dict[str, Any]) -> str | None:
    """The part of `orjson.dumps(arguments)` no later text can change (None: not serializable)."""
    try:
        text = orjson.dumps(arguments).decode()
    except (TypeError, orjson.JSONEncodeError):  # a lone surrogate of a half-written escape
        return None
    text = text.rstrip(_CLOSERS)  # closers jiter added (or real ones: holding them back is safe)
    text = text.rstrip(_NUMBER)  # 1 may become 12 or 1e5 (which serializes as 100000.0)
    return text.rstrip(_CLOSERS + ",:")


class JsonCallStreamer:
    """Follows one JSON tool-call body as it grows.

    `update(body)` returns the new argument text to emit (the name is in `name` once it
    is complete). Start detection looks at every prefix that ends in a quote, so where
    the call is recognized does not depend on how the text was chunked.
    """

    def __init__(self) -> None:
        self.name: str | None = None
        self.sent = ""  # argument text emitted so far
        self._scanned = 0  # body characters checked for a complete name

    @staticmethod
    def applies(body: str) -> bool:
        """Only bodies that are JSON objects are followed (other families: at the end)."""
        head = body.lstrip()
        return not head or head.startswith("{")

    def _find_name(self, body: str) -> None:
        i = body.find('"', self._scanned)
        while i >= 0 and self.name is None:
            value = partial_json(body[: i + 1], trailing_strings=False)
            name = value.get("name") if isinstance(value, dict) else None
            if isinstance(name, str) and name:
                self.name = name
            i = body.find('"', i + 1)
        self._scanned = len(body)

    def update(self, body: str) -> str:
        """New argument text for the body so far ("" when nothing new is certain)."""
        if self.name is None:
            self._find_name(body)
            if self.name is None:
                return ""
        candidate = self.candidate(body)
        if candidate is None or not candidate.startswith(self.sent) or len(candidate) == len(self.sent):
            return ""
        delta, self.sent = candidate[len(self.sent):], candidate
        return delta

    @staticmethod
    def candidate(body: str) -> str | None:
        """The stable argument text of the body so far (None: none yet)."""
        arguments = _arguments_of(partial_json(body))
        if not isinstance(arguments, dict):
            return None  # arguments not begun, or a JSON string: sent whole at the end
        return stable_prefix(arguments)

    def partial_arguments(self, body: str) -> str:
        """A call cut off before its end: the argument text, as far as it is certain.

        Always extends what was streamed, so streamed and non-streamed answers agree."""
        candidate = self.candidate(body)
        if candidate is not None and candidate.startswith(self.sent):
            self.sent = candidate
        return self.sent
