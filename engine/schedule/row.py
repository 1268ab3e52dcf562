"""A Row: one running request, its committed tokens, sampler, and output stream."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ..methods.proposal import Constraint, Proposal, ProposalStats, Proposer, RowView
from ..kv.row_cache import RowKVCache
from ..sampler import RowSampler
from ..types import FinishReason, GenerationRequest, Timings, TokenChunk, TokenKind
from .width_policy import Acceptance


@dataclass
class StopText:
    """Streams detokenized text, holding back what could still become a stop string."""

    stops: list[str]
    sent: int = 0  # characters of the text already emitted
    hit: bool = False

    def take(self, text: str, final: bool) -> str:
        """The newly safe part of `text` (the whole text so far)."""
        if self.hit:
            return ""
        if self.stops:
            start = max(0, self.sent - max(len(s) for s in self.stops) + 1)
            found = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
            if found:
                self.hit = True
                cut = min(found)
                out = text[self.sent : cut] if cut > self.sent else ""
                self.sent = max(self.sent, cut)
                return out
            if not final:
                hold = max((self._held(text, s) for s in self.stops), default=0)
                end = max(self.sent, len(text) - hold)
                out, self.sent = text[self.sent : end], end
                return out
        out, self.sent = text[self.sent :], len(text)
        return out

    @staticmethod
    def _held(text: str, stop: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of `stop`."""
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:n]):
                return n
        return 0


@dataclass
class Row:
    req: GenerationRequest
    sampler: RowSampler
    emit: Callable[[TokenChunk], None]
    detokenizer: object
    stop_ids: set[int]
    max_tokens: int
    prefilled: int = 0  # prompt tokens already in the cache
    prefill_cache: RowKVCache | None = None  # private cache until the row joins the group
    cached_tokens: int = 0  # prompt tokens restored from the prefix cache
    pending: int | None = None  # next input token: committed, not yet in the cache
    output: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    cancelled: bool = False
    timings: Timings = field(default_factory=Timings)
    submitted_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    last_token_at: float | None = None
    proposers: list[Proposer] = field(default_factory=list)
    # Constrained decoding (engine/methods/proposal.py Constraint): masks logits before the
    # sampler picks, and follows every committed token (sampled or asserted).
    constraint: Constraint | None = None
    stats: ProposalStats = field(default_factory=ProposalStats)
    # The proposer whose asserted run was cut at the round's cap: asked first next
    # round, so a verifying proposer cannot interrupt the run between its slices.
    cut_by: Proposer | None = None
    # The target's hidden state that chose `pending` (RowView.hidden; engine/methods/drafter.py)
    hidden: object = None
    # per-proposer acceptance rates that size this row's verified proposals
    acceptance: dict[str, Acceptance] = field(default_factory=dict)
    # engine/schedule/forecast.py: the output length at which the message a running copy comes
    # from ends, and the prompt's end-of-message positions (found once)
    copy_end: int | None = None
    prompt_stops: list[int] | None = None
    # After a failed batched round (Scheduler._requeue): the row's cache is rebuilt from
    # its prompt and committed output; `pending` stays its next input.
    resume: bool = False

    def __post_init__(self) -> None:
        self.stop_text = StopText(list(self.req.stop))

    @property
    def prompt(self) -> list[int]:
        return self.req.prompt

    @property
    def position(self) -> int:
        """Absolute position of the next token to be chosen."""
        return len(self.req.prompt) + len(self.output)

    def view(self) -> RowView:
        return RowView(self.req.prompt + self.output, len(self.req.prompt), self.max_tokens - len(self.output),
                       self.hidden)

    def commit(self, tokens: list[int], kinds: list[TokenKind], accepted: int = 0,
               sources: list[int | None] | None = None, logprobs: list | None = None, proposed: int = 0,
               method: str | None = None, totals: ProposalStats | None = None) -> None:
        """Append chosen tokens, apply EOS/stop/length, and emit one chunk.

        `accepted`: how many leading tokens are verified proposal tokens (already
        counted in stats.accepted by the scheduler). `sources`: per token, the absolute
        position it was copied from (None: not a copy), for trace provenance.
        `logprobs`: per token, its TokenLogprob or None (rows that asked for them).
        `proposed`: the proposal tokens this round carried for the row (TokenChunk.proposed).
        `method`: the name of the verified method that proposed them (None: none, or
        asserted), noted in the per-method telemetry before a final chunk reports it, in
        the row's stats and in `totals` (the engine's, for /metrics) alike: a client that
        reads /metrics after its answer sees this round counted."""
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
        self.last_token_at = now
        taken: list[int] = []
        taken_kinds: list[TokenKind] = []
        for tok, kind in zip(tokens, kinds):
            taken.append(tok)
            taken_kinds.append(kind)
            self.output.append(tok)
            self.stats.by_kind[kind] = self.stats.by_kind.get(kind, 0) + 1
            if tok in self.stop_ids:
                self.finish_reason = "stop"
                break
            self.detokenizer.add_token(tok)
            if self.req.stop:
                # A stop string can end inside this token: check before taking more.
                probe = StopText(self.stop_text.stops, self.stop_text.sent)
                probe.take(self.detokenizer.text, final=False)
                if probe.hit:
                    self.finish_reason = "stop"
                    break
            if len(self.output) >= self.max_tokens:
                self.finish_reason = "length"
                break
        self.pending = None if self.finish_reason else taken[-1]
        # Proposal tokens accepted after EOS or a stop string were never emitted: count
        # them as rejected (before the final chunk reports usage.fill).
        cut = max(0, accepted - len(taken))
        self.stats.accepted -= cut
        self.stats.rejected += cut
        if method is not None:  # per method, only the accepted tokens that were emitted
            self.stats.note_verified(method, proposed, accepted - cut)
            if totals is not None:
                totals.note_verified(method, proposed, accepted - cut)
        self._emit(taken, taken_kinds, sources=None if sources is None else list(sources[: len(taken)]),
                   logprobs=None if logprobs is None else list(logprobs[: len(taken)]), proposed=proposed)

    def finish(self, reason: FinishReason, error: str | None = None) -> None:
        """End the row from outside (cancel, error) and emit the terminal chunk."""
        if self.finish_reason is not None and reason != "error":
            return
        self.finish_reason = reason
        self._emit([], [], error=error)

    def _emit(self, tokens: list[int], kinds: list[TokenKind], error: str | None = None,
              sources: list[int | None] | None = None, logprobs: list | None = None, proposed: int = 0) -> None:
        final = self.finish_reason is not None
        if final and not self.stop_text.hit:
            self.detokenizer.finalize()  # flush bytes held for an incomplete character
        text = self.stop_text.take(self.detokenizer.text, final=final)
        chunk = TokenChunk(tokens=tokens, kinds=kinds, text=text, sources=sources, logprobs=logprobs,
                           proposed=proposed)
        if final or len(self.output) == len(tokens):  # the first chunk and the last
            chunk.cached_tokens = self.cached_tokens
        if final:
            t = self.timings
            if self.first_token_at is not None and self.last_token_at is not None:
                t.decode_s = self.last_token_at - self.first_token_at
            chunk.finish_reason = self.finish_reason
            chunk.error = error
            chunk.prompt_tokens = len(self.req.prompt)
            chunk.completion_tokens = len(self.output)
            chunk.timings = t
            chunk.fill = self.stats.as_dict()
        self.emit(chunk)
