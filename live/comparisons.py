"""Arm against arm: every pair of a live run's arms, paired by seed.

The quantity is the time to success (traces/accounting.py: a failed attempt pays one
ordinary redo), over the seeds where both arms have one; the saving of `b` over `a`
is a's minus b's. Per pair: the mean with a percentile bootstrap 95% CI, the same at
the Bonferroni-corrected level (95% jointly over the family), a paired sign-flip test's
p-value, and Holm's adjustment of those p-values over the family; successes are
compared on the discordant seeds (McNemar's exact test). A pair's verdict names a
faster arm only where the Holm p is under ALPHA and the corrected CI excludes 0, so
the write-up (research/writeup_text.py) can say which supplied continuation pays more,
not only which beats ordinary decoding.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

from jumpahead.traces.intervals import bootstrap_mean, exact_binomial_p, holm, sign_flip_p

ALPHA = 0.05
RESAMPLES = 10000  # the corrected level reaches far into the tails: more resamples than per-arm CIs


def _pair(a: str, b: str, recs: dict[str, dict[int, dict[str, Any]]], acc: dict[str, dict[int, dict[str, Any]]],
          family: int, seed: int) -> dict[str, Any]:
    seeds = sorted(set(recs[a]) & set(recs[b]))
    both = [s for s in seeds if acc[a][s].get("tts_s") is not None and acc[b][s].get("tts_s") is not None]
    diffs = [float(acc[a][s]["tts_s"]) - float(acc[b][s]["tts_s"]) for s in both]
    a_only = sum(1 for s in seeds if recs[a][s].get("success") and not recs[b][s].get("success"))
    b_only = sum(1 for s in seeds if recs[b][s].get("success") and not recs[a][s].get("success"))
    return {"a": a, "b": b, "seeds": len(seeds), "pairs": len(both),
            "saving_s": bootstrap_mean(diffs, seed=seed, n=RESAMPLES),
            "saving_s_corrected": bootstrap_mean(diffs, seed=seed, n=RESAMPLES, level=1 - ALPHA / max(1, family)),
            "p": sign_flip_p(diffs, seed=seed),
            "successes": {"a_only": a_only, "b_only": b_only, "p_exact": exact_binomial_p(a_only, a_only + b_only)}}


def verdict(row: dict[str, Any], alpha: float = ALPHA) -> str:
    """"b faster", "a faster" or "no difference shown": a side only where the Holm p is
    under `alpha` and the corrected interval lies on that side of 0."""
    ci, p = row.get("saving_s_corrected") or {}, row.get("p_holm")
    if p is None or ci.get("lo") is None or p >= alpha:
        return "no difference shown"
    if ci["lo"] > 0:
        return "b faster"
    if ci["hi"] < 0:
        return "a faster"
    return "no difference shown"


def compare_arms(by_arm: dict[str, dict[int, dict[str, Any]]], accounts: dict[str, dict[int, dict[str, Any]]],
                 arms: list[str]) -> dict[str, Any]:
    """The arm-against-arm table of a run: one row per pair of `arms` (in their order)."""
    pairs = list(combinations(arms, 2))
    rows = [_pair(a, b, by_arm, accounts, len(pairs), seed=i) for i, (a, b) in enumerate(pairs)]
    for row, adjusted in zip(rows, holm([r["p"] for r in rows])):
        row["p_holm"] = None if adjusted is None else round(adjusted, 6)
        row["p"] = None if row["p"] is None else round(row["p"], 6)
        row["verdict"] = verdict(row)
    return {"quantity": "time to success saved per task, b over a (a's tts - b's tts), paired by seed",
            "alpha": ALPHA, "family": len(pairs), "correction": "Holm (p); Bonferroni (corrected CI)",
            "test": "paired sign-flip randomisation test", "resamples": RESAMPLES, "rows": rows}
