"""Proposals: tokens a row carries into a Round besides its pending input token.

`asserted` tokens (strict fill, jump, scripted) are appended without sampling or
verification; the row samples once after the last of them. `verified` tokens (echo,
n-gram, draft model) are accepted position by position while the row's own sampler,
at that position, picks the proposed token; the first disagreement is emitted as
the sampled token and the rest rolls back (docs/design.md, Engine vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Sequence

if TYPE_CHECKING:
    import numpy as np

from .registry import ASSERTED_KINDS, VERIFIED_KINDS  # from the method registry (engine/methods/registry.py)
from ..types import TokenKind

__all__ = ["ASSERTED_KINDS", "VERIFIED_KINDS", "Constraint", "DraftsInGroup", "ObservesHidden", "Peeks", "Proposal",
           "ProposalStats", "Proposer", "ReleasesRow", "RowView", "Wrapper", "unwrapped"]


@dataclass
class Proposal:
    tokens: list[int]
    kind: TokenKind
    # where the tokens were copied from (absolute positions in the row's sequence)
    source: tuple[int, int] | None = None
    # how many tokens before the copy matched the row's recent tokens (copies only):
    # long matches are accepted far more often than short ones (engine/schedule/width_policy.py)
    match: int = 0
    # Verify tokens of an asserted kind instead (exact strict fill: the tokens keep their
    # kind but are accepted only where the row's sampler picks them; engine/strict/grammar.py).
    verify: bool = False
    # What the round decides about it (who proposed it, the tokens carried, a cut
    # asserted run, expected accepted tokens) is the scheduler's `Carried`
    # (engine/schedule/arbitration.py): a proposer's Proposal is never written into.

    @property
    def asserted(self) -> bool:
        return self.kind in ASSERTED_KINDS and not self.verify


@dataclass
class RowView:
    """What a proposer may read: the row's whole sequence so far and its budget."""

    tokens: Sequence[int]  # prompt + output (the last one is the pending input token)
    prompt_len: int
    budget: int  # most tokens the row may still emit
    # The target's final hidden state [D] (lazy) at the position whose logits chose the
    # pending token, where the engine keeps it (a learned drafter is loaded); else None.
    hidden: "Any" = None


class Proposer(Protocol):
    """Per-request source of proposals, asked between rounds."""

    name: str

    def propose(self, view: RowView, max_len: int) -> Proposal | None: ...

    def feedback(self, proposal: Proposal, accepted: int) -> None: ...


# --- what a proposer may do besides proposing -----------------------------------------
# Each optional capability is a class the proposer subclasses, and the scheduler asks
# with isinstance: what a proposer can do is declared where it is written, not found
# by probing its attributes.


class Wrapper:
    """Wraps another proposer (a constrained row's, engine/strict/grammar.py; replay's timer,
    traces/forcing.py): per-row state, groups and hooks live on `inner`."""

    inner: Any


class Peeks:
    """Says what it would propose without being asked (echo): the scheduler weighs a
    copy against a grouped draft before the group drafts for the row."""

    def peek(self, view: RowView, max_len: int) -> Proposal | None:
        raise NotImplementedError


class DraftsInGroup:
    """Drafts in a round group batched over the rows (draft model, drafter, MTP:
    engine/methods/round_group.py); `k` is its current draft length."""

    round_group: Any  # engine/methods/round_group.py RoundGroup (or the drafter's DrafterGroup)
    k: int


class ReleasesRow:
    """Keeps per-row state outside the row (a slot in a group's batched cache), freed
    when the row leaves."""

    def release_row(self) -> None:
        raise NotImplementedError


class ObservesHidden:
    """Reads the target's hidden state at every consumed input (MTP, engine/methods/mtp.py)."""

    def observe_hidden(self, position: int, hidden: Any) -> None:
        raise NotImplementedError


def unwrapped(proposer: Any) -> Any:
    """The proposer itself under a wrapper: where per-row state, groups and hooks live."""
    return proposer.inner if isinstance(proposer, Wrapper) else proposer


class AdaptiveLength:
    """The draft length of a learned proposer (trained drafter, MTP): one longer after a
    proposal accepted whole, one past what was accepted after a partial one, one shorter
    after a miss; a row missed four times in a row rests as many rounds as its misses
    (nothing predictable there). Subclasses call `resting()` first in `propose`."""

    def __init__(self, k: int, max_k: int) -> None:
        self.k = k
        self.max_k = max_k
        self.cooldown = 0
        self.misses = 0

    def resting(self) -> bool:
        if self.cooldown > 0:
            self.cooldown -= 1
            return True
        return False

    def feedback(self, proposal: Proposal, accepted: int) -> None:
        k = len(proposal.tokens)
        if accepted == k:
            self.k = min(self.max_k, self.k + 1)
            self.misses = 0
        elif accepted == 0:
            self.k = max(1, self.k - 1)
            self.misses += 1
            if self.misses >= 4:
                self.cooldown = self.misses
        else:
            self.k = max(1, accepted + 1)
            self.misses = 0


class Constraint(Protocol):
    """A grammar over the row's output (engine/strict/grammar.py builds one with xgrammar).

    The scheduler calls `mask` on a row's logits before its sampler picks, and
    `accept` with every token the row commits, in order (asserted ones included).
    Verified proposals need no rollback here: only committed tokens are accepted.
    """

    def mask(self, logits: "np.ndarray") -> "np.ndarray": ...

    def accept(self, token: int) -> None: ...


@dataclass
class ProposalStats:
    """Telemetry for `usage.fill` and /metrics."""

    by_kind: dict[str, int] = field(default_factory=dict)  # emitted tokens by provenance
    proposed: int = 0  # verified tokens proposed
    accepted: int = 0
    rejected: int = 0
    capped: int = 0  # proposed tokens not carried: not worth their cost (width_policy)
    # rounds where a later proposer's proposal was carried over an earlier proposer's
    # verified one (more expected accepted tokens, or asserted; engine/schedule/scheduler.py _propose)
    later_won: int = 0
    rounds: int = 0
    forwards: int = 0
    propose_s: float = 0.0
    declined: dict[str, str] = field(default_factory=dict)  # proposer -> reason
    # verified proposals per proposer: proposals (carried), proposed, accepted, histogram
    # of accepted lengths (index = tokens accepted), time spent proposing (every ask),
    # outranked (proposals not carried: another proposal of the round was preferred),
    # sat_out (rounds a grouped drafter was not asked: the row's copy outranked any
    # draft it could make, so no chain was run for the row)
    methods: dict[str, dict] = field(default_factory=dict)

    def method(self, name: str) -> dict:
        m = self.methods.get(name)
        if m is None:
            m = self.methods[name] = {"proposals": 0, "proposed": 0, "accepted": 0, "accepted_histogram": [],
                                      "propose_ms": 0.0, "outranked": 0, "sat_out": 0}
        return m

    def note_verified(self, name: str, proposed: int, accepted: int) -> None:
        m = self.method(name)
        m["proposals"] += 1
        m["proposed"] += proposed
        m["accepted"] += accepted
        hist = m["accepted_histogram"]
        hist += [0] * (accepted + 1 - len(hist))
        hist[accepted] += 1

    def as_dict(self) -> dict:
        return {
            "tokens": dict(self.by_kind),
            "verified": {
                "proposed": self.proposed,
                "accepted": self.accepted,
                "rejected": self.rejected,
                "capped": self.capped,
                "later_won": self.later_won,
            },
            "rounds": self.rounds,
            "forwards": self.forwards,
            "propose_ms": round(self.propose_s * 1000, 3),
            **({"declined": dict(self.declined)} if self.declined else {}),
            **({"methods": {k: {**v, "propose_ms": round(v["propose_ms"], 3), "accepted_histogram":
                                list(v["accepted_histogram"])} for k, v in self.methods.items()}}
               if self.methods else {}),
        }
