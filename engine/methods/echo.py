"""Echo and n-gram proposers: continue a span the row's context already contains.

Both keep an incremental k-gram table over the row's prompt and output (positions
where each k-gram ends). Echo looks for the longest recent match of the sequence's
suffix (up to MAX_MATCH tokens, at least MIN_MATCH) and proposes what followed it, the
way prompt-lookup and SuffixDecoding do; its span adapts to the row's acceptance so a
row that keeps rejecting stops paying for verification. N-gram is classic prompt
lookup decoding: a fixed n and a fixed span.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from .proposal import Peeks, Proposal, RowView


class KGramIndex:
    """Positions (index just after) of every k-gram, for k in 1..max_k, appended lazily."""

    def __init__(self, max_k: int) -> None:
        self.max_k = max_k
        self.table: dict[tuple[int, ...], list[int]] = defaultdict(list)
        self.indexed = 0  # tokens[:indexed] are in the table

    def update(self, tokens: Sequence[int]) -> None:
        n = len(tokens)
        for end in range(self.indexed + 1, n + 1):
            for k in range(1, min(self.max_k, end) + 1):
                self.table[tuple(tokens[end - k : end])].append(end)
        self.indexed = n

    def continuation(self, tokens: Sequence[int], k: int) -> int | None:
        """Most recent end position (< len(tokens)) of an earlier copy of the last k tokens."""
        if len(tokens) < k:
            return None
        hits = self.table.get(tuple(tokens[-k:]))
        if not hits:
            return None
        n = len(tokens)
        for end in reversed(hits):
            if end < n:
                return end
        return None


class EchoProposer(Peeks):
    name = "echo"
    MIN_MATCH = 2
    MAX_MATCH = 8

    def __init__(self, span: int = 8, max_span: int = 16) -> None:
        self.index = KGramIndex(self.MAX_MATCH)
        self.span = span
        self.max_span = max_span
        self.cooldown = 0  # rounds to skip after repeated full rejections
        self.misses = 0

    def propose(self, view: RowView, max_len: int) -> Proposal | None:
        if self.cooldown > 0:
            self.index.update(view.tokens)
            self.cooldown -= 1
            return None
        return self.peek(view, max_len)

    def peek(self, view: RowView, max_len: int) -> Proposal | None:
        """What `propose` would return this round, without using up a round of cooldown
        (the scheduler asks before offering a row to a drafting group: a row whose copy
        outranks any draft is not drafted for)."""
        tokens = view.tokens
        self.index.update(tokens)
        if self.cooldown > 0:
            return None
        for k in range(min(self.MAX_MATCH, len(tokens) - 1), self.MIN_MATCH - 1, -1):
            end = self.index.continuation(tokens, k)
            if end is None:
                continue
            n = min(self.span, max_len, len(tokens) - end)
            if n <= 0:
                continue
            return Proposal(list(tokens[end : end + n]), "echo", source=(end, end + n), match=k)
        return None

    def feedback(self, proposal: Proposal, accepted: int) -> None:
        if accepted == len(proposal.tokens):
            self.span = min(self.max_span, self.span * 2)
            self.misses = 0
        elif accepted == 0:
            self.span = max(2, self.span // 2)
            self.misses += 1
            if self.misses >= 3:  # nothing to copy here: back off for a while
                self.cooldown = 4 * self.misses
        else:
            self.span = max(2, accepted + 1)
            self.misses = 0


class NgramProposer:
    """Prompt lookup decoding: match the last `n` tokens (falling back to shorter)."""

    name = "ngram"

    def __init__(self, n: int = 3, span: int = 5) -> None:
        self.n = n
        self.span = span
        self.index = KGramIndex(n)

    def propose(self, view: RowView, max_len: int) -> Proposal | None:
        tokens = view.tokens
        self.index.update(tokens)
        for k in range(self.n, 0, -1):
            end = self.index.continuation(tokens, k)
            if end is not None:
                n = min(self.span, max_len, len(tokens) - end)
                if n > 0:
                    return Proposal(list(tokens[end : end + n]), "ngram", source=(end, end + n), match=k)
        return None

    def feedback(self, proposal: Proposal, accepted: int) -> None:
        pass
