"""The template-scaffold strict proposer: tool-call text the chat template fixes.

Once the model has written a tool-call opener (`<tool_call>` for the default model),
much of what follows is fixed by the model's own chat template: the rest of the
opener, the `"name"` key, the rest of a tool name once its prefix is unique among
the request's tools, the `"arguments"` key (and a sole required argument's key), and
after the arguments the closer. We find those spans by rendering the template with
probe calls (every tool, several argument values, a call alone and a call followed by
another) and comparing the token ids of the renderings: a span is fixed where every
rendering that agrees with what the model wrote so far continues with the same token
ids. Ids come from real renderings, so merged tokens (`" {"` opening the arguments and
their first key, `"}}"` closing them) are what the template produces, and a span stops
before any token a different value could merge with.

It fires only after the model itself emitted the opener at the start of a line,
outside fenced code and reasoning, and never inside an open call (an opener inside a
JSON string is text). Text is matched in bytes; a span is proposed only when the
model's text so far ends on a token boundary of the renderings it agrees with.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, Sequence

from ..methods.proposal import Proposal, RowView

log = logging.getLogger("jumpahead.engine")

# Probe values for an argument by JSON type: first characters that could merge with
# the text before them, so the fixed span stops before any such merge.
_PROBES: dict[str, list[Any]] = {
    "string": ["a", "Z", "0", "/", ".", "-", " ", "$", "_", "~", "(", "\u00e9", "\\x", '"x', "\nx", "src/main.py"],
    "number": [0, 1, -1, 2.5, 10],
    "integer": [0, 1, -1, 10],
    "boolean": [True, False],
    "array": [[], ["a"], [1], [{"a": "b"}]],
    "object": [{}, {"a": 1}, {"b": "c"}],
    "null": [None],
}
_OTHER_ARGS: list[dict] = [{}, {"a": 1}, {"zq": "x"}, {"Q": [1]}, {"_": {"b": True}}]


def _function(tool: dict) -> dict:
    return tool.get("function", tool) if isinstance(tool, dict) else {}


def _values(schema: Any) -> list[Any]:
    if not isinstance(schema, dict):
        schema = {}
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return list(schema["enum"])
    if "const" in schema:
        return [schema["const"]]
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if isinstance(kind, str) else list(_PROBES)
    out: list[Any] = []
    for k in kinds:
        out += _PROBES.get(k, [])
    return out or [v for vs in _PROBES.values() for v in vs]


def probe_arguments(fn: dict) -> list[dict]:
    """Argument objects to render for one tool."""
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    required = params.get("required") or []
    if len(required) == 1:
        key = required[0]
        return [{key: v} for v in _values(props.get(key))]
    if not props and not required and params.get("additionalProperties") is False:
        return [{}]
    if not props and not required:
        return [{}] + _OTHER_ARGS[1:]
    return list(_OTHER_ARGS)


def _slim(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _slim(v) for k, v in schema.items() if k != "description"}
    if isinstance(schema, list):
        return [_slim(v) for v in schema]
    return schema


def _lcp(seqs: Sequence[Sequence[int]]) -> list[int]:
    if not seqs:
        return []
    first = seqs[0]
    n = min(len(s) for s in seqs)
    i = 0
    while i < n and all(s[i] == first[i] for s in seqs):
        i += 1
    return list(first[:i])


def _lcp_bytes(items: Sequence[bytes]) -> bytes:
    if not items:
        return b""
    n = min(len(b) for b in items)
    i = 0
    while i < n and all(b[i] == items[0][i] for b in items):
        i += 1
    return items[0][:i]


@dataclass
class Rendering:
    """One probe call as the template renders it, from the opener on."""

    tool: str
    tokens: list[int]
    starts: dict[int, int]  # byte offset where a token starts -> its index
    text: bytes
    args_start: int  # byte offsets of the arguments JSON inside `text` (-1: not found)
    args_end: int
    multi: bool  # another call follows this one

    def after(self, offset: int) -> list[int] | None:
        """The tokens from byte `offset` on, or None when no token starts there."""
        k = self.starts.get(offset)
        return None if k is None else self.tokens[k:]


@dataclass
class ToolShape:
    """What is fixed for one tool: its header span (token LCP of its renderings) and
    the renderings that give the closer."""

    name: str
    header: Rendering  # a rendering whose tokens start with the header
    header_len: int  # tokens in the header
    header_bytes: int
    args_start: int
    renderings: list[Rendering]
    closer: bytes  # fixed text after the arguments JSON


class Scaffold:
    """The fixed spans of one tool set under one chat template."""

    def __init__(
        self, opener: bytes, end: bytes | None, shapes: list[ToolShape], token_bytes: Sequence[bytes], think: tuple[bytes, bytes] | None
    ) -> None:
        self.opener = opener
        self.end = end  # the closing marker (a lost call ends there)
        self.shapes = shapes
        self.token_bytes = token_bytes
        self.think = think

    def proposer(self, verify: bool = False) -> "ScaffoldProposer":
        return ScaffoldProposer(self, verify)


class ScaffoldBook:
    """Per tokenizer: analyses the chat template once per tool set (cached by hash)."""

    def __init__(self, tokenizer: Any, token_bytes: Sequence[bytes]) -> None:
        self.tokenizer = tokenizer
        self.hf = getattr(tokenizer, "_tokenizer", tokenizer)
        self.token_bytes = token_bytes
        self._cache: dict[str, Scaffold | None] = {}
        self._bases: dict[str, str] = {}
        self._lock = threading.Lock()
        calls = getattr(tokenizer, "has_tool_calling", False)
        self.opener: str | None = (getattr(tokenizer, "tool_call_start", None) if calls else None) or None
        self.closer: str | None = (getattr(tokenizer, "tool_call_end", None) if calls else None) or None
        think = None
        if getattr(tokenizer, "has_thinking", False) and tokenizer.think_start and tokenizer.think_end:
            think = (tokenizer.think_start.encode(), tokenizer.think_end.encode())
        self.think = think

    def for_tools(self, tools: list[dict]) -> Scaffold | None:
        key = hashlib.sha256(json.dumps(tools, sort_keys=True, default=str).encode()).hexdigest()
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        try:
            found = self._analyse(tools)
        except Exception as exc:  # a template we cannot probe: no scaffold, say why once
            log.info("template scaffold unavailable: %s: %s", type(exc).__name__, exc)
            found = None
        with self._lock:
            if len(self._cache) > 64:
                self._cache.clear()
            self._cache[key] = found
        return found

    # --- analysis -------------------------------------------------------------------
    def _render(self, tools: list[dict], calls: list[tuple[str, dict]]) -> str | None:
        """The assistant message's text for `calls`, from the first opener on."""
        user = {"role": "user", "content": "PING"}
        key = json.dumps(tools, sort_keys=True, default=str)
        base = self._bases.get(key)
        if base is None:
            base = self._bases[key] = self.tokenizer.apply_chat_template(
                [user], tools=tools, tokenize=False, add_generation_prompt=True
            )
        message = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                for i, (n, a) in enumerate(calls)
            ],
        }
        full = self.tokenizer.apply_chat_template([user, message], tools=tools, tokenize=False)
        if not full.startswith(base):
            return None
        text = full[len(base) :]
        i = text.find(self.opener or "")
        return None if i < 0 else text[i:]

    def _rendering(self, tools: list[dict], name: str, args: dict, follow: tuple[str, dict] | None) -> Rendering | None:
        calls = [(name, args)] + ([follow] if follow else [])
        text = self._render(tools, calls)
        if text is None:
            return None
        ids = self.hf.encode(text, add_special_tokens=False)
        data = text.encode()
        starts, pos = {}, 0
        for k, t in enumerate(ids):
            starts[pos] = k
            pos += len(self.token_bytes[t])
        if pos != len(data):
            raise ValueError("token bytes do not add up to the rendered text (prefix space or normalization)")
        starts[pos] = len(ids)
        name_at = data.find(name.encode())
        args_json = json.dumps(args, ensure_ascii=False).encode()
        a = data.find(args_json, name_at + len(name.encode())) if name_at >= 0 else -1
        return Rendering(name, ids, starts, data, a, a + len(args_json) if a >= 0 else -1, follow is not None)

    def _analyse(self, tools: list[dict]) -> Scaffold | None:
        if not self.opener or not tools:
            return None
        fns = [_function(t) for t in tools]
        fns = [f for f in fns if isinstance(f.get("name"), str) and f["name"]]
        if not fns:
            return None
        shapes = []
        self._bases = {}
        for fn in fns:
            name = fn["name"]
            # the tool alone, without descriptions: how a call renders does not depend on
            # them, and long ones (Claude Code's) make each probe rendering slow
            only = [{"type": "function", "function": {"name": name, "parameters": _slim(fn.get("parameters") or {})}}]
            probes = probe_arguments(fn)
            follow = (name, probes[0])
            rends = [self._rendering(only, name, a, None) for a in probes]
            rends += [self._rendering(only, name, a, follow) for a in probes[:3]]
            rends = [r for r in rends if r is not None]
            if not rends:
                return None
            header = _lcp([r.tokens for r in rends])
            hb = sum(len(self.token_bytes[t]) for t in header)
            starts = {r.args_start for r in rends}
            args_start = starts.pop() if len(starts) == 1 else -1
            closer = _lcp_bytes([r.text[r.args_end :] for r in rends if r.args_end >= 0]) if args_start >= 0 else b""
            shapes.append(ToolShape(name, rends[0], len(header), hb, args_start, rends, closer))
        end = self.closer.encode() if self.closer else None
        return Scaffold(self.opener.encode(), end, shapes, self.token_bytes, self.think)


# --- the proposer --------------------------------------------------------------------
SCAN, HEADER, BODY, CLOSER, LOST = "scan", "header", "body", "closer", "lost"


class _JsonEnd:
    """Finds where one JSON value ends, fed bytes incrementally."""

    def __init__(self) -> None:
        self.depth = 0
        self.started = False
        self.in_string = False
        self.escape = False
        self.failed = False

    def feed(self, data: bytes, base: int) -> int | None:
        """Offset (base + i + 1) just past the value's last byte, if it ends in `data`."""
        for i, c in enumerate(data):
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif c == 0x5C:  # backslash
                    self.escape = True
                elif c == 0x22:  # quote
                    self.in_string = False
                    if self.depth == 0:
                        return base + i + 1
                continue
            if not self.started:
                if c in b" \t\r\n":
                    continue
                self.started = True
                if c not in b'{["':
                    self.failed = True  # a bare scalar: its end is not decidable here
                    return None
            if c == 0x22:
                self.in_string = True
            elif c in b"{[":
                self.depth += 1
            elif c in b"}]":
                self.depth -= 1
                if self.depth == 0:
                    return base + i + 1
        return None


class ScaffoldProposer:
    """Per-row state over the output bytes; see the module docstring."""

    name = "strict"

    def __init__(self, scaffold: Scaffold, verify: bool = False) -> None:
        self.s = scaffold
        self.verify = verify
        self.out = bytearray()  # the row's output bytes
        self.ntok = 0  # output tokens seen
        self.state = SCAN
        self.scan_pos = 0  # next byte SCAN looks at
        self.line_start: int | None = 0  # a line starting here is not decided yet
        self.fence = False
        self.thinking: bool | None = None  # decided from the prompt on first use
        self.call = 0  # byte offset of the open call's opener
        self.shape: ToolShape | None = None
        self.json: _JsonEnd | None = None
        self.json_pos = 0
        self.args_end = 0

    # --- following the output ------------------------------------------------------
    def _update(self, view: RowView) -> None:
        if self.thinking is None:
            self.thinking = self._prompt_thinking(view)
        tokens = view.tokens
        for t in tokens[view.prompt_len + self.ntok :]:
            self.out += self.s.token_bytes[t] if 0 <= t < len(self.s.token_bytes) else b""
        self.ntok = len(tokens) - view.prompt_len
        for _ in range(4):  # a state change may leave bytes for the next state
            before = (self.state, self.scan_pos, self.json_pos)
            self._advance()
            if (self.state, self.scan_pos, self.json_pos) == before:
                break

    def _prompt_thinking(self, view: RowView) -> bool:
        think = self.s.think
        if think is None:
            return False
        # the prompt's own text is not at hand in bytes cheaply: its tail is enough
        tail = b"".join(self.s.token_bytes[t] for t in view.tokens[max(0, view.prompt_len - 64) : view.prompt_len])
        return tail.rfind(think[0]) > tail.rfind(think[1])

    def _advance(self) -> None:
        out = self.out
        if self.state == SCAN:
            self._scan()
        elif self.state == HEADER:
            self._header_state()
        elif self.state == BODY:
            assert self.json is not None
            end = self.json.feed(bytes(out[self.json_pos :]), self.json_pos)
            self.json_pos = len(out) if end is None else end
            if self.json.failed:
                self._lost()
            elif end is not None:
                self.args_end = end
                self.state = CLOSER
        elif self.state == CLOSER:
            assert self.shape is not None
            tail = bytes(out[self.args_end :])
            closer = self.shape.closer
            if not closer.startswith(tail) or len(tail) >= len(closer):
                common = len(_lcp_bytes([tail, closer]))
                self._back_to_scan(self.args_end + common)
        elif self.state == LOST:
            end = self.s.end
            if end is None:
                return
            at = out.find(end, self.scan_pos)
            if at >= 0:
                self._back_to_scan(at + len(end))
            else:
                self.scan_pos = max(self.scan_pos, len(out) - len(end))

    def _back_to_scan(self, pos: int) -> None:
        self.state = SCAN
        self.scan_pos = pos
        self.line_start = None
        self.shape = None
        self.json = None

    def _lost(self) -> None:
        self.state = LOST
        self.scan_pos = self.call
        self.json = None

    def _scan(self) -> None:
        out = self.out
        opener = self.s.opener
        think = self.s.think
        n = len(out)
        while self.scan_pos < n or self.line_start is not None:
            if self.thinking and think is not None:
                at = out.find(think[1], self.scan_pos)
                if at < 0:
                    self.scan_pos = max(self.scan_pos, n - len(think[1]) + 1)
                    self.line_start = None
                    return
                self.thinking = False
                self.scan_pos = at + len(think[1])
                self.line_start = self.scan_pos  # the answer starts here
                continue
            if self.line_start is not None:
                p = self.line_start
                line = bytes(out[p : p + max(len(opener), 3)])
                newline = line.find(b"\n")
                complete = newline >= 0 or len(line) >= max(len(opener), 3)
                head = line if newline < 0 else line[:newline]
                if head[:3] in (b"```", b"~~~") and len(head) >= 3:
                    self.fence = not self.fence
                elif not self.fence and head.startswith(opener) and len(head) >= len(opener):
                    self.call = p
                    self.state = HEADER
                    self.line_start = None
                    self.scan_pos = p + len(opener)
                    return
                elif not complete:
                    return  # wait for more of this line
                self.line_start = None
            if self.scan_pos >= n:
                return
            if think is not None and not self.fence:
                at = out.find(think[0], self.scan_pos)
                nl = out.find(b"\n", self.scan_pos)
                if at >= 0 and (nl < 0 or at < nl):
                    self.thinking = True
                    self.scan_pos = at + len(think[0])
                    continue
            nl = out.find(b"\n", self.scan_pos)
            if nl < 0:
                self.scan_pos = n
                return
            self.scan_pos = nl + 1
            self.line_start = nl + 1

    def _candidates(self, s: bytes) -> list[ToolShape]:
        out = []
        for shape in self.s.shapes:
            h = shape.header.text[: shape.header_bytes]
            if len(s) < shape.header_bytes and h.startswith(s):
                out.append(shape)
        return out

    def _header_state(self) -> None:
        s = bytes(self.out[self.call :])
        if self._candidates(s):
            return
        for shape in self.s.shapes:
            if shape.args_start < 0 or not s.startswith(shape.header.text[: shape.header_bytes]):
                continue
            lead = shape.header.text[: shape.args_start]  # up to the arguments JSON
            if len(s) < len(lead) and lead.startswith(s):
                return  # between the header and the arguments: wait
            if s.startswith(lead):
                self.shape = shape
                self.state = BODY
                self.json = _JsonEnd()
                self.json_pos = self.call + shape.args_start
                return
        self._lost()

    # --- proposing -----------------------------------------------------------------
    def propose(self, view: RowView, max_len: int) -> Proposal | None:
        self._update(view)
        if max_len <= 0:
            return None
        if self.state == HEADER:
            s = bytes(self.out[self.call :])
            conts = []
            for shape in self._candidates(s):
                k = shape.header.starts.get(len(s))
                if k is None or k >= shape.header_len:
                    return None
                conts.append(shape.header.tokens[k : shape.header_len])
            span = _lcp(conts)
        elif self.state == CLOSER:
            assert self.shape is not None
            done = len(self.out) - self.args_end
            conts, kinds = [], set()
            for r in self.shape.renderings:
                if r.args_end < 0:
                    continue
                rest = r.after(r.args_end + done)
                if rest is not None:
                    conts.append(rest)
                    kinds.add(r.multi)
            if kinds != {True, False}:
                return None  # cannot tell where the fixed closer ends
            span = _lcp(conts)
        else:
            return None
        span = span[:max_len]
        return Proposal(span, "strict", verify=self.verify) if span else None

    def feedback(self, proposal: Proposal, accepted: int) -> None:
        pass
