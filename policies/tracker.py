"""Follow a row's output token by token and say which parser boundaries each crosses.

The text-level state (reasoning / content / tool call) comes from the core's own
OutputParser (core/output_parser.py), so boundaries fall exactly where the answer's
parse puts them: `reasoning_closed` when reasoning ends, `tool_call_opened` when a
tool-call start marker is complete, `block_closed` when a fenced block of the visible
text closes (its closing fence's characters are complete, read by
jump_sources.FenceScanner over the parser's content; never inside reasoning or a tool
call, and not when the same token opens a call). Inside a call the family's scanner
(engine/strict/tool_formats/, the tokenizer's family) adds `tool_name` (the name is complete)
and `argument_key` (each top-level key of the arguments: `"key":` in the JSON families,
`<parameter=key>` / `<arg_key>key</arg_key>` in the XML ones); for Hermes-JSON calls (and
a tokenizer of no known family) a small incremental JSON scanner. Where a family's calls
run on in one section without an end marker (harmony, Mistral, Llama 3 JSON), each
further call crosses `tool_call_opened` again.

Work per token is O(the token's text): one detokenizer step, one parser feed, the fence
scanner over the new visible characters, and the call scanner over the new characters
of the call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jumpahead.engine.strict.tool_formats.scan import CallScanner
from jumpahead.core.output_parser import OutputParser
from jumpahead.core.turn import ContentDelta, ReasoningDelta, ToolCallDelta, ToolCallStart

from .jump_sources import FenceScanner

REASONING, CONTENT, TOOL = "reasoning", "content", "tool"


@dataclass
class Crossing:
    """One boundary the output crossed, at output token `index`."""

    boundary: str
    index: int
    tool_name: str | None = None
    argument_key: str | None = None


class OutputTracker:
    """The row's decoded output, its parse, and the boundaries crossed by each token."""

    def __init__(self, tokenizer: Any, parser: OutputParser, family: Any = "detect") -> None:
        if family == "detect":
            from jumpahead.engine.strict.tool_formats import detect_family

            family = detect_family(tokenizer)
        self.family = None if family is None or family.name == "hermes" else family
        self.detokenizer = tokenizer.detokenizer
        self.skip = set(getattr(tokenizer, "eos_token_ids", ()) or ())
        self.parser = parser
        self.tokens: list[int] = []
        self.ends: list[int] = []  # per output token: length of `text` once it is in
        self.reasoning = ""
        self.content = ""
        self.calls_done = 0
        self.tool_name: str | None = None
        self.argument_key: str | None = None
        self._scanner: Any = None  # CallScanner, or the family's
        self._scanned = 0  # characters of the open call already scanned
        self._fences = FenceScanner()  # the visible text's fenced blocks (block_closed)
        if parser.state == TOOL:  # the prompt's assistant prefix opened a call
            self._open_call()

    @property
    def text(self) -> str:
        return self.detokenizer.text

    @property
    def call_text(self) -> str:
        return self.parser.call_text

    def _open_call(self) -> None:
        self._scanner, self._scanned = (CallScanner() if self.family is None else self.family.scanner()), 0
        self.tool_name = self.argument_key = None

    def add(self, token: int) -> list[Crossing]:
        """Take one output token; the boundaries it crossed, in order."""
        index = len(self.tokens)
        self.tokens.append(token)
        before = len(self.detokenizer.text)
        if token not in self.skip:
            self.detokenizer.add_token(token)
        text = self.detokenizer.text
        self.ends.append(len(text))
        if len(text) == before:
            return []
        return self._feed(text[before:], index)

    def _feed(self, delta: str, index: int) -> list[Crossing]:
        parser = self.parser
        was, calls = parser.state, len(parser.tool_calls) + len(parser.malformed)
        crossed: list[Crossing] = []
        fences = 0
        for event in parser.feed(delta):
            if isinstance(event, ReasoningDelta):
                self.reasoning += event.text
                self._fences.reset()  # the visible text after reasoning starts afresh
            elif isinstance(event, ContentDelta):
                self.content += event.text
                fences += self._fences.feed(event.text)
            elif isinstance(event, ToolCallDelta):
                self.calls_done += 1
                self._fences.reset()
            elif isinstance(event, ToolCallStart):
                self._fences.reset()
        now = parser.state
        if was == REASONING and now != REASONING:
            crossed.append(Crossing("reasoning_closed", index))
        if fences and now == CONTENT:
            crossed.append(Crossing("block_closed", index))
        closed = len(parser.tool_calls) + len(parser.malformed) != calls
        if now == TOOL and (was != TOOL or closed):
            self._open_call()
            crossed.append(Crossing("tool_call_opened", index))
        if now == TOOL and self._scanner is not None:
            body = parser.call_text
            for kind, value in self._scanner.feed(body[self._scanned:]):
                if kind == "call_opened":  # a further call of the same section
                    self.tool_name = self.argument_key = None
                    crossed.append(Crossing("tool_call_opened", index))
                elif kind == "tool_name":
                    self.tool_name = value
                    crossed.append(Crossing("tool_name", index, tool_name=value))
                else:
                    self.argument_key = value
                    crossed.append(Crossing("argument_key", index, tool_name=self.tool_name, argument_key=value))
            self._scanned = len(body)
        elif now != TOOL:
            self._scanner = None
        return crossed

    def char_span_tokens(self, start: int, end: int) -> tuple[int, int] | None:
        """The output tokens [a, b) that cover characters [start, end) of `text`."""
        return span_tokens(self.ends, start, end)


def span_tokens(ends: list[int], start: int, end: int) -> tuple[int, int] | None:
    """Tokens [a, b) covering characters [start, end), given each token's text end."""
    import bisect

    if not ends or start < 0 or end <= start or end > ends[-1]:
        return None
    a = bisect.bisect_right(ends, start)  # first token that ends after `start`
    b = bisect.bisect_left(ends, end) + 1  # first token whose end reaches `end`
    return (a, min(b, len(ends)))


def text_offsets(tokenizer: Any, tokens: list[int]) -> tuple[str, list[int]]:
    """The tokens' text (streaming detokenizer) and each token's text end in it."""
    detok = tokenizer.detokenizer
    ends = []
    for tok in tokens:
        detok.add_token(tok)
        ends.append(len(detok.text))
    detok.finalize()
    if ends:
        ends[-1] = len(detok.text)
    return detok.text, ends
