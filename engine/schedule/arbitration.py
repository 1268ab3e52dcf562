"""Arbitration: which proposal each row carries into a round, and how many of its tokens.

The scheduler's round reads schedule -> run -> postprocess: this module is the schedule
half's choice between proposers (engine/schedule/scheduler.py runs the forward,
engine/schedule/verification.py turns its logits into each row's `RowOutcome`).

A proposer returns a `Proposal` (what it proposes); the arbitration never writes into
it. What the round decides about it (who proposed it, the tokens carried after the
width policy and the caps, whether an asserted run was cut, the expected accepted
tokens and what one is worth) is a `Carried`, made here and read by verification and
the round.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..methods.proposal import VERIFIED_KINDS, DraftsInGroup, Peeks, Proposal, Proposer, RowView, unwrapped
from .forecast import remaining
from .width_policy import LONG_MATCH, Acceptance, expected_accepted, prior_rate

if TYPE_CHECKING:
    from .row import Row
    from .scheduler import Scheduler


def acceptance_key(name: str, match: int = 0) -> str:
    """The acceptance record a proposal's outcome updates: its proposer's name (or its
    kind's), apart for long and short copy matches (they are accepted at very different
    rates)."""
    if not match:
        return name
    return f"{name}/{'long' if match >= LONG_MATCH else 'short'}"


@dataclass
class Carried:
    """A proposal a row carries into this round, and the round's decision about it."""

    # the proposal as carried: the proposer's, with its tokens cut to what the round
    # carries (a copy: the object the proposer returned is left as it returned it)
    proposal: Proposal
    proposer: Proposer  # who proposed it: its feedback, its acceptance record, its telemetry
    # an asserted run cut at the round's width cap: its rest follows next round, unsampled
    cut: bool = False
    expected: float = 0.0  # expected accepted tokens (verified proposals)
    worth: float = 0.0  # seconds one accepted token saves (cost-aware sizing)

    @property
    def tokens(self) -> list[int]:
        return self.proposal.tokens

    @property
    def kind(self) -> str:
        return self.proposal.kind

    @property
    def asserted(self) -> bool:
        return self.proposal.asserted

    @property
    def source(self) -> tuple[int, int] | None:
        return self.proposal.source

    @property
    def key(self) -> str:
        """Its acceptance record (`acceptance_key`)."""
        return acceptance_key(self.proposer.name, self.proposal.match)


class Arbiter:
    """The scheduler's choice of proposals. It reads the scheduler's rows, config, width
    policy and counters (one scheduler, one arbiter; tests swap `Scheduler.width_policy`,
    so it is read on each use)."""

    def __init__(self, scheduler: "Scheduler") -> None:
        self.s = scheduler
        self._sat_out: set[int] = set()  # this round's grouped proposers a copy outranked

    def round(self, rows: list["Row"]) -> list[Carried | None]:
        """Each running row's carried proposal for this round (None: it decodes one token)."""
        self._offer_round_groups(rows)
        carried = [self.propose(r) for r in rows]
        self._sat_out = set()  # this round's only (ids must not outlive their proposers)
        if self.s.config.cost_aware:
            self._drop_unpaid(rows, carried)
        return carried

    def propose(self, row: "Row", asserted_only: bool = False) -> Carried | None:
        """The row's proposal for the next round, or None.

        Proposals of a kind outside VERIFIED_KINDS (asserted strict fill and jumps, and
        their checked forms: tokens a grammar, the template or a plan fixes) keep
        proposer order: the first one found ends the search and is carried, over any
        verified proposal found before it. Verified proposals (echo, n-gram, draft
        model, drafter) do not end the search: each is sized by the width policy and the
        one with the most expected accepted tokens is carried (ties: proposer order);
        the others are set aside as a proposal capped to nothing is (`_set_aside`).
        `asserted_only` (the first token): verifying proposers are not asked, and a
        checked proposal found first means none."""
        if not row.proposers:
            return None
        s = self.s
        config = s.config
        limit = max(config.max_proposal, config.max_asserted)
        t0 = time.perf_counter()
        view = row.view()
        budget = min(limit, view.budget - 1)
        fixed = None  # the first proposal of a kind outside VERIFIED_KINDS
        candidates: list[tuple[Carried, int]] = []  # verified, sized, in proposer order (+ tokens capped)
        batch = max(1, len(s.running))
        worth = self.worth(row) if config.cost_aware else 0.0
        # When no verified token can pay here (the throughput objective, a row in a
        # shared batch that the batch does not wait on), our verifying proposers are
        # not asked at all: a draft model would spend forwards on a dropped proposal.
        unpaid = config.cost_aware and not asserted_only and s.width_policy.threshold(batch, worth) >= 1.0
        proposers = row.proposers
        if row.cut_by is not None:  # an asserted run cut last round continues before anything else
            proposers = [row.cut_by, *(p for p in proposers if p is not row.cut_by)]
        if budget > 0:
            for proposer in proposers:
                if (unpaid or asserted_only) and proposer.name in VERIFIED_KINDS:
                    continue
                if id(unwrapped(proposer)) in self._sat_out:
                    continue  # a copy outranked its draft before the group drafted (_offer_round_groups)
                asked = time.perf_counter()
                prop = proposer.propose(view, budget)
                if proposer.name in VERIFIED_KINDS:
                    ms = (time.perf_counter() - asked) * 1000
                    row.stats.method(proposer.name)["propose_ms"] += ms
                    s.totals.method(proposer.name)["propose_ms"] += ms
                if prop is None or not prop.tokens:
                    continue
                verified = not prop.asserted and prop.kind in VERIFIED_KINDS
                if asserted_only and not prop.asserted:
                    if verified:
                        continue  # never carried into the first token; an asserted one may follow
                    break  # a checked strict or jump proposal comes first: none
                if not prop.asserted and not s.runner.trimmable:
                    row.stats.declined[proposer.name] = (
                        "model cache cannot be rolled back (recurrent layers without per-row lengths)")
                    continue
                if prop.asserted and batch > 1 and not s.runner.padding_safe:
                    # recurrent layers that would fold a neighbour's padding into
                    # their state: rounds stay width 1 (ModelRunner.padding_safe)
                    row.stats.declined[proposer.name] = "model's recurrent layers cannot skip padding"
                    continue
                cap = config.max_asserted if prop.asserted else config.max_proposal
                keep = min(budget, cap, len(prop.tokens))
                if verified:
                    # Sized by the row's acceptance rate of this proposer (checked strict
                    # tokens are exempt: the grammar allows only them). The rate also ranks
                    # the candidates when cost_aware is off: it comes from what the row
                    # accepted, not from timing, so proposals stay independent of how fast
                    # the machine runs (what --no-cost-aware is for), and a weak proposer
                    # asked first still does not shadow a stronger one.
                    acc = self.acceptance(row, acceptance_key(proposer.name, prop.match), prop.match)
                    capped = 0
                    sized_worth = 0.0
                    if config.cost_aware:
                        kept = s.width_policy.cap(acc.rate, keep, batch, worth)
                        if kept == 0:
                            self._count_capped(row, keep)
                            acc.forget()
                            continue
                        keep, capped = kept, keep - kept
                        sized_worth = worth
                    candidates.append((Carried(dataclasses.replace(prop, tokens=prop.tokens[:keep]), proposer,
                                               expected=expected_accepted(acc.rate, keep), worth=sized_worth),
                                       capped))
                    continue
                # An asserted run cut here continues next round: the row must not
                # sample between its slices (Carried.cut; see engine/schedule/verification.py).
                fixed = Carried(dataclasses.replace(prop, tokens=prop.tokens[:keep]), proposer,
                                cut=prop.asserted and len(prop.tokens) > keep)
                break
        found = fixed
        if found is None and candidates:
            found, capped = max(candidates, key=lambda c: c[0].expected)  # the first of equals
            self._count_capped(row, capped)
        if candidates and found is not candidates[0][0]:
            # a later proposer's proposal carried over an earlier one's (usage.fill
            # verified.later_won, /metrics verified_later_won)
            row.stats.later_won += 1
            s.counters["verified_later_won"] += 1
        forgotten = {found.key} if found is not None else set()
        for carried, _ in candidates:
            if carried is not found:
                self._set_aside(row, carried, forgotten)
        row.cut_by = found.proposer if found is not None and found.cut else None
        row.stats.propose_s += time.perf_counter() - t0
        return found

    def _set_aside(self, row: "Row", carried: Carried, forgotten: set[str]) -> None:
        """A verified proposal that another one outranked this round. It is handled as
        a proposal capped to nothing or dropped by _drop_unpaid: never verified, so no
        feedback to its proposer (echo and n-gram keep their spans; a draft model's
        cache holds the drafted tokens until its next sync trims it back to the
        committed ones; the drafter's batched result for the row was taken), its
        acceptance rate drifts toward its prior (Acceptance.forget) so it gets to try
        again (once a round per rate: `forgotten` holds the keys already moved, and the
        carried proposal's, whose rate its verification updates), and its method counts
        it under `outranked`, not `proposals`."""
        key = carried.key
        if key not in forgotten:
            forgotten.add(key)
            self.acceptance(row, key, carried.proposal.match).forget()
        name = carried.proposer.name
        row.stats.method(name)["outranked"] += 1
        self.s.totals.method(name)["outranked"] += 1

    def _offer_round_groups(self, rows: list["Row"]) -> None:
        """Proposers that draft for the whole batch at once (engine/methods/drafter.py
        DrafterGroup) learn this round's rows before any of them proposes. A row whose
        verified tokens cannot pay this round (the same test `propose` skips its
        verifying proposers by) is not offered: the batched chain drafts only for rows
        that will ask."""
        s = self.s
        started: set[int] = set()
        self._sat_out = set()
        batch = max(1, len(s.running))
        for row in rows:
            # (a proposer wrapped for a constrained row, engine/strict/grammar.py, is offered as itself)
            grouped = [q for q in map(unwrapped, row.proposers) if isinstance(q, DraftsInGroup)]
            for proposer in grouped:  # every group starts its round (no offer kept from the last)
                if id(proposer.round_group) not in started:
                    started.add(id(proposer.round_group))
                    proposer.round_group.start_round()
            if not grouped:
                continue
            worth = self.worth(row) if s.config.cost_aware else 0.0
            if s.config.cost_aware and s.width_policy.threshold(batch, worth) >= 1.0:
                continue
            view = row.view()
            copy = self._copy_estimate(row, view, batch, worth) if s.config.compose_copies else None
            for proposer in grouped:
                if copy is not None and self._copy_outranks(row, proposer, copy, view, batch, worth):
                    # Its proposal would be set aside for the copy in `propose`: the
                    # group does not draft for the row, so the row pays no chain.
                    self._sat_out.add(id(proposer))
                    row.stats.method(proposer.name)["sat_out"] += 1
                    s.totals.method(proposer.name)["sat_out"] += 1
                    continue
                proposer.round_group.offer(proposer, view)

    def _sized_expectation(self, rate: float, tokens: int, batch: int, worth: float) -> float:
        """Expected accepted tokens of a verified proposal after the width policy's cap."""
        if self.s.config.cost_aware:
            tokens = self.s.width_policy.cap(rate, tokens, batch, worth)
        return expected_accepted(rate, tokens) if tokens > 0 else 0.0

    def _copy_estimate(self, row: "Row", view: RowView, batch: int, worth: float) -> tuple[float, int] | None:
        """(expected accepted tokens, proposer order) of the best copy the row's copying
        proposers (those that can `peek`: echo) would propose this round, or None."""
        s = self.s
        budget = min(s.config.max_proposal, view.budget - 1)
        best = None
        for order, proposer in enumerate(map(unwrapped, row.proposers)):
            if not isinstance(proposer, Peeks) or budget <= 0:
                continue
            asked = time.perf_counter()
            prop = proposer.peek(view, budget)
            ms = (time.perf_counter() - asked) * 1000  # proposer time (H), as every ask in `propose`
            row.stats.method(proposer.name)["propose_ms"] += ms
            s.totals.method(proposer.name)["propose_ms"] += ms
            if prop is None or not prop.tokens:
                continue
            acc = row.acceptance.get(acceptance_key(proposer.name, prop.match)) or \
                Acceptance(prior_rate=prior_rate(prop.match))
            expected = self._sized_expectation(acc.rate, min(budget, len(prop.tokens)), batch, worth)
            if best is None or expected > best[0]:
                best = (expected, order)
        return best

    def _copy_outranks(self, row: "Row", proposer: DraftsInGroup, copy: tuple[float, int], view: RowView,
                       batch: int, worth: float) -> bool:
        """Whether the row's copy is expected to land at least as many tokens as the
        grouped proposer's draft at its current length could (ties: proposer order, as
        in `propose`)."""
        budget = min(self.s.config.max_proposal, view.budget - 1)
        acc = row.acceptance.get(proposer.name) or Acceptance(prior_rate=prior_rate(0))
        draft = self._sized_expectation(acc.rate, min(budget, proposer.k), batch, worth)
        order = next((i for i, p in enumerate(map(unwrapped, row.proposers)) if p is proposer), len(row.proposers))
        expected, copy_order = copy
        return expected > draft or (expected == draft and copy_order < order)

    def _drop_unpaid(self, rows: list["Row"], carried: list[Carried | None]) -> None:
        """Drop this round's verified proposals when together they do not pay for
        leaving width 1 (WidthPolicy.round_pays). Asserted or checked-strict tokens
        already widen the round; then only the per-token caps apply."""
        verified = [i for i, c in enumerate(carried) if c is not None and c.kind in VERIFIED_KINDS]
        if not verified or any(c is not None and c.kind not in VERIFIED_KINDS for c in carried):
            return
        gain = sum(carried[i].expected * carried[i].worth for i in verified)
        tokens = sum(len(carried[i].tokens) for i in verified)
        if self.s.width_policy.round_pays(gain, tokens):
            return
        for i in verified:
            c = carried[i]
            self._count_capped(rows[i], len(c.tokens))
            self.acceptance(rows[i], c.key, c.proposal.match).forget()
            carried[i] = None

    def worth(self, row: "Row") -> float:
        """Seconds one accepted token of `row` saves, by the objective."""
        s = self.s
        policy = s.width_policy
        batch = max(1, len(s.running))
        slot_wanted = len(s.waiting) > s.config.max_batch - len(s.running)
        if s.config.objective == "latency" or slot_wanted or batch == 1 or row not in s.running:
            return policy.share(batch)
        fixed, per_token, _ = policy.costs()
        mine = remaining(row)  # forecast tokens to go (engine/schedule/forecast.py)
        if all(mine > remaining(r) for r in s.running if r is not row):
            return fixed + per_token * batch  # the batch may wait on this row last: a whole round
        # The remaining rounds are one row smaller. (Rows tied for last gain nothing
        # from one of them finishing sooner: the batch still waits on the others.)
        return per_token

    def _count_capped(self, row: "Row", n: int) -> None:
        """Telemetry: `n` proposed tokens not carried (not worth their cost)."""
        self.s.counters["verified_capped"] += n
        row.stats.capped += n

    @staticmethod
    def acceptance(row: "Row", key: str, match: int) -> Acceptance:
        """The row's acceptance record `key`, made at the prior of a `match`-long copy."""
        acc = row.acceptance.get(key)
        if acc is None:
            acc = row.acceptance[key] = Acceptance(prior_rate=prior_rate(match))
        return acc
