"""Forced replay repeated: `jumpahead replay --repeats N`.

Each repeat is a whole replay (traces/replay.py `replay`) on a new `Replayer`: fresh
engines and empty prefix caches for every arm, so no repeat reuses another's cache (the
loaded weights are shared). The replay is deterministic in tokens, so every repeat must
give the same token counts; `check_tokens` compares them turn by turn and a difference
is a `RepeatMismatch` (the CLI's error, exit 1), not noise to average. Seconds differ
from repeat to repeat; those are what the intervals are for.

Per arm, per session and over all sessions (summed), one value per repeat of:

- `model_s`, `prefill_s` (rebuild time: every prefill, the re-prefill behind an edit
  point included), `decode_s`;
- `later_decode_s`: decode seconds on the turns after the arm's first context edit,
  the first replayed turn whose prompt differs from the ordinary arm's (prompt digests,
  traces/replay.py); None where the arm never edits or edits only on the last turn.
  `later_decode_ordinary_s` is the ordinary arm's decode on those same turns, and the
  difference is taken against it;
- `cached_tokens`, `cache_hit_rate` (cached / prompt tokens: cache reuse);
- `prefilled_tokens` (prompt - cached) and `reread_tokens`: per turn, the prefilled
  tokens beyond the ordinary arm's on that turn (max(0, arm - ordinary)), summed: what
  an edit makes the model read again.

Each quantity gets its per-repeat values and their mean with a percentile bootstrap
95% interval over repeats (traces/intervals.py `bootstrap_mean`); each arm but the
ordinary one also the paired difference arm - ordinary per repeat with its interval
and the sign-flip p-value (`sign_flip_p`; exact: with N repeats it cannot go below
2 / 2^N).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from .arms import BASELINE
from .intervals import bootstrap_mean, sign_flip_p
from .replay import ReplayOptions, cache_hit_rate, prefilled_tokens, replay
from .session import Session

TIMES = ("model_s", "prefill_s", "decode_s", "later_decode_s")
TOKENS = ("cached_tokens", "cache_hit_rate", "prefilled_tokens", "reread_tokens")
QUANTITIES = (*TIMES, *TOKENS)
DESCRIPTIONS = {
    "model_s": "engine prefill + decode seconds (replay's model_s)",
    "prefill_s": "prefill seconds: rebuild time, the re-prefill behind an edit point included",
    "decode_s": "decode seconds",
    "later_decode_s": "decode seconds on the turns after the arm's first context edit (the first turn whose "
                      "prompt differs from the ordinary arm's); the difference is against the ordinary arm's "
                      "decode on the same turns (later_decode_ordinary_s)",
    "cached_tokens": "prompt tokens the arm's own prefix cache supplied",
    "cache_hit_rate": "cached_tokens / prompt_tokens",
    "prefilled_tokens": "prompt_tokens - cached_tokens",
    "reread_tokens": "per turn max(0, prefilled tokens - the ordinary arm's), summed: what an edit makes the "
                     "model read again",
}


class RepeatMismatch(ValueError):
    """Token counts that differ between repeats of one replay."""


# --- values of one repeat ----------------------------------------------------------------------


def first_edits(report: dict[str, Any], arms: list[str]) -> dict[str, int | None]:
    """Per arm: the position (in report["turns"]) of the first turn whose prompt differs
    from the ordinary arm's (by prompt digest where the turn has one, else by length)."""
    def key(entry: dict[str, Any]) -> Any:
        return entry.get("prompt_digest", entry["prompt_tokens"])

    out: dict[str, int | None] = {}
    for arm in arms:
        out[arm] = next((k for k, t in enumerate(report["turns"])
                         if key(t["arms"][arm]) != key(t["arms"][BASELINE])), None)
    return out


def session_values(report: dict[str, Any], arms: list[str]) -> dict[str, dict[str, Any]]:
    """One repeat's values of one session (a `sessions[]` entry of a replay document), per arm."""
    turns = report["turns"]
    edits = first_edits(report, arms)
    out: dict[str, dict[str, Any]] = {}
    for arm in arms:
        mine = [t["arms"][arm] for t in turns]
        base = [t["arms"][BASELINE] for t in turns]
        prompt = sum(e["prompt_tokens"] for e in mine)
        cached = sum(e["cached_tokens"] for e in mine)
        v: dict[str, Any] = {q: round(sum(e[q] for e in mine), 6) for q in ("model_s", "prefill_s", "decode_s")}
        summed = {"prompt_tokens": prompt, "cached_tokens": cached}
        v.update(summed, prefilled_tokens=prefilled_tokens(summed), cache_hit_rate=cache_hit_rate(summed, 6),
                 reread_tokens=sum(max(0, prefilled_tokens(a) - prefilled_tokens(b)) for a, b in zip(mine, base)))
        k = edits[arm]
        later = turns[k + 1:] if k is not None else []
        v["later_turns"] = len(later)
        v["later_decode_s"] = round(sum(t["arms"][arm]["decode_s"] for t in later), 6) if later else None
        v["later_decode_ordinary_s"] = (round(sum(t["arms"][BASELINE]["decode_s"] for t in later), 6)
                                        if later else None)
        out[arm] = v
    return out


def overall_values(per_session: list[dict[str, dict[str, Any]]], arms: list[str]) -> dict[str, dict[str, Any]]:
    """One repeat's values over all sessions: sums (later decode over the sessions where
    the arm has later turns), the hit rate from the summed tokens."""
    out: dict[str, dict[str, Any]] = {}
    for arm in arms:
        rows = [s[arm] for s in per_session]
        v: dict[str, Any] = {q: round(sum(r[q] for r in rows), 6) for q in ("model_s", "prefill_s", "decode_s")}
        for q in ("prompt_tokens", "cached_tokens", "prefilled_tokens", "reread_tokens", "later_turns"):
            v[q] = sum(r[q] for r in rows)
        v["cache_hit_rate"] = cache_hit_rate(v, 6)
        for q in ("later_decode_s", "later_decode_ordinary_s"):
            known = [r[q] for r in rows if r[q] is not None]
            v[q] = round(sum(known), 6) if known else None
        out[arm] = v
    return out


# --- the check ---------------------------------------------------------------------------------


def _fingerprint(doc: dict[str, Any], kinds_for: set[str]) -> dict[tuple, Any]:
    """Every token count of a replay document, keyed (session position, id, turn index, arm, field)."""
    out: dict[tuple, Any] = {}
    for s, report in enumerate(doc["sessions"]):
        out[(s, report["id"], None, None, "turns replayed")] = [t["index"] for t in report["turns"]]
        for t in report["turns"]:
            for arm, e in t["arms"].items():
                key = (s, report["id"], t["index"], arm)
                out[(*key, "prompt_tokens")] = e["prompt_tokens"]
                out[(*key, "cached_tokens")] = e["cached_tokens"]
                out[(*key, "output tokens")] = sum(e["tokens_by_kind"].values())
                out[(*key, "identical")] = e["identical"]
                out[(*key, "diverged")] = e["diverged"]
                if "prompt_digest" in e:
                    out[(*key, "prompt_digest")] = e["prompt_digest"]
                if arm in kinds_for:
                    out[(*key, "tokens_by_kind")] = dict(sorted(e["tokens_by_kind"].items()))
    return out


def check_tokens(docs: list[dict[str, Any]], kinds_for: set[str] | None = None) -> None:
    """Raise RepeatMismatch where a repeat's token counts differ from the first repeat's:
    per session, turn and arm the prompt (and its digest), cached and output tokens and
    the identity flags; the output tokens by provenance for the arms in `kinds_for` (None:
    every arm; an arm whose proposals the cost model sizes from measured round times may
    supply different counts from run to run)."""
    if not docs:
        return
    every = {arm for d in docs for s in d["sessions"] for t in s["turns"] for arm in t["arms"]}
    kinds = every if kinds_for is None else set(kinds_for)
    first = _fingerprint(docs[0], kinds)
    problems = []
    for r, doc in enumerate(docs[1:], start=2):
        other = _fingerprint(doc, kinds)
        # per session: which turns were replayed first, then the turns' counts
        for key in sorted(set(first) | set(other), key=lambda k: (k[0], k[2] is not None, repr(k))):
            a, b = first.get(key, "(absent)"), other.get(key, "(absent)")
            if a != b:
                s, sid, index, arm, what = key
                where = f"session {sid}" + (f" turn {index} arm {arm}" if index is not None else "")
                problems.append(f"{where}: {what} {a} in repeat 1, {b} in repeat {r}")
    if problems:
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise RepeatMismatch("token counts differ between repeats (the replay should be deterministic in "
                             "tokens): " + "; ".join(problems[:10]) + more)


# --- the summary -------------------------------------------------------------------------------


def _stat(values: list[Any]) -> dict[str, Any]:
    if any(v is None for v in values):
        return {"values": values, "mean": None, "lo": None, "hi": None, "n": 0}
    return {"values": values, **bootstrap_mean(values)}


def _difference(values: list[Any]) -> dict[str, Any]:
    out = _stat(values)
    out["p"] = None if out["mean"] is None else sign_flip_p(values)
    return out


def summarize_scope(per_repeat: list[dict[str, dict[str, Any]]], arms: list[str]) -> dict[str, Any]:
    """Per arm and quantity: the values over repeats with their mean and interval, and
    per arm but the ordinary one the paired difference arm - ordinary."""
    stats: dict[str, dict[str, Any]] = {}
    diffs: dict[str, dict[str, Any]] = {}
    for arm in arms:
        stats[arm] = {q: _stat([rep[arm][q] for rep in per_repeat])
                      for q in (*QUANTITIES, "later_decode_ordinary_s")}
        stats[arm]["later_turns"] = per_repeat[0][arm]["later_turns"]
        if arm == BASELINE:
            continue
        d: dict[str, Any] = {}
        for q in QUANTITIES:
            against = "later_decode_ordinary_s" if q == "later_decode_s" else q
            against_arm = arm if q == "later_decode_s" else BASELINE
            values = [None if rep[arm][q] is None else round(rep[arm][q] - rep[against_arm][against], 6)
                      for rep in per_repeat]
            d[q] = _difference(values)
        diffs[arm] = d
    return {"arms": stats, "differences": diffs}


def summarize(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The `repeats` section of N replay documents of the same sessions and arms."""
    arms = list(docs[0]["arms"])
    per_repeat_sessions = [[session_values(s, arms) for s in doc["sessions"]] for doc in docs]
    sessions = []
    for k, report in enumerate(docs[0]["sessions"]):
        edits = first_edits(report, arms)
        turns = [t["index"] for t in report["turns"]]
        sessions.append({
            "id": report["id"], "source": report["source"], "turns": turns,
            "first_edit": {a: None if edits[a] is None else turns[edits[a]] for a in arms if a != BASELINE},
            **summarize_scope([rep[k] for rep in per_repeat_sessions], arms),
        })
    overall = summarize_scope([overall_values(rep, arms) for rep in per_repeat_sessions], arms)
    return {
        "n": len(docs), "baseline": BASELINE, "quantities": DESCRIPTIONS,
        "notes": ["each repeat: a whole replay on fresh engines with empty prefix caches",
                  "mean and 95% interval: percentile bootstrap over repeats (traces/intervals.py); "
                  "difference: arm - ordinary per repeat, p: the paired sign-flip test (exact; with N "
                  "repeats it cannot go below 2/2^N)",
                  "token counts are checked equal in every repeat: their intervals are a single point"],
        "sessions": sessions, "overall": overall,
        "wall_s": [d.get("wall_s") for d in docs],
    }


# --- the run -----------------------------------------------------------------------------------


def timed_arms(options: ReplayOptions) -> set[str]:
    """Arms whose supplied-token counts may follow measured round times (a proposal
    method under the cost model): their tokens by provenance are not checked."""
    if not options.cost_aware:
        return set()
    return {a.name for a in options.arms if any(m != "none" for m in a.methods)}


def combine(docs: list[dict[str, Any]], options: ReplayOptions) -> dict[str, Any]:
    """The first repeat's document with the `repeats` section (all N documents in
    `repeats.documents`), after the token check; warnings and wall time of all repeats."""
    kinds_for = {a.name for a in options.arms} - timed_arms(options)
    check_tokens(docs, kinds_for)
    section = summarize(docs)
    section["tokens_by_kind_checked"] = sorted(kinds_for)
    section["documents"] = docs
    out = dict(docs[0])
    out["warnings"] = [f"repeat {r}: {w}" for r, d in enumerate(docs, start=1) for w in d["warnings"]]
    out["wall_s"] = round(sum(d.get("wall_s") or 0.0 for d in docs), 3)
    out["repeats"] = section
    return out


def replay_repeated(sessions: list[Session], options: ReplayOptions, loaded: tuple[Any, Any, Any], repeats: int,
                    progress: Callable[[float, int], Any] | None = None,
                    warn: Callable[[str], None] | None = None,
                    say: Callable[[str], None] | None = None,
                    finish: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """`repeats` whole replays of `sessions` (each a new Replayer: fresh engines, empty
    caches) and their combined document; RepeatMismatch where token counts differ.
    `finish(doc)` is called on each repeat's document (the CLI notes its template)."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    options = dataclasses.replace(options, prompt_digests=True)
    docs = []
    for r in range(1, repeats + 1):
        if say:
            say(f"repeat {r}/{repeats}")
        doc = replay(sessions, options, loaded, progress=progress,
                     warn=None if warn is None else (lambda m, r=r: warn(f"repeat {r}: {m}")))
        if finish:
            finish(doc)
        docs.append(doc)
    return combine(docs, options)
