"""Per-row token selection.

Random draws are keyed by (row seed, absolute position), never by a running stream:
the token chosen at position p depends only on the logits there and on (seed, p).
That makes a seeded request reproducible, independent of what else is in the batch,
and lets a later method that covers several positions in one forward (verification
of proposals) sample exactly the tokens ordinary decoding would have sampled.

Filtering runs in numpy float64 on the host: it is per-row work on one vocabulary
vector, and doing it in numpy keeps the arithmetic identical however rows are batched.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from .types import SamplingParams

REPETITION_WINDOW = 64  # tokens (prompt tail + output) the repetition penalty looks at


def _uniform(seed: int, position: int) -> float:
    """A uniform draw in [0, 1) keyed by (seed, position) via a counter-based RNG."""
    bitgen = np.random.Philox(key=[seed & 0xFFFFFFFFFFFFFFFF, position & 0xFFFFFFFFFFFFFFFF])
    return float(np.random.Generator(bitgen).random())


class RowSampler:
    """Picks tokens for one row; holds the penalty history the row has produced."""

    def __init__(self, params: SamplingParams, seed: int, prompt_tail: list[int]) -> None:
        self.params = params
        self.seed = seed
        self.recent: list[int] = list(prompt_tail[-REPETITION_WINDOW:])
        self.generated: Counter[int] = Counter()
        self._bias_ids = np.array(list(params.logit_bias.keys()), dtype=np.int64)
        self._bias_vals = np.array(list(params.logit_bias.values()), dtype=np.float64)

    @property
    def needs_logits(self) -> bool:
        """False when argmax over the raw logits is the whole decision (fast path)."""
        p = self.params
        return not (
            p.greedy
            and not p.logit_bias
            and p.repetition_penalty == 1.0
            and p.presence_penalty == 0.0
            and p.frequency_penalty == 0.0
        )

    def observe(self, token: int) -> None:
        """Record a committed output token (for penalties)."""
        self.generated[token] += 1
        self.recent.append(token)
        if len(self.recent) > 4 * REPETITION_WINDOW:
            del self.recent[: -REPETITION_WINDOW]

    def adjusted(self, logits: np.ndarray) -> np.ndarray:
        """Logits after bias and penalties (float64 copy)."""
        p = self.params
        x = logits.astype(np.float64, copy=True)
        if p.repetition_penalty != 1.0 and self.recent:
            ids = np.unique(np.array(self.recent[-REPETITION_WINDOW:], dtype=np.int64))
            v = x[ids]
            x[ids] = np.where(v < 0, v * p.repetition_penalty, v / p.repetition_penalty)
        if self.generated and (p.presence_penalty or p.frequency_penalty):
            ids = np.fromiter(self.generated.keys(), dtype=np.int64)
            counts = np.fromiter(self.generated.values(), dtype=np.float64)
            x[ids] -= p.presence_penalty + p.frequency_penalty * counts
        if self._bias_ids.size:
            x[self._bias_ids] += self._bias_vals
        return x

    def pick(self, logits: np.ndarray, position: int) -> int:
        """Choose the token at absolute `position` from the row's logits there."""
        p = self.params
        x = self.adjusted(logits)
        if p.greedy:
            return int(np.argmax(x))
        x = x / p.temperature
        x -= x.max()
        probs = np.exp(x)
        probs /= probs.sum()
        keep = np.ones_like(probs, dtype=bool)
        if p.top_k and p.top_k < probs.size:
            kth = np.partition(probs, -p.top_k)[-p.top_k]
            keep &= probs >= kth
        if p.min_p > 0.0:
            keep &= probs >= p.min_p * probs.max()
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cum = np.cumsum(probs[order])
            # keep the smallest prefix whose mass reaches top_p (always >= 1 token)
            cutoff = int(np.searchsorted(cum, p.top_p, side="left")) + 1
            nucleus = np.zeros_like(keep)
            nucleus[order[:cutoff]] = True
            keep &= nucleus
        probs = np.where(keep, probs, 0.0)
        cdf = np.cumsum(probs)
        u = _uniform(self.seed, position) * cdf[-1]
        return int(min(np.searchsorted(cdf, u, side="right"), probs.size - 1))
