"""Verification: what each row of a round gets from the round's logits.

A row's verified proposal is accepted token by token while the row's own sampler, at
that absolute position, picks the proposed token; the first disagreement is emitted as
the sampled token. Asserted tokens are taken as given and the row samples after them
(docs/design.md, Proposal). The scheduler (engine/schedule/scheduler.py) carries each
row's proposal (engine/schedule/arbitration.py `Carried`), runs the forward, and commits
each row's `RowOutcome`: schedule, run, postprocess.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from .forecast import note_copy
from ..logprobs import token_logprob
from .arbitration import Carried

if TYPE_CHECKING:
    from .row import Row


@dataclass
class RowOutcome:
    """One row's result of a round."""

    tokens: list[int]  # emitted, in order
    kinds: list[str]  # each token's kind (a method's, or "sampled")
    consumed: int  # inputs the row consumed (its cache keeps these)
    accepted: int  # verified proposal tokens accepted
    # where proposal tokens were copied from (absolute source position per token; None
    # where not a copy), or None for no copy
    sources: list[int | None] | None
    # for rows that asked: each token's TokenLogprob (None for asserted tokens: never scored)
    logprobs: list | None


def verify_round(
    rows: list[Row],
    props: list[Carried | None],
    logits: mx.array | None,
    where: list[tuple[int, int]],
    counters: Counter[str],
) -> list[RowOutcome]:
    """Each row's outcome of the round (RowOutcome), in the rows' order; `counters`
    (the scheduler's) gets the verified tokens proposed and accepted.

    logits: [N, V] or None (no row needs any); row b has where[b][1] positions from
    where[b][0]: one per input (position i predicts the token after the row's i-th
    input), only its last, or none. Verified tokens are accepted while the row's
    sampler, at that absolute position, picks them; asserted tokens are taken as
    given and the row samples after them.
    """
    argmax = None if logits is None else mx.argmax(logits, axis=-1)  # [N]
    need = [
        b for b, r in enumerate(rows)
        if (r.sampler.needs_logits or r.constraint is not None or r.req.logprobs is not None) and where[b][1]
    ]
    host = None
    if need:
        # only the needing rows' logits cross to the host
        spans = [where[b] for b in need]
        if sum(n for _, n in spans) == logits.shape[0]:
            sub = logits
        else:
            sub = mx.take(logits, mx.array([o + i for o, n in spans for i in range(n)], dtype=mx.int32), axis=0)
        mx.eval(argmax, sub)
        host = np.array(sub.astype(mx.float32), copy=False)
    elif argmax is not None:
        mx.eval(argmax)
    table = [] if argmax is None else argmax.tolist()
    hosted: dict[int, int] = {}
    at = 0
    for b in need:
        hosted[b] = at
        at += where[b][1]
    out = []
    for b, (row, prop) in enumerate(zip(rows, props)):
        sampler = row.sampler
        constraint = row.constraint
        base = row.position  # absolute position of the first token chosen this round
        first, count = where[b]
        top = row.req.logprobs
        lps: list | None = None if top is None else []  # per emitted token, in order

        def pick(i: int) -> int:
            j = i if count > 1 else 0  # a single position is the row's last
            if host is None or b not in hosted:
                tok = table[first + j]
            else:
                raw = x = host[hosted[b] + j]
                if not (sampler.needs_logits or constraint is not None):
                    tok = table[first + j]  # hosted for logprobs only: the device argmax decides
                else:
                    if constraint is not None:
                        x = constraint.mask(x)
                    tok = sampler.pick(x, base + i)
                    if constraint is not None:
                        constraint.accept(tok)
                if lps is not None:
                    lps.append(token_logprob(raw, tok, top))
            sampler.observe(tok)
            return tok

        if prop is None:
            out.append(RowOutcome([pick(0)], ["sampled"], 1, 0, None, lps))
            continue
        k = len(prop.tokens)
        src = None if prop.source is None else [prop.source[0] + i for i in range(k)]
        if prop.asserted:
            for t in prop.tokens:
                sampler.observe(t)
                if constraint is not None:
                    constraint.accept(t)
            if lps is not None:
                lps.extend([None] * k)  # asserted: appended unscored, no logits exist
            if prop.cut:
                # More asserted tokens follow: the last one becomes the pending
                # input of the next round instead of a sampled token after it.
                out.append(RowOutcome(list(prop.tokens), [prop.kind] * k, k, 0, src, lps))
            else:
                tokens = prop.tokens + [pick(k)]
                kinds = [prop.kind] * k + ["sampled"]
                out.append(RowOutcome(tokens, kinds, 1 + k, 0, None if src is None else [*src, None], lps))
            feedback = k
        else:
            accepted = 0
            tokens, kinds = [], []
            for i in range(k + 1):
                tok = pick(i)
                if i < k and tok == prop.tokens[i]:
                    accepted += 1
                    tokens.append(tok)
                    kinds.append(prop.kind)
                    continue
                tokens.append(tok)
                kinds.append("sampled")
                break
            acc = row.acceptance.get(prop.key)
            if acc is not None:
                acc.observe(k, accepted)
            if prop.source is not None and prop.kind != "strict":
                note_copy(row, prop.source[0], accepted)  # a copy in progress (engine/schedule/forecast.py)
            row.stats.proposed += k
            row.stats.accepted += accepted
            row.stats.rejected += k - accepted
            counters["verified_proposed"] += k
            counters["verified_accepted"] += accepted
            out.append(RowOutcome(tokens, kinds, 1 + accepted, accepted,
                        None if src is None else [*src[:accepted], None], lps))
            feedback = accepted
        prop.proposer.feedback(prop.proposal, feedback)  # the proposal as carried
    return out
