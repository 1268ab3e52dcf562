"""Logprobs on the wire: the engine's per-token TokenLogprobs as OpenAI entries.

Entries have OpenAI's shape, `{"token", "logprob", "bytes", "top_logprobs": [{"token",
"logprob", "bytes"}]}`, in chat completions (`choices[].logprobs.content`) and in
Responses (`output_text.logprobs`, `response.output_text.delta` events). What the
numbers are (the model's raw distribution) is documented in engine/logprobs.py.

Only content tokens are reported, as OpenAI does: `logprobs.content` covers the message
content; reasoning and tool-call tokens (their markers and arguments) have no entry
(OpenAI returns none for either). The parser works on text, so tokens are attributed
per engine chunk: a chunk whose text leaves the parser in content (or still at the
start) and produced no reasoning or tool event is content; a chunk that crosses into or
out of reasoning or a tool call is not, whole (a multi-token verified copy straddling
such a boundary loses its content entries). Content held back by the parser (a partial
marker, trailing whitespace) keeps its entries pending until the content is shown; held
text that turns out to be markup or layout drops them. The end-of-turn token is not
content. An asserted token (unchecked strict fill, a jump) was never scored by the
model: its entry has `"logprob": null` and no alternatives, so the tokens still spell
the content.
"""

from __future__ import annotations

from typing import Any

from jumpahead.engine.interface import Engine
from jumpahead.engine.logprobs import MAX_TOP_LOGPROBS, TokenLogprob

from .errors import invalid_request
from .fields import integer
from .output_parser import CONTENT, START
from .turn import ContentDelta, OutputEvent


def top_logprobs(body: dict[str, Any]) -> int | None:
    """The `top_logprobs` field (0..20), or None when absent."""
    top = integer(body, "top_logprobs")
    if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
        raise invalid_request(f"top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {top}",
                              param="top_logprobs")
    return top


class TokenText:
    """Token ids as the `token` string and `bytes` of a logprob entry."""

    def __init__(self, engine: Engine) -> None:
        self._tokenizer = engine.tokenizer
        self._table: list[bytes] | None = None
        table = getattr(engine, "token_bytes", None)
        if callable(table):
            try:
                self._table = table()
            except Exception:  # no byte table for this tokenizer: decode ids one by one
                self._table = None

    def bytes_of(self, token: int) -> bytes:
        if self._table is not None and 0 <= token < len(self._table):
            return self._table[token]
        return self._tokenizer.decode([token]).encode("utf-8")

    def entry(self, token: int, logprob: float | None) -> dict[str, Any]:
        raw = self.bytes_of(token)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:  # part of a character: OpenAI writes the bytes out
            text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
        return {"token": text, "logprob": logprob, "bytes": list(raw)}

    def wire(self, token: int, lp: TokenLogprob | None) -> dict[str, Any]:
        if lp is None:  # asserted: never scored (see the module doc)
            return {**self.entry(token, None), "top_logprobs": []}
        return {**self.entry(token, lp.logprob), "top_logprobs": [self.entry(t, v) for t, v in lp.top]}


class ContentLogprobs:
    """Attaches a row's token logprobs to the ContentDelta events they produced."""

    def __init__(self, text: TokenText, end_ids: set[int]) -> None:
        self.text = text
        self.end_ids = end_ids  # end-of-turn tokens: not content
        self.pending: list[dict[str, Any]] = []

    def chunk(self, tokens: list[int], logprobs: list | None, before: str, after: str,
              events: list[OutputEvent]) -> None:
        """One engine chunk, the parser state around feeding its text, and the events."""
        content = before in (START, CONTENT) and after in (START, CONTENT) and all(
            isinstance(e, ContentDelta) for e in events)
        if content and logprobs is not None:
            self.pending += [self.text.wire(t, lp) for t, lp in zip(tokens, logprobs) if t not in self.end_ids]
        self.attach(events)
        if not content:
            self.pending = []  # held text that became markup, and this chunk's tokens

    def attach(self, events: list[OutputEvent]) -> None:
        """Give pending entries to the first content delta; every content delta gets a list."""
        for event in events:
            if isinstance(event, ContentDelta):
                event.logprobs, self.pending = self.pending, []
