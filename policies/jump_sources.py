"""Where a jump's content comes from: literal blocks stated in text, earlier tool calls,
file contents shown in tool results.

- `fenced_blocks` / `quoted_blocks`: content a text states literally (a fenced code
  block; a quoted block after a label such as `content:`), each with its *lead* (the
  text just before it, where the file it is meant for is named).
- `FenceScanner`: where a growing text's fenced blocks close (the boundary tracker's
  `block_closed`, policies/tracker.py); `lead_path`: the file a block's lead names.
- `blocks_for_path`: the blocks whose lead names a path; `Found` says which one, or why
  none can be trusted (two different blocks, a block never closed).
- `earlier_calls`: tool calls already written in a text (`<tool_call>{json}</tool_call>`).
- `Haystack`: a text to find content in, verbatim or modulo the line-number prefixes
  that file-read tools put in front of each line (`     3→` Claude Code, `     3\\t`
  cat -n); `longest_from` walks a value and finds its longest stretch present there.
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass

from jumpahead.engine.strict.tool_formats import FAMILIES
from jumpahead.engine.strict.tool_formats.base import EarlierCall

LEAD_CHARS = 300  # how far before a block its file may be named

_FENCE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})([^\n`]*)$", re.M)
# after a closing fence: nothing, or the chat template's end of message / tool result
_CLOSING = re.compile(r"[ \t]*(?:$|<\|[^|\n]*\|>|</\w+>)")
_LABEL = re.compile(r"(?i)\b(?:content|contents|file_text|file text|new content|body)\s*[:=]\s*(\"\"\"|'''|\"|`(?!``))")
_PATH = re.compile(r"(?<![\w./~-])(?:\.{0,2}/)?(?:[\w.~+-]+/)*[\w~+-][\w.+-]*(?![\w/~+-])")
_EXTENSIONS = frozenset(
    "py pyi js mjs cjs ts tsx jsx json toml yaml yml md rst txt cfg ini c h cc cpp hpp rs go java kt rb php "
    "sh bash zsh html htm css scss sql xml csv lock env swift m mm lua pl r jl ex exs erl hs ml scala dart vue "
    "svelte gradle make mk cmake dockerfile gitignore ipynb tex".split()
)
_LINENO = re.compile(r"^[ \t]*\d+(?:→|\t)", re.M)


@dataclass(frozen=True)
class Block:
    text: str  # the content as stated
    start: int  # its span in the scanned text
    end: int
    lead: str  # text before it (and a fence's info string): where its file is named
    closed: bool = True
    kind: str = "fence"  # fence | quote


@dataclass(frozen=True)
class Found:
    """The outcome of a search: a block, or the reason none can be used."""

    block: Block | None = None
    reason: str = ""  # "" (found), "none", "ambiguous", "unclosed"


def fenced_blocks(text: str) -> list[Block]:
    """Fenced code blocks; the content keeps its final newline (the file's last line
    ends with one). A fence never closed yields a block with closed=False."""
    blocks: list[Block] = []
    opened: re.Match[str] | None = None
    prev_end = 0
    for m in _FENCE.finditer(text):
        if opened is None:
            opened = m
            continue
        fence, info = m.group(1), m.group(2)
        if fence[0] != opened.group(1)[0] or len(fence) < len(opened.group(1)) or not _CLOSING.match(info):
            continue
        start = min(opened.end() + 1, m.start())
        lead = text[max(prev_end, opened.start() - LEAD_CHARS) : opened.start()] + " " + opened.group(2)
        blocks.append(Block(text[start : m.start()], start, m.start(), lead))
        prev_end, opened = m.end(), None
    if opened is not None:
        start = min(opened.end() + 1, len(text))
        lead = text[max(prev_end, opened.start() - LEAD_CHARS) : opened.start()] + " " + opened.group(2)
        blocks.append(Block(text[start:], start, len(text), lead, closed=False))
    return blocks


def quoted_blocks(text: str) -> list[Block]:
    """Quoted content after a label (`content: \"\"\"...\"\"\"`, `file_text = "..."`).
    A quote never closed, or a one-character quote holding a backslash (escaped or
    literal? undecidable), yields closed=False."""
    blocks: list[Block] = []
    prev_end = 0
    for m in _LABEL.finditer(text):
        if m.start() < prev_end:
            continue
        quote = m.group(1)
        start = m.end()
        close = text.find(quote, start)
        lead = text[max(prev_end, m.start() - LEAD_CHARS) : m.start()]
        if close < 0:
            blocks.append(Block(text[start:], start, len(text), lead, closed=False, kind="quote"))
            break
        body = text[start:close]
        closed = not (len(quote) == 1 and "\\" in body)
        if len(quote) == 3 and body.startswith("\n"):
            start, body = start + 1, body[1:]
        blocks.append(Block(body, start, close, lead, closed=closed, kind="quote"))
        prev_end = close + len(quote)
    return blocks


def closes_fence(opened: str, line: str) -> bool:
    """Whether `line` (one line, no newline) closes a block opened by the fence
    `opened` (the rules of `fenced_blocks`: the same character, at least as long, and
    nothing after it but spaces or a template marker)."""
    m = _FENCE.match(line)
    if m is None:
        return False
    fence = m.group(1)
    return fence[0] == opened[0] and len(fence) >= len(opened) and _CLOSING.match(m.group(2)) is not None


class FenceScanner:
    """Reads a text as it grows and says where its fenced blocks close, by the rules of
    `fenced_blocks`: `feed(text)` returns how many blocks closed in `text`. A closing
    fence counts as soon as its line reads as one (its fence characters complete), not
    at the newline after it: the model may go straight on to a tool call. A line that
    read as a closing fence and then goes on (```` ```python ````) leaves the block open.
    Work is O(the text fed): lines are kept only as long as a fence line can be."""

    MAX_LINE = 256

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.opened: str | None = None  # the open block's fence
        self.line = ""  # the current line so far (capped)
        self.counted = False  # this line was counted as a closing fence

    def feed(self, text: str) -> int:
        closed = 0
        parts = text.split("\n")
        for i, part in enumerate(parts):
            if len(self.line) < self.MAX_LINE:
                self.line += part[: self.MAX_LINE - len(self.line)]
            if self.opened is not None and not self.counted and closes_fence(self.opened, self.line):
                closed += 1
                self.counted = True
            if i < len(parts) - 1:
                self._end_line()
        return closed

    def _end_line(self) -> None:
        if self.opened is None:
            m = _FENCE.match(self.line)
            self.opened = m.group(1) if m is not None else None
        elif closes_fence(self.opened, self.line):
            self.opened = None
        self.line, self.counted = "", False


def names_path(token: str, path: str) -> bool:
    """Whether a path-like token names `path` (same path, or one is the other's tail)."""
    a, b = token.removeprefix("./"), path.removeprefix("./")
    return bool(a) and (a == b or b.endswith("/" + a) or a.endswith("/" + b))


def _pathish(token: str) -> bool:
    if "/" in token.strip("./"):
        return True
    ext = token.rsplit(".", 1)[-1].lower() if "." in token.strip(".") else ""
    return ext in _EXTENSIONS


def lead_names(lead: str, path: str) -> bool:
    """The last file named in `lead` is `path` (so a block after "a.py imports b.py:"
    is for b.py, not a.py)."""
    last = None
    for m in _PATH.finditer(lead):
        token = m.group(0).rstrip(".")
        if names_path(token, path) or _pathish(token):
            last = token
    return last is not None and names_path(last, path)


def lead_path(lead: str) -> str | None:
    """The last file a lead names (the one its block is for), None where it names none."""
    last = None
    for m in _PATH.finditer(lead):
        token = m.group(0).rstrip(".")
        if _pathish(token):
            last = token
    return last


def paths_in(text: str) -> list[str]:
    """The distinct file paths a text names, in order of first mention."""
    seen: dict[str, None] = {}
    for m in _PATH.finditer(text):
        token = m.group(0).rstrip(".")
        if _pathish(token):
            seen.setdefault(token, None)
    return list(seen)


def blocks_in(text: str) -> list[Block]:
    """Fenced and quoted blocks of a text, in order (quotes inside fences dropped)."""
    fences = fenced_blocks(text)
    quotes = [q for q in quoted_blocks(text) if not any(f.start <= q.start < f.end for f in fences)]
    return sorted(fences + quotes, key=lambda b: b.start)


def blocks_for_path(blocks: list[Block], path: str) -> Found:
    """The one block stated for `path`: none named for it -> "none"; one never closed ->
    "unclosed"; two with different content -> "ambiguous" (the last is kept when all
    agree: the latest statement)."""
    mine = [b for b in blocks if lead_names(b.lead, path)]
    if not mine:
        return Found(None, "none")
    if any(not b.closed for b in mine):
        return Found(None, "unclosed")
    if len({b.text for b in mine}) > 1:
        return Found(None, "ambiguous")
    return Found(mine[-1])


def earlier_calls(text: str, start: str = "<tool_call>", end: str = "</tool_call>") -> list[EarlierCall]:
    """The complete calls written in `text` in the `<tool_call>{json}</tool_call>` form
    (the Hermes format's reader: engine/strict/tool_formats/hermes.py)."""
    return FAMILIES["hermes"].format.calls_in(text, start, end)


class Haystack:
    """A text to find content in: verbatim, or modulo per-line number prefixes."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._stripped: tuple[str, list[int], list[int]] | None = None
        self._numbered: bool | None = None

    def _strip(self) -> tuple[str, list[int], list[int]]:
        """The text without line-number prefixes, and a map back: for each kept piece,
        its start in the stripped and in the original text."""
        if self._stripped is None:
            parts: list[str] = []
            s_starts: list[int] = []
            o_starts: list[int] = []
            pos = size = 0
            for m in _LINENO.finditer(self.text):
                if m.start() > pos:
                    s_starts.append(size)
                    o_starts.append(pos)
                    parts.append(self.text[pos : m.start()])
                    size += m.start() - pos
                pos = m.end()
            s_starts.append(size)
            o_starts.append(pos)
            parts.append(self.text[pos:])
            self._stripped = ("".join(parts), s_starts, o_starts)
        return self._stripped

    def _to_original(self, i: int) -> int:
        _, s_starts, o_starts = self._strip()
        k = bisect.bisect_right(s_starts, i) - 1
        return o_starts[k] + (i - s_starts[k])

    def has_line_numbers(self) -> bool:
        if self._numbered is None:
            self._numbered = _LINENO.search(self.text) is not None
        return self._numbered

    def find(self, needle: str, last: bool = True) -> tuple[int, int] | None:
        """The span of `needle` in the text (the last occurrence: the latest read), or
        of its stripped form's occurrence mapped back; None if absent."""
        if not needle:
            return None
        i = self.text.rfind(needle) if last else self.text.find(needle)
        if i >= 0:
            return i, i + len(needle)
        if not self.has_line_numbers():
            return None
        stripped = self._strip()[0]
        i = stripped.rfind(needle) if last else stripped.find(needle)
        if i < 0:
            return None
        return self._to_original(i), self._to_original(i + len(needle) - 1) + 1

    def locate(self, piece: str) -> tuple[int, int] | None:
        """The span of `piece` as found by `longest_from`: verbatim, JSON-escaped, or
        modulo line numbers."""
        span = self.find(piece)
        if span is None:
            escaped = json.dumps(piece, ensure_ascii=False)[1:-1]
            i = self.text.rfind(escaped) if escaped != piece else -1
            span = (i, i + len(escaped)) if i >= 0 else None
        return span

    def contains(self, needle: str) -> bool:
        return self.find(needle) is not None

    def longest_from(self, value: str, i: int) -> int:
        """The largest j with value[i:j] present (verbatim, JSON-escaped as earlier
        calls show it, or modulo line numbers); i when even value[i] is absent."""
        def present(j: int) -> bool:
            piece = value[i:j]
            return (piece in self.text or json.dumps(piece, ensure_ascii=False)[1:-1] in self.text
                    or (self.has_line_numbers() and piece in self._strip()[0]))

        lo, hi = i, len(value)  # present(lo) holds (empty); find the largest present j
        if hi > lo and present(hi):
            return hi
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if present(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo
