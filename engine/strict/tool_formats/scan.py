"""Incremental readers of a call's text for the boundary tracker (policies/tracker.py):
each `feed(text)` returns the `("tool_name", name)` and `("argument_key", key)`
crossings in the new text (and `("call_opened", "")` where a further call of the same
section begins), in O(the new text).

- `CallScanner`: a JSON object scan (the Hermes body `{"name": ..., "arguments": {...}}`,
  or, primed with `arguments_object()`, a bare arguments object);
- `JsonCallsScanner`: a JSON family's calls one after another: the head up to the name
  (the family's `name_re`), the opener up to `{`, the arguments object, then the next
  call's marker;
- `MarkerScanner`: the XML families: regular expressions for the name and each key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Container:
    kind: str  # "obj" | "arr"
    expect: str = "key"  # objects: "key" | "colon" | "value" | "comma"
    key: str | None = None  # the key whose value is being read
    arguments: bool = False  # the call's arguments object


@dataclass
class CallScanner:
    """Incremental JSON scan of one tool call's text: the name, the argument keys."""

    stack: list[_Container] = field(default_factory=list)
    in_string: bool = False
    escape: bool = False
    buf: list[str] = field(default_factory=list)
    done: bool = False

    def feed(self, text: str) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        for ch in text:
            if self.done:
                break
            if self.in_string:
                if self.escape:
                    self.escape = False
                    self.buf.append(ch)
                elif ch == "\\":
                    self.escape = True
                    self.buf.append(ch)
                elif ch == '"':
                    self.in_string = False
                    self._string_done("".join(self.buf), found)
                else:
                    self.buf.append(ch)
                continue
            top = self.stack[-1] if self.stack else None
            if ch == '"':
                self.in_string, self.buf = True, []
            elif ch in "{[":
                child = _Container("obj" if ch == "{" else "arr")
                if top is not None and top.kind == "obj":
                    child.arguments = ch == "{" and len(self.stack) == 1 and top.key in ("arguments", "parameters")
                    top.expect = "comma"
                self.stack.append(child)
            elif ch in "}]":
                if self.stack:
                    self.stack.pop()
                if not self.stack:
                    self.done = True
            elif top is not None and top.kind == "obj":
                if ch == ":" and top.expect == "colon":
                    top.expect = "value"
                    if top.arguments and top.key is not None:
                        found.append(("argument_key", top.key))
                elif ch == "," and top.expect in ("comma", "value"):
                    top.expect, top.key = "key", None
                elif top.expect == "value" and not ch.isspace():
                    top.expect = "comma"  # a number or literal value
        return found

    def _string_done(self, text: str, found: list[tuple[str, str]]) -> None:
        top = self.stack[-1] if self.stack else None
        if top is None or top.kind != "obj":
            return
        if top.expect == "key":
            top.key, top.expect = _unescape(text), "colon"
        elif top.expect == "value":
            if len(self.stack) == 1 and top.key == "name":
                found.append(("tool_name", _unescape(text)))
            top.expect = "comma"


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    import orjson

    try:
        return orjson.loads(f'"{text}"')
    except orjson.JSONDecodeError:
        return text



def arguments_object() -> CallScanner:
    """A scanner standing just inside an arguments object (its `{` consumed)."""
    return CallScanner(stack=[_Container("obj", arguments=True)])


class JsonCallsScanner:
    """The calls of a JSON family (`partial.JsonFormat`) one after another."""

    def __init__(self, fmt: Any) -> None:
        self.fmt = fmt
        self.buf = ""
        # head | opener | args | between (a section that opens with the call marker: before it)
        self.state = "between" if fmt.leading_split else "head"
        self.calls = 0  # calls begun
        self.inner: CallScanner | None = None

    def feed(self, text: str) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        fmt = self.fmt
        while text:
            if self.state == "args":
                inner = self.inner
                assert inner is not None
                for i, ch in enumerate(text):
                    found += inner.feed(ch)
                    if inner.done:
                        self.state, self.buf, text = "between", "", text[i + 1:]
                        break
                else:
                    text = ""
                continue
            self.buf += text
            text = ""
            if self.state == "between":
                j = self.buf.find(fmt.split_find)
                if j < 0:
                    self.buf = self.buf[-len(fmt.split_find):]
                    break
                text, self.buf, self.state = self.buf[j + len(fmt.split_find):], "", "head"
                if self.calls:
                    found.append(("call_opened", ""))
                continue
            if self.state == "head":
                s = self.buf.lstrip()
                if not s.startswith(fmt.head):
                    break
                m = fmt.name_re.match(s, len(fmt.head))
                if m is None or m.end() >= len(s):
                    break
                found.append(("tool_name", fmt.name_of(m)))
                self.calls += 1
                self.buf, self.state = s[m.end():], "opener"
            brace = self.buf.find("{")
            if brace < 0:
                break
            text, self.buf, self.state, self.inner = self.buf[brace + 1:], "", "args", arguments_object()
        return found


class MarkerScanner:
    """The name and each key of an XML family, found by regular expressions over the
    call's text (searched from a little before the new text)."""

    def __init__(self, name_re: re.Pattern[str], key_re: re.Pattern[str], reach: int = 256) -> None:
        self.name_re, self.key_re, self.reach = name_re, key_re, reach
        self.buf = ""
        self.named = False
        self.done_to = 0  # end of the last match reported

    def feed(self, text: str) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        base = len(self.buf)
        self.buf += text
        if not self.named:
            m = self.name_re.search(self.buf)
            if m is None:
                return found
            self.named, self.done_to = True, m.end()
            found.append(("tool_name", m.group(1).strip()))
        start = max(self.done_to, base - self.reach)
        for m in self.key_re.finditer(self.buf, start):
            if m.start() >= self.done_to:
                found.append(("argument_key", m.group(1).strip()))
                self.done_to = m.end()
        return found
