"""Intervals for every number a live run's summary reports (live/summary.py,
live/comparisons.py) and for forced replay's repeats (traces/repeats.py): numpy only,
seeded, so a rebuild from the same records gives the same bounds. It sits in traces/
so both layers reach it (live/ imports from traces/, not the other way).

- wilson: a proportion's Wilson score interval (success, wrong-jump rate);
- bootstrap_mean: a mean with a percentile bootstrap CI over its units (tasks or seeds
  of a live run, repeats of a replay);
- bootstrap_stat: any statistic of resampled task rows (a ratio such as cost per
  recovery or the break-even frequency), resamples where it is undefined left out and
  counted;
- sign_flip_p: the paired randomisation test of a mean difference (exact up to
  EXACT_MAX pairs, else seeded Monte Carlo);
- holm: Holm's step-down adjustment of a family of p-values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

BOOTSTRAP = 2000  # resamples per interval
Z95 = 1.959964
EXACT_MAX = 16  # pairs up to which the sign-flip test enumerates every sign pattern (2^16)
PERMUTATIONS = 20000  # Monte Carlo sign patterns above EXACT_MAX


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score 95% interval of a proportion ((0, 1) for n = 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo, hi = max(0.0, centre - half), min(1.0, centre + half)
    return (0.0 if successes == 0 else lo), (1.0 if successes == n else hi)


def _entry(mean: float | None, lo: float | None, hi: float | None, n: int, **extra: Any) -> dict[str, Any]:
    r = lambda v: None if v is None else round(float(v), 6)  # noqa: E731
    return {"mean": r(mean), "lo": r(lo), "hi": r(hi), "n": n, **extra}


def bootstrap_mean(values: Sequence[float], seed: int = 0, n: int = BOOTSTRAP, level: float = 0.95
                   ) -> dict[str, Any]:
    """Mean with a percentile bootstrap CI at `level` (values: one per task or seed)."""
    if not len(values):
        return _entry(None, None, None, 0)
    arr = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = arr[rng.integers(0, len(arr), size=(n, len(arr)))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return _entry(arr.mean(), lo, hi, len(arr))


def bootstrap_stat(rows: Sequence[Sequence[float]], stat: Callable[[np.ndarray], float | None], seed: int = 0,
                   n: int = BOOTSTRAP) -> dict[str, Any]:
    """`stat` of the task rows with a percentile bootstrap 95% CI over resampled rows.
    `stat` takes an array (tasks x columns) and returns None where it is undefined
    (a ratio over 0); such resamples are left out and counted in `undefined`."""
    if not len(rows):
        return _entry(None, None, None, 0, undefined=0)
    arr = np.asarray(rows, dtype=float)
    point = stat(arr)
    rng = np.random.default_rng(seed)
    draws = [stat(arr[idx]) for idx in rng.integers(0, len(arr), size=(n, len(arr)))]
    kept = np.asarray([d for d in draws if d is not None and math.isfinite(d)], dtype=float)
    if point is None or not len(kept):
        return _entry(point, None, None, len(arr), undefined=n - len(kept))
    lo, hi = np.percentile(kept, [2.5, 97.5])
    return _entry(point, lo, hi, len(arr), undefined=n - len(kept))


def sign_flip_p(diffs: Sequence[float], seed: int = 0, n: int = PERMUTATIONS) -> float | None:
    """Two-sided p-value of the paired randomisation test that the mean difference is 0:
    under the null each pair's sign is a coin flip. Exact (every sign pattern) up to
    EXACT_MAX pairs, else `n` seeded patterns (with the observed one counted)."""
    d = np.asarray(diffs, dtype=float)
    if not len(d):
        return None
    observed = abs(d.mean())
    if len(d) <= EXACT_MAX:
        patterns = ((np.arange(1 << len(d))[:, None] >> np.arange(len(d))) & 1) * 2 - 1
        stats = np.abs((patterns * d).mean(axis=1))
        return float(np.mean(stats >= observed - 1e-12))
    signs = np.random.default_rng(seed).choice((-1.0, 1.0), size=(n, len(d)))
    stats = np.abs((signs * d).mean(axis=1))
    return float((np.sum(stats >= observed - 1e-12) + 1) / (n + 1))


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None and is not counted in the family)."""
    known = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(known)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(known):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def exact_binomial_p(k: int, n: int) -> float | None:
    """Two-sided exact binomial test of k of n at p = 1/2 (McNemar's exact test on the
    discordant pairs of a paired success comparison); None for n = 0."""
    if n <= 0:
        return None
    probs = [math.comb(n, i) / 2 ** n for i in range(n + 1)]
    return min(1.0, sum(q for q in probs if q <= probs[k] * (1 + 1e-9)))
