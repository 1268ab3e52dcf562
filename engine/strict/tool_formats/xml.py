"""Families whose parameters are XML-like elements with raw values (Qwen3-Coder, GLM):
strings are written as they are, other values as JSON (or, for Qwen3-Coder scalars, as
the template's `|string` writes them).

The reader walks the call into a `PartialCall` (stages as partial.py's, a value being
written is stage "string" with its raw text so far); the completer writes the whole call
with the family's writer and returns what follows the text already written, so a
completion is always the template's own text or None.
"""

from __future__ import annotations

import re
from typing import Any

from .base import EarlierCall, Format, PartialCall
from .partial import calls_in


def _held(text: str, closer: str) -> str:
    """`text` less a suffix that may be the beginning of `closer`."""
    for k in range(min(len(closer), len(text)), 0, -1):
        if closer.startswith(text[-k:]):
            return text[:-k]
    return text


class XmlFormat(Format):
    """`start + head(name) + (key_open KEY key_close value_open VALUE value_close)* + tail`."""

    def __init__(self, family: str, *, start: str, end: str, name_open: str, name_close: str,
                 key_open: str, key_close: str, value_open: str, value_close: str, call_close: str,
                 value_text: Any, name_re: str, key_re: str, between: str = "", parse: Any = None) -> None:
        self.family, self.start, self.end = family, start, end
        self.name_open, self.name_close = name_open, name_close
        self.key_open, self.key_close, self.value_open, self.value_close = key_open, key_close, value_open, value_close
        self.call_close, self.value_text, self.parse = call_close, value_text, parse
        self.name_re, self.key_re = re.compile(name_re), re.compile(key_re)
        self.between = between

    def body(self, name: str, args: dict[str, Any]) -> str:
        """One call's text after the start marker, through the end marker."""
        params = "".join(f"{self.key_open}{k}{self.key_close}{self.value_open}{self.value_text(v)}{self.value_close}"
                         for k, v in args.items())
        return f"{self.name_open}{name}{self.name_close}{params}{self.call_close}{self.end}"

    def write(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return self.between.join(self.start + self.body(n, a) for n, a in calls)

    def layout(self, call_text: str) -> Any:
        return self

    def read(self, call_text: str) -> PartialCall | None:
        t = call_text
        if not t.startswith(self.name_open):
            return None
        i = len(self.name_open)
        j = t.find((self.name_close or self.key_open)[0], i)
        if j < 0 or not t[i:j].strip():
            return None  # the name is not complete
        call = PartialCall(t[i:j].strip(), stage="outer", written=t, trailing_space=t[-1:].isspace())
        if not t.startswith(self.name_close, j):
            return call if self.name_close.startswith(t[j:]) else None
        pos = j + len(self.name_close)
        call.stage = "open"
        head = self.key_close + self.value_open
        while True:
            rest = t[pos:]
            if not rest.startswith(self.key_open):
                return call if self.key_open.startswith(rest) else None  # between parameters, or closing
            ks = pos + len(self.key_open)
            kc = t.find(self.key_close[0], ks)
            if kc < 0:
                call.stage, call.key, call.partial = "key", None, t[ks:]
                return call
            key = t[ks:kc]
            if not t.startswith(head, kc):
                if not head.startswith(t[kc:]):
                    return None
                call.stage, call.key = "after_key", key
                return call
            vs = kc + len(head)
            v = t.find(self.value_close, vs)
            if v < 0:
                call.stage, call.key, call.partial = "string", key, _held(t[vs:], self.value_close)
                return call
            call.args[key] = t[vs:v]
            call.key, call.partial, call.stage = None, "", "after_value"
            pos = v + len(self.value_close)

    def scanner(self) -> Any:
        from .scan import MarkerScanner

        return MarkerScanner(self.name_re, self.key_re)

    def complete(self, call: PartialCall, items: list[tuple[str, Any]], layout: Any = None) -> str | None:
        args = dict(call.args)
        for k, v in items:
            if k in args:
                return None
            args[k] = v
        # written values are raw text: the call's text is compared, not the values
        full = self.body(call.name, args)
        if not full.startswith(call.written):
            return None
        return full[len(call.written):]

    def call_end(self, text: str, pos: int) -> int | None:
        j = text.find(self.end, pos)
        return None if j < 0 else j + len(self.end)

    def calls_in(self, text: str) -> list[EarlierCall]:
        return calls_in(text, self, self.end, ())
