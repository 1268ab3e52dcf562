"""How many verified proposal tokens a row may carry into a Round, by cost.

A verifying forward costs about `fixed + per_token * T` for T real tokens in the
round (the ragged forward computes no padding outside attention; engine/kv/ragged.py),
plus a `surcharge` once any row carries more than its pending token. On this CPU the
fixed part is streaming the weights (~50 ms for the default model) and a token costs
~3-4 ms; on a GPU a token is nearly free. A row's proposal token i is worth carrying
when the chance that positions 1..i are all accepted, `rate ** i`, at least pays for
its cost: rate ** i * worth >= per_token, where `worth` is the seconds one accepted
token saves (`threshold`, `cap`).

What an accepted token is worth depends on what the time it saves buys (the
scheduler's objective, SchedulerConfig.objective): with requests waiting, or for a
row's own latency, a round sooner is a row's share of a round (`share`); in a batch
with nothing waiting, a row that finishes sooner only makes the remaining rounds one
row smaller (`per_token`), unless it is the row the batch waits for last, whose
token saves a whole round.

The three costs are fitted online from the rounds the scheduler times (least squares
of round time on round tokens, exponentially weighted); until the rounds vary enough
to fit, the defaults apply. Each row keeps a per-proposer acceptance rate
(Beta-smoothed, decaying; copies bucketed by how long their source matched): a row
whose copies keep failing carries fewer tokens, and a capped-out row drifts back
toward the prior so it gets to try again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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


def expected_accepted(rate: float, tokens: int) -> float:
    """Expected accepted tokens of a proposal of `tokens` at a per-position rate."""
    if rate >= 1.0:
        return float(tokens)
    return rate * (1 - rate**tokens) / (1 - rate)


class _Fit:
    """Exponentially weighted least squares of y on x."""

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.n = self.x = self.y = self.xx = self.xy = 0.0

    def add(self, x: float, y: float) -> None:
        d = self.decay
        self.n = self.n * d + 1
        self.x = self.x * d + x
        self.y = self.y * d + y
        self.xx = self.xx * d + x * x
        self.xy = self.xy * d + x * y

    def mean(self) -> tuple[float, float]:
        return self.x / self.n, self.y / self.n

    def slope(self, min_spread: float) -> float | None:
        if self.n < 8:
            return None
        mx_, my = self.mean()
        var = self.xx / self.n - mx_ * mx_
        if var < min_spread**2:
            return None
        return (self.xy / self.n - mx_ * my) / var


@dataclass
class WidthPolicy:
    """Round cost = fixed + per_token * T, plus `surcharge` once any row carries more
    than its pending token (more attention calls and gathers per layer; 5-11 ms at
    B=4 here). Defaults are this CPU's; the three are
    refitted from the rounds the scheduler times: plain rounds give the fixed part,
    rounds with proposals the per-token slope and their own intercept."""

    fixed: float = 0.055
    per_token: float = 0.004
    surcharge: float = 0.015
    decay: float = 0.97  # weight of older rounds in the fits
    min_spread: float = 1.5  # tokens: std of round sizes needed before fitting a slope

    def __post_init__(self) -> None:
        self._plain = _Fit(self.decay)  # rounds of width 1: x = rows
        self._wide = _Fit(self.decay)  # rounds with proposals: x = tokens

    def observe_round(self, tokens: int, width: int, seconds: float) -> None:
        (self._plain if width == 1 else self._wide).add(tokens, seconds)

    def costs(self) -> tuple[float, float, float]:
        """(fixed, per_token, surcharge) in seconds, fitted where there is data."""
        c = self._wide.slope(self.min_spread)
        if c is None or c <= 0:
            c = self._plain.slope(self.min_spread)
        if c is None or c <= 0:
            c = self.per_token
        fixed = self.fixed
        if self._plain.n >= 8:
            rows, dt = self._plain.mean()
            fixed = max(1e-4, dt - c * rows)
        surcharge = self.surcharge
        if self._wide.n >= 8:
            tokens, dt = self._wide.mean()
            surcharge = max(0.0, dt - c * tokens - fixed)
        return fixed, c, surcharge

    @property
    def rho(self) -> float:
        fixed, c, _ = self.costs()
        return min(1.0, max(0.001, c / fixed))

    def share(self, batch: int) -> float:
        """Seconds a row's accepted token is worth when it ends the row a round sooner
        and that round's share goes to other work (a waiting request, the row's user):
        one row's share of a plain round."""
        fixed, c, _ = self.costs()
        return (fixed + c * batch) / batch

    def threshold(self, batch: int, value: float | None = None) -> float:
        """Least chance of acceptance that pays for one more proposal token worth
        `value` seconds if accepted (default: a row's share of a plain round)."""
        _, c, _ = self.costs()
        v = self.share(batch) if value is None else value
        return min(1.0, c / v) if v > 0 else 1.0

    def cap(self, rate: float, proposed: int, batch: int, value: float | None = None) -> int:
        """Most of `proposed` tokens worth carrying at this acceptance rate."""
        theta = self.threshold(batch, value)
        if rate >= 1.0 or theta <= 0.0:
            return proposed
        if rate <= 0.0 or rate < theta or theta >= 1.0:
            return 0
        return min(proposed, int(math.log(theta) / math.log(rate)))

    def round_pays(self, gain: float, tokens: int) -> bool:
        """Whether a round's verified proposals (`tokens` in all, saving `gain`
        seconds: each one's expected accepted tokens times their worth) pay for the
        surcharge of leaving width 1 plus their tokens."""
        _, c, surcharge = self.costs()
        return gain >= surcharge + c * tokens

    def as_dict(self) -> dict:
        fixed, c, surcharge = self.costs()
        return {
            "fixed_ms": round(fixed * 1000, 2),
            "per_token_ms": round(c * 1000, 3),
            "surcharge_ms": round(surcharge * 1000, 2),
            "rho": round(self.rho, 4),
        }
