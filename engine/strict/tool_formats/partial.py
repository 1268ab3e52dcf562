"""Reading a call being written and finishing it, for the families whose arguments are
one JSON object (all but Qwen3-Coder's and GLM's XML parameters).

The Hermes / ChatML form (the default model's) is

    <tool_call>\\n{"name": "write", "arguments": {"path": "a.py", "content": "..."}}\\n</tool_call>

`parse_partial` reads the call's body so far (the text after the start marker) into a
`PartialCall`: the tool's name, the arguments already complete, and where the writer
stands (inside a key, after a colon, inside a string value, ...). `complete` writes the
rest of the call from there, in the writer's own layout (separators detected from what
it wrote; the chat template's `tojson` style, `", "` and `": "`, by default), with JSON
escaping as `json.dumps(ensure_ascii=False)` writes it, and the closing `}}` plus the
end marker. Other JSON families differ only in the text around the arguments object
(`CallFormat.opener`, `closing`): `JsonFormat` reads their head (the name) and hands the
arguments to the same scanner. Anything unexpected is None: a layout that cannot be
read is never guessed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .base import EarlierCall, Format, PartialCall, decoded_arguments

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
    opener: str | None = None  # after the name, up to the arguments' `{` (None: Hermes')
    closing: str | None = None  # after the arguments' last value (None: Hermes' `}}` + end)
    guards: tuple[str, ...] = ()  # markers that must not appear literally in a JSON string

    @classmethod
    def detect(cls, call_text: str, end: str = DEFAULT_END) -> CallFormat:
        """The separators the writer used so far (the template's by default)."""
        compact = re.search(r'"name":"', call_text) is not None and '"name": "' not in call_text
        return cls(",", ":", end) if compact else cls(", ", ": ", end)

    def close(self) -> str:
        """What follows the arguments object's last value: `}}` then the end marker."""
        return "}}\n" + self.end if self.closing is None else self.closing

    def open_text(self) -> str:
        """From the end of the name to the arguments' `{`."""
        return f'{self.item_sep}"arguments"{self.key_sep}{{' if self.opener is None else self.opener

    def complete(self, call: PartialCall, items: list[tuple[str, Any]], layout: Any = None) -> str | None:
        return complete(call, items, self)

    def dump(self, value: Any) -> str:
        """A JSON value as the template writes it; the end marker never appears in it
        literally (`</` is written `<\\/`, which JSON reads back the same)."""
        text = json.dumps(value, ensure_ascii=False, separators=(self.item_sep, self.key_sep))
        return self.guard(text)

    def guard(self, text: str) -> str:
        if self.end.startswith("</") and self.end in text:
            text = text.replace(self.end, "<\\/" + self.end[2:])
        for marker in self.guards:  # `<|x|>` is written `<\u007cx|>`: JSON reads it back the same
            if marker in text:
                text = text.replace(marker, marker[0] + "\\u%04x" % ord(marker[1]) + marker[2:])
        return text

    def string_tail(self, tail: str, before: str = "") -> str:
        """The escaped form of `tail` inside an already opened JSON string (no quotes);
        `before`: the string's text so far, so a marker split across the two is escaped too."""
        text = self.guard(json.dumps(tail, ensure_ascii=False)[1:-1])
        markers = ([self.end] if self.end.startswith("</") else []) + list(self.guards)
        for m in markers:
            if any(before.endswith(m[:k]) and text.startswith(m[k:]) for k in range(1, len(m))):
                return "\\u%04x" % ord(text[0]) + text[1:]
        return text

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
    opener = fmt.open_text()
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
        opener = fmt.open_text()
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
        return fmt.string_tail(value[len(call.partial) :], call.partial) + '"' + after
    return None


# --- JSON families other than Hermes ------------------------------------------------------

_SPACE = re.compile(r"\s+")


def _squeeze(text: str) -> str:
    return _SPACE.sub("", text)


class JsonFormat(Format):
    """A family whose call is `head NAME opener {arguments} closer`, calls one after
    another (`split` before each further call, or before each call where the parser's
    start marker opens a section: `leading_split`), `section_end` after the last.

    `opener(item_sep, key_sep, index)` is the text from the end of the name to the
    arguments' `{`; `name_re` matches the name after `head` (a complete name is followed
    by more text); `split_find` is what a reader looks for where a further call begins.
    """

    def __init__(self, family: str, *, start: str, split: str, head: str, name_re: str,
                 opener: Any, closer: str, section_end: str = "", leading_split: bool = False,
                 split_find: str | None = None, between: str = "", json_name: bool = False,
                 guards: tuple[str, ...] = (), parse: Any = None, parser_end: str = "",
                 stops: tuple[str, ...] = ()) -> None:
        self.family, self.start, self.split, self.head = family, start, split, head
        self.name_re = re.compile(name_re, re.DOTALL)
        self.opener, self.closer, self.section_end = opener, closer, section_end
        self.leading_split, self.split_find, self.between = leading_split, split_find or split, between
        self.json_name = json_name
        self.guards = tuple(g for g in guards if g)
        self.parse, self.parser_end, self.stops = parse, parser_end, stops

    # --- writing -----------------------------------------------------------------------
    def _layout(self, item_sep: str, key_sep: str, index: int) -> CallFormat:
        return CallFormat(item_sep, key_sep, "", opener=self.opener(item_sep, key_sep, index),
                          closing="}" + self.closer + self.section_end, guards=self.guards)

    def _name_text(self, name: str) -> str:
        return json.dumps(name, ensure_ascii=False)[1:-1] if self.json_name else name

    def segment(self, name: str, args: dict[str, Any], index: int, seps: tuple[str, str] = (", ", ": ")) -> str:
        """One call's text, from its split marker (where it has one) to its closer."""
        fmt = self._layout(*seps, index)
        lead = self.split if (index or self.leading_split) else ""
        return (lead + self.head + self._name_text(name) + fmt.open_text()[:-1]
                + fmt.dump(args) + self.closer)

    def write(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return self.start + self.between.join(self.segment(n, a, i) for i, (n, a) in enumerate(calls)) + self.section_end

    # --- reading -----------------------------------------------------------------------
    def name_of(self, m: re.Match[str]) -> str:
        raw = m.group(1)
        if self.json_name:
            try:
                return json.loads(f'"{raw}"')
            except json.JSONDecodeError:
                return raw
        return raw.strip()

    def _segment(self, call_text: str) -> tuple[str, int]:
        """The last call's text (after its split marker) and its index."""
        count = call_text.count(self.split_find)
        j = call_text.rfind(self.split_find)
        if j < 0:
            return call_text, 0
        return call_text[j + len(self.split_find):], count - 1 if self.leading_split else count

    def layout(self, call_text: str) -> CallFormat:
        seg, index = self._segment(call_text)
        compact = re.search(r'":[^ ]|",[^ ]', seg) is not None and re.search(r'": |", ', seg) is None
        return self._layout(",", ":", index) if compact else self._layout(", ", ": ", index)

    def read(self, call_text: str) -> PartialCall | None:
        if self.leading_split and self.split_find not in call_text:
            return None
        seg, index = self._segment(call_text)
        s = seg.lstrip()
        if not s.startswith(self.head):
            return None
        m = self.name_re.match(s, len(self.head))
        if m is None or m.end() >= len(s):
            return None  # the name is not complete
        name = self.name_of(m)
        fmt = self.layout(call_text)
        rest = s[m.end():]
        opener = fmt.open_text()
        if "{" not in rest:
            if not _squeeze(opener).startswith(_squeeze(rest)):
                return None
            return PartialCall(name, stage="outer", tail=rest, trailing_space=rest[-1:].isspace(), index=index)
        brace = rest.index("{")
        if _squeeze(rest[: brace + 1]) != _squeeze(opener):
            return None
        call = _scan_arguments(name, rest, brace + 1)
        if call is not None:
            call.index = index
        return call

    def complete(self, call: PartialCall, items: list[tuple[str, Any]], layout: Any = None) -> str | None:
        fmt = layout if isinstance(layout, CallFormat) else self._layout(", ", ": ", call.index)
        return complete(call, items, fmt)

    def scanner(self) -> Any:
        from .scan import JsonCallsScanner

        return JsonCallsScanner(self)

    # --- complete calls in a text ---------------------------------------------------------
    def call_end(self, text: str, pos: int) -> int | None:
        """The end of the call open at `pos` (its arguments object, closer and, where it
        is the last, the section's end)."""
        cut = max(text.rfind(self.start, 0, pos) + len(self.start) if text.rfind(self.start, 0, pos) >= 0 else -1,
                  text.rfind(self.split_find, 0, pos) + len(self.split_find)
                  if text.rfind(self.split_find, 0, pos) >= 0 else -1)
        if cut < 0:
            return None
        brace = text.find("{", cut)
        if brace < 0:
            return None
        try:
            _, end = _DECODER.raw_decode(text, brace)
        except json.JSONDecodeError:
            return None
        if end < pos:
            return None
        if self.closer and text.startswith(self.closer, end):
            end += len(self.closer)
        if self.section_end:
            k = len(text) - len(text[end:].lstrip())
            if text.startswith(self.section_end, k):
                end = k + len(self.section_end)
        return end

    def bodies(self, text: str, end: str, stops: tuple[str, ...]) -> list[tuple[str, int, int]]:
        """(body, start, end) of each call section in `text` (end marker, else the first stop)."""
        out, pos = [], 0
        while (i := text.find(self.start, pos)) >= 0:
            b = i + len(self.start)
            ends = [j for j in ([text.find(end, b)] if end else []) + [text.find(s, b) for s in stops] if j >= 0]
            j = min(ends) if ends else len(text)
            out.append((text[b:j], b, j))
            pos = max(j, b)
        return out

    def calls_in(self, text: str) -> list[EarlierCall]:
        return calls_in(text, self, self.parser_end, self.stops)


def calls_in(text: str, fmt: Any, end: str, stops: tuple[str, ...]) -> list[EarlierCall]:
    """The complete calls in `text`, each section read by the family's parser (`fmt.parse`)."""
    out: list[EarlierCall] = []
    for body, b, j in JsonFormat.bodies(fmt, text, end, stops):
        try:
            parsed = fmt.parse(body, None)
        except Exception:  # parsers raise ValueError, JSONDecodeError, KeyError, ...
            continue
        for item in parsed if isinstance(parsed, list) else [parsed]:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                continue
            args = decoded_arguments(item.get("arguments", item.get("parameters", {})))
            if args is not None:
                out.append(EarlierCall(item["name"], args, b + len(body) - len(body.lstrip()), j))
    return out
