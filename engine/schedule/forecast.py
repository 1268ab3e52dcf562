"""Forecast of how many tokens a row will still emit: who a batch waits on last.

The throughput objective (engine/schedule/scheduler.py `_worth`) lets a row verify proposals
in a shared batch only when the batch waits on that row last. Agent turns stop at EOS
long before their 8-32k budgets, so the remaining `max_tokens` says little about
who finishes last. What is known instead:

- the session's recent turn lengths (`GenerationRequest.recent_lengths`, counted by
  the proxy from the history the agent resends, core/turn_lengths.py). A row that
  has written n tokens is forecast the median of `l - n` over the recent lengths
  `l > n` (the remainder of the turns that were longer); past every recent length,
  half of what it wrote so far (a turn that long is an outlier that keeps going);
- a copy in progress: a row whose last verified copy (echo, n-gram) was accepted
  whole is writing out a span of its context, and is forecast at least the rest of
  the copied message (up to the next end-of-message token in the context), as when
  a file write repeats a file read earlier in the session;
- the budget: never more than `max_tokens` left.

A request without recent lengths is forecast its remaining budget (the rule before
forecasts), so engine users that give none see the old behaviour.
"""

from __future__ import annotations

import bisect
import statistics
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .row import Row


def from_lengths(lengths: Sequence[int], written: int) -> float:
    """Tokens still to come for a turn that has `written` tokens, given recent lengths."""
    longer = [n - written for n in lengths if n > written]
    if longer:
        return float(statistics.median(longer))
    return max(1.0, written / 2)


def remaining(row: Row) -> float:
    """The row's forecast of tokens still to emit (see the module doc)."""
    written = len(row.output)
    left = float(row.max_tokens - written)
    lengths = row.req.recent_lengths
    if not lengths:
        return left
    guess = from_lengths(lengths, written)
    if row.copy_end is not None:
        guess = max(guess, float(row.copy_end - written))
    return min(guess, left)


def note_copy(row: Row, source: int, accepted: int) -> None:
    """A verified copy from absolute position `source` had `accepted` tokens accepted
    (the row's output before this round's commit): remember where the copied message
    ends, in the row's output positions; nothing accepted: the copy is over."""
    if accepted == 0:
        row.copy_end = None
        return
    if not row.req.recent_lengths:  # the forecast is the budget: nothing to track
        return
    end = _message_end(row, source + accepted)
    if end is not None:
        row.copy_end = len(row.output) + accepted + (end - (source + accepted)) + 1


def _message_end(row: Row, start: int) -> int | None:
    """The first end-of-message (stop) token at or after absolute position `start`."""
    prompt = row.req.prompt
    if row.prompt_stops is None:
        row.prompt_stops = [i for i, t in enumerate(prompt) if t in row.stop_ids]
    i = bisect.bisect_left(row.prompt_stops, start)
    if i < len(row.prompt_stops):
        return row.prompt_stops[i]
    for j in range(max(start, len(prompt)), len(prompt) + len(row.output)):
        if row.output[j - len(prompt)] in row.stop_ids:
            return j
    return None
