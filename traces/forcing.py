"""Forced output for replay: a Constraint that makes a row emit a recorded turn.

`ForcedOutput` masks every logit but the recorded next token, so each plain round
emits exactly the recorded token as an ordinary decode step, and a verified proposal
(echo, n-gram, verified strict) is accepted exactly where it matches the record
(hindsight). Asserted tokens (a jump, asserted strict) are taken as given by the
scheduler; `accept` checks them against the record, and the first mismatch is a wrong
intervention: the turn is `diverged`, and from then on the row is steered to EOS
(see `mask`).

`ReplayEngine` is an Engine that instruments the rows of requests registered with
`probe(request_id)`: it installs the row's ForcedOutput (composed with a grammar
constraint where the request has one) and wraps the row's proposers to time each
`propose` call, and the constraint stamps every committed token, so replay can split
each round's time into plain decode, the prefill of supplied tokens (P) and proposer
time (H).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from jumpahead.engine.engine import Engine
from jumpahead.engine.methods.proposal import Proposal, RowView, Wrapper


class ForcedOutput:
    """The engine Constraint that forces a row's output to `tokens` (ending in EOS)."""

    def __init__(self, tokens: list[int], eos: int) -> None:
        self.tokens = list(tokens)
        self.eos = int(eos)
        self.cursor = 0  # committed tokens that matched the record
        self.diverged_at: int | None = None  # output position of the first wrong token
        self.wrong: list[int] = []  # committed tokens from the first wrong one on
        self.stamps: list[float] = []  # perf_counter at each committed token (engine thread)

    @property
    def diverged(self) -> bool:
        return self.diverged_at is not None

    def mask(self, logits: np.ndarray) -> np.ndarray:
        # The forced token's logit is set rather than kept: the record is the truth even
        # where a grammar composed before us would have ruled the token out.
        out = np.full(logits.shape, -np.inf, dtype=logits.dtype)
        if self.diverged or self.cursor >= len(self.tokens):
            # A diverged turn is not forced any further. The brief let the row run on to
            # EOS or the recorded length, but what this model writes after a wrong
            # intervention measures nothing (the record came from another model) and
            # costs replay time; the rest of the record is charged at the ordinary
            # arm's decode cost instead (R, traces/replay.py). So it ends here.
            out[self.eos] = 0.0
        else:
            out[self.tokens[self.cursor]] = 0.0
        return out

    def accept(self, token: int) -> None:
        self.stamps.append(time.perf_counter())
        if self.diverged:
            self.wrong.append(int(token))
        elif self.cursor < len(self.tokens) and int(token) == self.tokens[self.cursor]:
            self.cursor += 1
        elif self.cursor < len(self.tokens):
            self.diverged_at = self.cursor
            self.wrong.append(int(token))
        # past the record's end (a verified proposal carried beyond EOS): never committed


class ComposedConstraint:
    """The forced output over a request's own grammar: both follow every token; the
    forced mask decides (it ignores what the grammar allowed)."""

    def __init__(self, forced: ForcedOutput, grammar: Any) -> None:
        self.forced = forced
        self.grammar = grammar

    def mask(self, logits: np.ndarray) -> np.ndarray:
        return self.forced.mask(logits)

    def accept(self, token: int) -> None:
        self.grammar.accept(token)
        self.forced.accept(token)


@dataclass
class ProposeCall:
    at: float  # perf_counter when propose() returned
    seconds: float
    name: str
    kind: str | None  # the proposal's kind (None: nothing proposed)
    tokens: int
    asserted: bool


@dataclass
class RowProbe:
    """What replay learns about one row: forcing state and proposer calls."""

    forced: ForcedOutput
    calls: list[ProposeCall] = field(default_factory=list)


class TimedProposer(Wrapper):
    """A row's proposer, timed (each call's seconds go to the round they precede)."""

    def __init__(self, inner: Any, probe: RowProbe) -> None:
        self.inner = inner
        self.probe = probe
        self.name = getattr(inner, "name", type(inner).__name__)

    def propose(self, view: RowView, max_len: int) -> Proposal | None:
        t0 = time.perf_counter()
        prop = self.inner.propose(view, max_len)
        t1 = time.perf_counter()
        self.probe.calls.append(ProposeCall(t1, t1 - t0, self.name, None if prop is None else str(prop.kind),
                                            0 if prop is None else len(prop.tokens),
                                            bool(prop is not None and prop.asserted)))
        return prop

    def feedback(self, proposal: Proposal, accepted: int) -> None:
        self.inner.feedback(proposal, accepted)

    def __getattr__(self, name: str) -> Any:  # anything else a scheduler or policy reads
        return getattr(self.inner, name)


class ReplayEngine(Engine):
    """An Engine whose probed rows are forced to a recorded output and instrumented."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._probes: dict[str, RowProbe] = {}
        self._probe_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def probe(self, request_id: str, tokens: list[int]) -> RowProbe:
        """Force the row of request `request_id` to emit `tokens` (ending in EOS)."""
        eos = tokens[-1] if tokens and tokens[-1] in set(self.tokenizer.eos_token_ids) else \
            sorted(self.tokenizer.eos_token_ids)[0]
        probe = RowProbe(ForcedOutput(tokens, eos))
        with self._probe_lock:
            self._probes[request_id] = probe
        return probe

    def _make_row(self, req: Any, emit: Callable[[Any], None]) -> Any:
        row = super()._make_row(req, emit)
        with self._probe_lock:
            probe = self._probes.pop(req.request_id, None)
        if probe is not None:
            row.constraint = probe.forced if row.constraint is None else ComposedConstraint(probe.forced, row.constraint)
            row.proposers = [TimedProposer(p, probe) for p in row.proposers]
        return row
