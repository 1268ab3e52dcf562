"""The round protocol of proposers that draft for every row of a round at once (the
two-model draft's DraftModelGroup, MTP's MtpGroup; engine/schedule/scheduler.py
_offer_round_groups): `start_round`, then `offer(proposer, view)` for each row whose
verified tokens can pay this round; the first proposer that asks (`draft`) drafts for
every offered row in one batched run, the others take their rows' results."""

from __future__ import annotations

from typing import Any

from .proposal import RowView


class RoundGroup:
    """Subclasses implement `_run(batch, widths)` (fill `results[id(proposer)]` with the
    row's tokens, or None where it has none) and `reset()` (drop every row's state);
    row b of their batched cache belongs to `members[b]`."""

    def __init__(self) -> None:
        self.offered: list[tuple[Any, RowView]] = []
        self.results: dict[int, list[int] | None] = {}
        self.members: list[Any] = []
        # counters (benches, tests, /metrics): batched forwards over the group (catch-ups
        # and chain steps; `catch_ups` of them), the forwards drafting row by row would
        # have run for the same drafts, single-row forwards of joining rows, chains, rows drafted
        self.forwards = 0
        self.catch_ups = 0
        self.row_forwards = 0
        self.joins = 0
        self.chains = 0
        self.rows_drafted = 0

    def index(self, proposer: Any) -> int | None:
        """The proposer's row in the batched cache, or None."""
        for b, p in enumerate(self.members):
            if p is proposer:
                return b
        return None

    def start_round(self) -> None:
        self.offered = []
        self.results = {}

    def offer(self, proposer: Any, view: RowView) -> None:
        if proposer.cooldown == 0 and view.budget > 1:
            self.offered.append((proposer, view))

    def draft(self, proposer: Any, view: RowView, k: int) -> list[int] | None:
        """The row's k draft tokens (None: it has none this round)."""
        if id(proposer) not in self.results:
            batch = [(p, v) for p, v in self.offered if id(p) not in self.results]
            if not any(p is proposer for p, _ in batch):
                batch.append((proposer, view))  # asked without an offer (a wrapped proposer, a test)
            widths = [max(1, k if p is proposer else min(p.k, v.budget - 1)) for p, v in batch]
            try:
                self._run(batch, widths)
            except Exception:
                self.reset()  # never leave the members and the cache out of step
                raise
        tokens = self.results.pop(id(proposer), None)
        return None if tokens is None else tokens[:k]

    def _run(self, batch: list[tuple[Any, RowView]], widths: list[int]) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError


def group_member(row: Any, group: RoundGroup) -> Any:
    """The row's proposer that drafts in `group` (under a constrained row's wrapper), or None."""
    from .proposal import DraftsInGroup, unwrapped

    for p in map(unwrapped, row.proposers):
        if isinstance(p, DraftsInGroup) and p.round_group is group:
            return p
    return None
