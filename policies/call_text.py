"""A tool call being written in the Hermes / ChatML JSON form, and how to finish it.

The default model (and every template with a `<tool_call>` JSON form) writes

    <tool_call>\\n{"name": "write", "arguments": {"path": "a.py", "content": "..."}}\\n</tool_call>

`parse_partial` reads the call's body so far (the text after the start marker) into a
`PartialCall`: the tool's name, the arguments already complete, and where the writer
stands (inside a key, after a colon, inside a string value, ...). `complete` writes the
rest of the call from there, in the writer's own layout (separators detected from what
it wrote; the chat template's `tojson` style, `", "` and `": "`, by default), with JSON
escaping as `json.dumps(ensure_ascii=False)` writes it, and the closing `}}` plus the
end marker. Policies never guess a layout they cannot read: anything unexpected is None.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

DEFAULT_START = "<tool_call>"
DEFAULT_END = "</tool_call>"

_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_NAME_OPEN = re.compile(r'\s*\{\s*"name"\s*:\s*"')
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class CallFormat:
    """The layout of the model's calls: JSON separators and the end marker."""

    item_sep: str = ", "
    key_sep: str = ": "
    end: str = DEFAULT_END

    @classmethod
    def detect(cls, call_text: str, end: str = DEFAULT_END) -> CallFormat:
        """The separators the writer used so far (the template's by default)."""
        compact = re.search(r'"name":"', call_text) is not None and '"name": "' not in call_text
        return cls(",", ":", end) if compact else cls(", ", ": ", end)

    def close(self) -> str:
        """What follows the arguments object's last value: `}}` then the end marker."""
        return "}}\n" + self.end

    def dump(self, value: Any) -> str:
        """A JSON value as the template writes it; the end marker never appears in it
        literally (`</` is written `<\\/`, which JSON reads back the same)."""
        text = json.dumps(value, ensure_ascii=False, separators=(self.item_sep, self.key_sep))
        return self.guard(text)

    def guard(self, text: str) -> str:
        if self.end.startswith("</") and self.end in text:
            text = text.replace(self.end, "<\\/" + self.end[2:])
        return text

    def string_tail(self, tail: str) -> str:
        """The escaped form of `tail` inside an already opened JSON string (no quotes)."""
        return self.guard(json.dumps(tail, ensure_ascii=False)[1:-1])

    def members(self, items: list[tuple[str, Any]]) -> str:
        return self.item_sep.join(f"{json.dumps(k, ensure_ascii=False)}{self.key_sep}{self.dump(v)}" for k, v in items)


# Where the writer stands inside the arguments object (PartialCall.stage):
#   "outer"       name written, the `, "arguments": {` opener not (fully) yet
#   "open"        right after `{` of the arguments
#   "key"         inside a key string (partial holds its text so far)
#   "after_key"   a key closed, no colon yet
#   "after_colon" colon written, value not started
#   "string"      inside a string value (partial holds its decoded text so far)
#   "after_value" a value complete, no comma yet
#   "after_comma" comma written, next key not started
STAGES = ("outer", "open", "key", "after_key", "after_colon", "string", "after_value", "after_comma")


@dataclass
class PartialCall:
    name: str
    args: dict[str, Any] = field(default_factory=dict)  # complete arguments, in written order
    stage: str = "outer"
    key: str | None = None  # stage after_key / after_colon / string: the key being written
    partial: str = ""  # stage key: key text so far; stage string: decoded value so far
    tail: str = ""  # stage outer: the opener text written after the name
    trailing_space: bool = False  # the text so far ends in whitespace


def _string(text: str, i: int) -> tuple[str | None, int, str | None]:
    """Scan a JSON string whose opening quote is at text[i-1]. Returns (decoded, end,
    partial): decoded/end when it closes (end after the closing quote), else the
    decoded text so far (None if it stops inside an escape)."""
    j = i
    n = len(text)
    while j < n:
        c = text[j]
        if c == '"':
            try:
                return json.loads(text[i - 1 : j + 1]), j + 1, None
            except json.JSONDecodeError:  # raw control characters: not JSON
                return None, n, None
        if c == "\\":
            if j + 1 >= n:
                return None, n, None
            if text[j + 1] == "u":
                if j + 6 > n:
                    return None, n, None
                j += 6
                continue
            j += 2
            continue
        j += 1
    raw = text[i:n]
    try:
        decoded = json.loads('"' + raw + '"')
    except json.JSONDecodeError:
        return None, n, None  # a lone high surrogate escape: not a decidable prefix
    return None, n, decoded


def parse_partial(call_text: str, fmt: CallFormat | None = None) -> PartialCall | None:
    """Read the body of an open call (text after the start marker). None where the name
    is incomplete or the text does not look like the `{"name": ..., "arguments": {...`
    form (another layout, a broken prefix, a closed arguments object)."""
    m = _NAME.match(call_text)
    if m is None:
        return None
    try:
        name = json.loads(f'"{m.group(1)}"')
    except json.JSONDecodeError:
        return None
    fmt = fmt or CallFormat.detect(call_text)
    rest = call_text[m.end() :]
    opener = f'{fmt.item_sep}"arguments"{fmt.key_sep}{{'
    squeezed = re.sub(r"\s+", "", rest)
    if "{" not in rest:
        if not re.sub(r"\s+", "", opener).startswith(squeezed):
            return None
        return PartialCall(name, stage="outer", tail=rest, trailing_space=rest[-1:].isspace())
    om = re.match(r'\s*,\s*"arguments"\s*:\s*\{', rest)
    if om is None:
        return None
    return _scan_arguments(name, rest, om.end())


def _scan_arguments(name: str, text: str, pos: int) -> PartialCall | None:
    call = PartialCall(name, stage="open", trailing_space=text[-1:].isspace())
    n = len(text)

    def skip(p: int) -> int:
        while p < n and text[p] in " \t\r\n":
            p += 1
        return p

    def inside(stage: str, partial: str | None) -> PartialCall | None:
        """The text ends inside a string: the call at `stage` with the string so far (None
        where that is not a decidable prefix)."""
        if partial is None:
            return None
        call.stage, call.partial = stage, partial
        return call

    def past(p: int, sep: str, stage: str) -> int | PartialCall | None:
        """After a key or value ending at `p`: the position past `sep`; the call at `stage`
        where the text ends first; None where anything else stands there."""
        p = skip(p)
        if p >= n:
            call.stage = stage
            return call
        return p + 1 if text[p] == sep else None

    first = True
    while True:
        pos = skip(pos)
        if pos >= n:
            call.stage = "open" if first else "after_comma"
            return call
        if text[pos] != '"':
            return None  # a closed object, or not a key
        key, end, partial = _string(text, pos + 1)
        if key is None:
            return inside("key", partial)
        call.key = key
        after = past(end, ":", "after_key")
        if not isinstance(after, int):
            return after
        pos = skip(after)
        if pos >= n:
            call.stage = "after_colon"
            return call
        if text[pos] == '"':
            value, end, partial = _string(text, pos + 1)
            if value is None:
                return inside("string", partial)
        else:
            try:
                value, end = _DECODER.raw_decode(text, pos)
            except json.JSONDecodeError:
                return None  # a number, literal or nested value still being written
            if end >= n and isinstance(value, int | float):
                return None  # a number may still grow
        call.args[key] = value
        call.key = None
        after = past(end, ",", "after_value")
        if not isinstance(after, int):
            return after
        pos = after
        first = False


def complete(call: PartialCall, items: list[tuple[str, Any]], fmt: CallFormat) -> str | None:
    """The text that finishes `call` with the arguments `items` (those not yet written,
    in order; where the writer is inside a key or value, the first item is that one)
    and closes the call. None when `items` do not fit what was written."""
    space = "" if call.trailing_space else fmt.item_sep[len(fmt.item_sep.rstrip()):]
    kspace = "" if call.trailing_space else fmt.key_sep[len(fmt.key_sep.rstrip()):]
    stage = call.stage
    if stage == "outer":
        opener = f'{fmt.item_sep}"arguments"{fmt.key_sep}{{'
        done = re.sub(r"\s+", "", call.tail)
        # walk the opener past what was written (whitespace in either is free)
        i = k = 0
        while k < len(done):
            if opener[i].isspace():
                i += 1
                continue
            if opener[i] != done[k]:
                return None
            i += 1
            k += 1
        rest = opener[i:].lstrip() if call.trailing_space else opener[i:]
        return rest + fmt.members(items) + fmt.close()
    if stage in ("open", "after_comma"):
        lead = "" if stage == "open" else space
        return lead + fmt.members(items) + fmt.close()
    if stage == "after_value":
        return (fmt.item_sep + fmt.members(items) if items else "") + fmt.close()
    if not items:
        return None
    (key, value), more = items[0], items[1:]
    after = (fmt.item_sep + fmt.members(more) if more else "") + fmt.close()
    if stage == "key":
        if not key.startswith(call.partial):
            return None
        return json.dumps(key[len(call.partial) :], ensure_ascii=False)[1:] + fmt.key_sep + fmt.dump(value) + after
    if key != call.key:
        return None
    if stage == "after_key":
        return fmt.key_sep + fmt.dump(value) + after
    if stage == "after_colon":
        return kspace + fmt.dump(value) + after
    if stage == "string":
        if not isinstance(value, str) or not value.startswith(call.partial):
            return None
        return fmt.string_tail(value[len(call.partial) :]) + '"' + after
    return None
