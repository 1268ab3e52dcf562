"""How many verified proposal tokens a row may carry into a Round, by cost.

A verifying forward costs about `fixed + per_token * T` for T real tokens in the
round (the ragged forward computes no padding outside attention; engine/ragged.py).
On this CPU the fixed part is streaming the weights (~55 ms for the default model)
and a token costs ~4.5 ms, so at B=4 one more proposal token costs 6% of a round; on
a GPU it is nearly free. A row's proposal token i is worth carrying when the chance
that positions 1..i are all accepted, `rate ** i`, at least pays for it: one more
token per second spent must beat the batch's plain rate B / (fixed + per_token * B),
i.e. rate ** i >= rho * B / (1 + rho * B) with rho = per_token / fixed.

rho is fitted online from the rounds the scheduler times (least squares of round
time on round tokens, exponentially weighted); until the rounds vary enough to fit,
`default_rho` applies. Each row keeps a per-proposer acceptance rate (Beta-smoothed,
decaying; copies bucketed by how long their source matched): a row whose copies keep
failing carries fewer tokens, and a capped-out row drifts back toward the prior so it
gets to try again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


# Copies whose source matched at least this many recent tokens are accepted far more
# often: on the echo bench turns, matches of 5-8 tokens kept 75-78% of the proposed
# tokens, matches of 2-3 tokens 20-30%. A row keeps a rate per proposer and bucket.
LONG_MATCH = 4


def prior_rate(match: int) -> float:
    """Starting per-position acceptance rate for a proposal (match 0: not a copy)."""
    if match == 0:
        return 0.7
    return 0.8 if match >= LONG_MATCH else 0.35


@dataclass
class Acceptance:
    """Per-position acceptance rate of one proposer on one row."""

    accepted: float = 0.0
    rejected: float = 0.0
    prior_rate: float = 0.7
    prior_weight: float = 2.0
    decay: float = 0.9  # per proposal: the rate follows what the row writes now

    @property
    def rate(self) -> float:
        w = self.prior_weight
        return (self.accepted + w * self.prior_rate) / (self.accepted + self.rejected + w)

    def observe(self, proposed: int, accepted: int) -> None:
        """A proposal of `proposed` tokens had its first `accepted` accepted."""
        self.accepted = self.accepted * self.decay + accepted
        self.rejected = self.rejected * self.decay + (1 if accepted < proposed else 0)

    def forget(self, share: float = 0.1) -> None:
        """A round without trying: move toward the prior so the row may try again."""
        self.accepted *= 1 - share
        self.rejected *= 1 - share


@dataclass
class WidthPolicy:
    default_rho: float = 0.08  # per-token / fixed forward cost measured on this CPU
    decay: float = 0.97  # weight of older rounds in the fit
    min_spread: float = 1.5  # tokens: std of round sizes needed before fitting
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # n, x, y, xx, xy

    def observe_round(self, tokens: int, seconds: float) -> None:
        s = self._sums
        d = self.decay
        for i, v in enumerate((1.0, tokens, seconds, tokens * tokens, tokens * seconds)):
            s[i] = s[i] * d + v

    @property
    def rho(self) -> float:
        n, x, y, xx, xy = self._sums
        if n < 8:
            return self.default_rho
        mx_, my = x / n, y / n
        var = xx / n - mx_ * mx_
        if var < self.min_spread**2:
            return self.default_rho
        slope = (xy / n - mx_ * my) / var
        fixed = my - slope * mx_
        if slope <= 0 or fixed <= 0:
            return self.default_rho
        return min(1.0, max(0.005, slope / fixed))

    def threshold(self, batch: int) -> float:
        r = self.rho * batch
        return r / (1 + r)

    def cap(self, rate: float, proposed: int, batch: int) -> int:
        """Most of `proposed` tokens worth carrying at this acceptance rate."""
        theta = self.threshold(batch)
        if rate >= 1.0 or theta <= 0.0:
            return proposed
        if rate <= 0.0 or rate < theta:
            return 0
        return min(proposed, int(math.log(theta) / math.log(rate)))

    def as_dict(self) -> dict:
        return {"rho": round(self.rho, 4)}
