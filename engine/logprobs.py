"""Log probabilities of emitted tokens, for rows that ask (OpenAI `logprobs`).

What is reported is the model's own distribution at each position: the log-softmax of
the raw logits, before logit_bias, penalties, a grammar's mask, temperature and the
top-k/top-p/min-p filters. That is the quantity a client can compare across requests
and methods (OpenAI likewise stopped letting logit_bias change returned logprobs), and
it depends only on the logits at the position, so a token accepted from a verified
proposal (echo, n-gram, draft, checked strict fill) gets exactly the value ordinary
decoding would give it: the verify forward has the logits at every proposed position.

Asserted tokens (unchecked strict fill, jumps, scripted continuations) were appended
without the model scoring them: their logits are never computed, so their entry is
None (reported honestly as absent, never invented).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs


@dataclass
class TokenLogprob:
    """One emitted token's log probability and the `top` most likely alternatives
    (token id, logprob), most likely first."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


def token_logprob(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    """Log-softmax of one position's raw logits [V] (float64 on the host), read at
    `token`, with the `top` largest entries."""
    x = logits.astype(np.float64, copy=False)
    m = float(x.max())
    lse = m + float(np.log(np.exp(x - m).sum()))
    best: list[tuple[int, float]] = []
    if top > 0:
        k = min(top, x.size)
        idx = np.argpartition(-x, k - 1)[:k]
        idx = idx[np.lexsort((idx, -x[idx]))]  # by logit, ties by id: stable across runs
        best = [(int(i), float(x[i]) - lse) for i in idx]
    return TokenLogprob(int(token), float(x[token]) - lse, best)
