"""The engine proposer that runs policies' boundary hooks for one row.

The scheduler asks it between rounds (engine/methods/proposal.py Proposer). It reads the row's
new output tokens into an OutputTracker (policies/tracker.py), and for each parser
boundary they crossed asks the request's policies, in order, for an Intervention; the
first one wins and becomes a Proposal:

- asserted (default): kind "jump" (or the intervention's own asserted kind), appended
  unsampled; a run longer than the round's cap continues in the next rounds while the
  output still matches it (the scheduler does not sample between the slices);
- verified: the same tokens proposed for verification (kind "jump" with
  `Proposal.verify`, or a verified kind such as "echo"); what the model accepts is
  kept, the rest is dropped at the first disagreement.

A boundary fires once, when the proposer is next asked after the token that crossed
it (strict fill may propose first for a few rounds), with the output as it is then.
Boundaries crossed by an intervention's own tokens do not fire. Boundaries the row
crosses after its last round (its final tokens) fire at the end of the turn for
observation only (`finish`). The proposer never raises into the engine.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jumpahead.engine.methods.proposal import ASSERTED_KINDS, VERIFIED_KINDS, Proposal, RowView

from .api import BoundaryEvent, Intervention
from .tracker import Crossing, OutputTracker, span_tokens, text_offsets

if TYPE_CHECKING:
    from .runtime import PolicyRun

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    """An intervention being emitted: its tokens and how far the output has taken them."""

    record: dict[str, Any]
    tokens: list[int]
    kind: str
    verify: bool
    start: int  # output index of its first token
    source: int | None  # absolute position its first token was copied from
    cursor: int = 0  # tokens the output has taken


class BoundaryProposer:
    name = "policy"

    def __init__(self, run: "PolicyRun", tracker: OutputTracker, tokenizer: Any, prompt: list[int]) -> None:
        self.run = run
        self.tracker = tracker
        self.tokenizer = tokenizer
        self.prompt = prompt
        self.pending: _Pending | None = None
        self.own: set[int] = set()  # output indices supplied by interventions
        self.watch_s = 0.0  # tracking time (the runtime's own part of H)
        self._context_text: str | None = None
        self._context_ends: list[int] | None = None
        self._broken = False

    # --- engine side ------------------------------------------------------------------
    def propose(self, view: RowView, max_len: int) -> Proposal | None:
        if self._broken:
            return None
        try:
            return self._propose(view)
        except Exception:  # never fail the engine round over a policy
            log.exception("policy boundary proposer failed; boundary hooks are off for this request")
            self._broken = True
            self.run.note_error("runtime", "boundary", "the boundary proposer failed (see the server log)")
            return None

    def feedback(self, proposal: Proposal, accepted: int) -> None:
        pass  # propose() reads what the row took from its tokens

    def _propose(self, view: RowView) -> Proposal | None:
        t0 = time.perf_counter()
        crossed = self._take(view.tokens[view.prompt_len:])
        self.watch_s += time.perf_counter() - t0
        if self.pending is not None:
            return self._rest()
        for crossing in crossed:
            found = self.run.fire(self._event(crossing, view.prompt_len, view.budget))
            if found is not None:
                name, intervention, decide_s = found
                self.pending = self._pending(name, intervention, crossing, decide_s, len(self.tracker.tokens))
                if self.pending is not None:
                    return self._rest()
        return None

    def _take(self, out: Any) -> list[Crossing]:
        """Feed new output tokens; boundaries crossed outside interventions' own tokens."""
        crossed: list[Crossing] = []
        for i in range(len(self.tracker.tokens), len(out)):
            tok = out[i]
            p = self.pending
            if p is not None:
                if i >= p.start and p.cursor < len(p.tokens) and tok == p.tokens[p.cursor]:
                    p.cursor += 1
                    p.record["emitted"] += 1
                    self.own.add(i)
                else:
                    self.pending = None  # the row went elsewhere (rejected, or another proposer)
                if self.pending is not None and p.cursor >= len(p.tokens):
                    self.pending = None
            for c in self.tracker.add(tok):
                if i not in self.own:
                    crossed.append(c)
        return crossed

    def _rest(self) -> Proposal | None:
        p = self.pending
        assert p is not None
        rest = p.tokens[p.cursor:]
        if not rest:
            self.pending = None
            return None
        # The whole rest: the scheduler cuts it to the round's cap and marks it cut, so
        # the row does not sample between slices.
        src = None if p.source is None else (p.source + p.cursor, p.source + len(p.tokens))
        return Proposal(list(rest), p.kind, source=src, verify=p.verify)  # type: ignore[arg-type]

    # --- events and interventions -------------------------------------------------------
    def _event(self, crossing: Crossing, prompt_len: int, budget: int) -> BoundaryEvent:
        t = self.tracker
        return BoundaryEvent(
            boundary=crossing.boundary,  # type: ignore[arg-type]
            output_text=t.text,
            output_tokens=list(t.tokens),
            reasoning=t.reasoning,
            content=t.content,
            context_text=self.context_text,
            tool_name=crossing.tool_name if crossing.tool_name is not None else t.tool_name,
            call_text=t.call_text,
            argument_key=crossing.argument_key,
            calls_done=t.calls_done,
            session=self.run.session,
            prompt_tokens=prompt_len,
            budget=budget,
        )

    @property
    def context_text(self) -> str:
        """The prompt as text (decoded once, at the first boundary)."""
        if self._context_text is None:
            t0 = time.perf_counter()
            self._context_text = str(self.tokenizer.decode(list(self.prompt)))
            self.watch_s += time.perf_counter() - t0
        return self._context_text

    @property
    def context_ends(self) -> list[int] | None:
        """Each prompt token's text end in `context_text` (made on the first sourced
        intervention: ~10x the decode's time); None if the streaming detokenizer's text
        differs from the decode's, so spans cannot be mapped."""
        if self._context_ends is None:
            t0 = time.perf_counter()
            text, ends = text_offsets(self.tokenizer, self.prompt)
            self._context_ends = ends if text == self.context_text else []
            self.watch_s += time.perf_counter() - t0
        return self._context_ends or None

    def _pending(self, name: str, iv: Intervention, crossing: Crossing, decide_s: float, at: int) -> _Pending | None:
        tokens, source = self._tokens(iv)
        verified = bool(iv.verified)
        if verified:
            kind = iv.kind if iv.kind in ASSERTED_KINDS | VERIFIED_KINDS else "jump"
            verify = kind in ASSERTED_KINDS
        else:
            kind = iv.kind if iv.kind in ASSERTED_KINDS else "jump"
            verify = False
        record = {
            "policy": name,
            "boundary": crossing.boundary,
            "kind": kind,
            "verified": verified,
            "at": at,  # output tokens before it
            # calls completed in the turn before it: the call it supplies (blame per call,
            # live/summary.py jump_call)
            "calls_done": self.tracker.calls_done,
            "tokens": len(tokens),
            "emitted": 0,
            "text_chars": len(iv.text) if iv.text is not None else None,
            "source": list(iv.source) if iv.source is not None else None,
            "source_in": iv.source_in if iv.source is not None else None,
            "source_tokens": None if source is None else [source, source + len(tokens)],
            "decide_ms": round(decide_s * 1000, 3),
            **({"label": iv.label} if iv.label else {}),
        }
        self.run.record(record)
        if not tokens:
            return None
        return _Pending(record, tokens, kind, verify, at, source)

    def _tokens(self, iv: Intervention) -> tuple[list[int], int | None]:
        """The intervention's token ids, and the absolute position they were copied from
        where its source span maps onto the sequence (best effort; None if unknown).
        A context span whose tokens spell exactly the intervention's text is proposed
        as those very tokens, so the copy is token-exact."""
        if iv.tokens is not None:
            tokens = [int(t) for t in iv.tokens]
        elif iv.text:
            tokens = [int(t) for t in self.tokenizer.encode(iv.text, add_special_tokens=False)]
        else:
            return [], None
        if iv.source is None:
            return tokens, None
        start, end = iv.source
        if iv.source_in == "context":
            ends, base, seq = self.context_ends, 0, self.prompt
            if ends is None:
                return tokens, None
        elif iv.source_in == "output":
            ends, base, seq = self.tracker.ends, len(self.prompt), self.tracker.tokens
        else:
            return tokens, None
        span = span_tokens(ends, int(start), int(end))
        if span is None:
            return tokens, None
        a, b = span
        if iv.tokens is None and iv.text is not None and self.tokenizer.decode(list(seq[a:b])) == iv.text:
            tokens = [int(t) for t in seq[a:b]]
        return tokens, base + a

    # --- end of the turn ----------------------------------------------------------------
    def finish(self, output_tokens: list[int], prompt_len: int) -> None:
        """After the row ended: fire the boundaries its last tokens crossed, then
        `turn_end`, for observation (an intervention can no longer be applied)."""
        if self._broken:
            return
        try:
            t0 = time.perf_counter()
            crossed = self._take(output_tokens)  # counts what the row took of a pending run
            self.pending = None
            self.watch_s += time.perf_counter() - t0
            crossed.append(Crossing("turn_end", len(output_tokens)))
            for crossing in crossed:
                self.run.fire(self._event(crossing, prompt_len, 0), observe=True)
        except Exception:
            log.exception("policy boundary tracking failed at the end of the turn")
            self.run.note_error("runtime", "boundary", "boundary tracking failed at the end of the turn")
