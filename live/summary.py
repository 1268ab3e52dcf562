"""The summary of a live run: success, time, and D/P/H/R per arm, paired by seed.

Inputs are the per-task records (live/agent.py TaskRecord.to_json, each turn with the
server's `timings` joined from its trace file by live/runner.py). The definitions are
replay's (traces/replay.py), read off what a live turn's telemetry holds:

- plain_s: the ordinary arm's seconds per decode round, the median over its one-token
  rounds (the trace's `round_ms`; its first chunk holds the prefill);
- D = supplied tokens (completion tokens not `sampled`: strict, echo, jump, ...) x plain_s;
- P = the rounds that carried supplied tokens (more than one token) beyond plain_s, less
  their share of the turn's proposer time (the trace has per-round times, not per-round
  proposer time);
- H = proposer time (`usage.fill.propose_ms`: strict, echo and the policies' boundary
  hooks run inside it) plus the arm's policies' on_request / on_result hooks (the
  `fit` policy, which every arm of the default model runs, is left out);
- R = recovery: a jump intervention is wrong when its label says it was perturbed
  (`mistaken ...`) or the call it went into returned an error; from the first turn with
  a wrong one, the model time (prefill + decode) of the arm's later turns less the
  ordinary arm's later turns on the same seed (replay charges what is decoded after a
  divergence; live, the model itself decodes it). Where the wrong jump ends in a failed
  task that the ordinary arm solved (unrecovered), R also carries the ordinary arm's
  model time on that seed: the redo a user needs, so failing fast never saves time.

Net saving per seed = D - P - H - R, with a paired bootstrap CI over seeds; measured
paired differences of model time and wall time (ordinary - arm) beside it. Recovery
frequency = wrong / jump interventions; cost per recovery = R / wrong; the break-even
recovery frequency is the wrong share at which R would cancel D - P - H:
(D - P - H) / (jump interventions x cost per recovery).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

import numpy as np

BASELINE = "ordinary"
NOT_ARM_POLICIES = ("fit",)  # run by every arm of the default model
BOOTSTRAP = 2000


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score 95% interval of a proportion ((0, 1) for n = 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo, hi = max(0.0, centre - half), min(1.0, centre + half)
    return (0.0 if successes == 0 else lo), (1.0 if successes == n else hi)


def bootstrap_mean(values: list[float], seed: int = 0, n: int = BOOTSTRAP) -> dict[str, Any]:
    """Mean with a percentile bootstrap 95% CI (values are per-seed paired differences)."""
    if not values:
        return {"mean": None, "lo": None, "hi": None, "n": 0}
    arr = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = arr[rng.integers(0, len(arr), size=(n, len(arr)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"mean": round(float(arr.mean()), 6), "lo": round(float(lo), 6), "hi": round(float(hi), 6),
            "n": len(values)}


def distribution(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    vs = sorted(values)
    q = lambda p: float(np.percentile(vs, p))  # noqa: E731
    return {"n": len(vs), "mean": round(statistics.fmean(vs), 4), "median": round(q(50), 4),
            "p10": round(q(10), 4), "p90": round(q(90), 4), "min": round(vs[0], 4), "max": round(vs[-1], 4),
            "total": round(sum(vs), 4)}


# --- per turn and per task -------------------------------------------------------------


def _timings(turn: dict[str, Any]) -> dict[str, Any] | None:
    t = turn.get("timings")
    return t if isinstance(t, dict) and "decode_s" in t else None


def turn_model_s(turn: dict[str, Any]) -> float:
    """Prefill + decode seconds from the server's trace (the turn's wall time where absent)."""
    t = _timings(turn)
    return float(t["prefill_s"]) + float(t["decode_s"]) if t else float(turn.get("wall_s", 0.0))


def _decode_rounds(turn: dict[str, Any]) -> list[tuple[float, int]]:
    """(seconds, tokens) of each decode round of the turn (trace `round_ms` after the
    first chunk, which holds the prefill)."""
    t = _timings(turn) or {}
    out = []
    for item in (t.get("round_ms") or [])[1:]:
        if isinstance(item, (list, tuple)) and len(item) == 2:
            out.append((float(item[0]) / 1000, int(item[1])))
    return out


def plain_round_s(records: list[dict[str, Any]]) -> float | None:
    """The ordinary arm's seconds per decode round: the median over its one-token rounds
    (a median: a loaded machine's stalls would drag a mean); where the trace has no
    per-round times, pooled decode_s / (rounds - 1)."""
    rounds = [s for rec in records for turn in rec.get("turns", []) for s, n in _decode_rounds(turn) if n == 1]
    if rounds:
        return statistics.median(rounds)
    decode = count = 0.0
    for rec in records:
        for turn in rec.get("turns", []):
            t = _timings(turn)
            if t and int(t.get("rounds", 0)) > 1:
                decode += float(t["decode_s"])
                count += int(t["rounds"]) - 1
    return decode / count if count else None


def interventions(turn: dict[str, Any]) -> list[dict[str, Any]]:
    """The turn's boundary interventions (jumps) that supplied tokens."""
    pol = (turn.get("fill") or {}).get("policies") or {}
    items = pol.get("interventions")
    return [i for i in items if isinstance(i, dict) and "boundary" in i and int(i.get("tokens") or 0) > 0] \
        if isinstance(items, list) else []


def wrong(item: dict[str, Any], turn: dict[str, Any]) -> bool:
    label = str(item.get("label") or "")
    if label.startswith("mistaken ") and not label.startswith("mistaken none"):
        return True
    return any(c.get("error") for c in turn.get("calls", []))


def turn_account(turn: dict[str, Any], plain_s: float | None) -> dict[str, float]:
    fill = turn.get("fill") or {}
    tokens = fill.get("tokens") or {}
    supplied = sum(int(n) for k, n in tokens.items() if k != "sampled")
    propose_s = float(fill.get("propose_ms") or 0.0) / 1000
    hooks = 0.0
    for name, rep in ((fill.get("policies") or {}).get("by_policy") or {}).items():
        if name not in NOT_ARM_POLICIES and isinstance(rep, dict):
            hooks += float(rep.get("on_request_ms") or 0.0) + float(rep.get("on_result_ms") or 0.0)
    d = supplied * plain_s if plain_s else 0.0
    p = 0.0
    rounds = _decode_rounds(turn)
    carried = [s for s, n in rounds if n > 1]
    if carried and plain_s:
        # replay's P: the rounds that carried supplied tokens beyond a plain round, less
        # their share of the proposer time (the trace has no per-round proposer time)
        p = sum(s - plain_s for s in carried) - propose_s * len(carried) / len(rounds)
    return {"supplied": supplied, "D_s": d, "P_s": p, "H_s": propose_s + hooks / 1000,
            "model_s": turn_model_s(turn)}


def task_account(rec: dict[str, Any], base: dict[str, Any] | None, plain_s: float | None) -> dict[str, Any]:
    """D, P, H, R and the interventions of one task; `base`: the ordinary arm's record
    on the same seed (R is measured against it)."""
    out = {"seed": rec["seed"], "supplied": 0, "D_s": 0.0, "P_s": 0.0, "H_s": 0.0, "R_s": 0.0, "model_s": 0.0,
           "jumps": 0, "wrong": 0, "first_wrong_turn": None}
    turns = rec.get("turns", [])
    for i, turn in enumerate(turns):
        acc = turn_account(turn, plain_s)
        for k in ("supplied", "D_s", "P_s", "H_s", "model_s"):
            out[k] += acc[k]
        for item in interventions(turn):
            out["jumps"] += 1
            if wrong(item, turn):
                out["wrong"] += 1
                if out["first_wrong_turn"] is None:
                    out["first_wrong_turn"] = i
    k = out["first_wrong_turn"]
    out["unrecovered"] = False
    if k is not None:
        tail = sum(turn_model_s(t) for t in turns[k + 1:])
        base_tail = sum(turn_model_s(t) for t in (base or {}).get("turns", [])[k + 1:])
        out["R_s"] = tail - base_tail
        if base is not None and base.get("success") and not rec.get("success"):
            # a failure is not a saving: the task must be done again, charged at the
            # ordinary arm's model time on this seed (the redo that reaches success)
            out["unrecovered"] = True
            out["R_s"] += sum(turn_model_s(t) for t in base.get("turns", []))
    out["net_s"] = out["D_s"] - out["P_s"] - out["H_s"] - out["R_s"]
    return {key: (round(v, 6) if isinstance(v, float) else v) for key, v in out.items()}


# --- per arm ---------------------------------------------------------------------------


def summarize(records: list[dict[str, Any]], arms: list[str]) -> dict[str, Any]:
    """The summary document of a run's task records."""
    by_arm: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for rec in records:
        by_arm[rec["arm"]][int(rec["seed"])] = rec
    base = by_arm.get(BASELINE, {})
    plain_s = plain_round_s(list(base.values()))
    accounts = {arm: {seed: task_account(rec, base.get(seed), plain_s) for seed, rec in by_arm[arm].items()}
                for arm in arms}
    pooled_wrong = sum(a["wrong"] for acc in accounts.values() for a in acc.values())
    pooled_r = sum(a["R_s"] for acc in accounts.values() for a in acc.values() if a["wrong"])
    pooled_cost = pooled_r / pooled_wrong if pooled_wrong else None
    out_arms = {}
    for arm in arms:
        recs = by_arm.get(arm, {})
        out_arms[arm] = _arm_summary(arm, recs, base, accounts[arm], accounts.get(BASELINE, {}), pooled_cost)
    seeds = sorted({int(r["seed"]) for r in records})
    return {"kind": "jumpahead.live.summary", "version": 1, "arms": arms, "seeds": seeds,
            "plain_round_s": round(plain_s, 6) if plain_s else None,
            "pooled_cost_per_recovery_s": round(pooled_cost, 6) if pooled_cost is not None else None,
            "per_arm": out_arms, "accounts": {a: list(accounts[a].values()) for a in arms},
            "notes": NOTES}


def _arm_summary(arm: str, recs: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]],
                 acc: dict[int, dict[str, Any]], base_acc: dict[int, dict[str, Any]],
                 pooled_cost: float | None) -> dict[str, Any]:
    n = len(recs)
    wins = sum(1 for r in recs.values() if r["success"])
    lo, hi = wilson(wins, n)
    statuses: dict[str, int] = defaultdict(int)
    for r in recs.values():
        statuses[r["status"]] += 1
    walls = [float(r["wall_s"]) for r in recs.values()]
    totals = {k: round(sum(a[k] for a in acc.values()), 6) for k in ("D_s", "P_s", "H_s", "R_s", "model_s")}
    totals["supplied_tokens"] = sum(a["supplied"] for a in acc.values())
    totals["net_s"] = round(totals["D_s"] - totals["P_s"] - totals["H_s"] - totals["R_s"], 6)
    paired = sorted(set(recs) & set(base))
    jumps = sum(a["jumps"] for a in acc.values())
    n_wrong = sum(a["wrong"] for a in acc.values())
    r_wrong = sum(a["R_s"] for a in acc.values() if a["wrong"])
    cost = r_wrong / n_wrong if n_wrong else pooled_cost
    gain = totals["D_s"] - totals["P_s"] - totals["H_s"]
    breakeven = gain / (jumps * cost) if jumps and cost and cost > 0 else None
    out = {
        "tasks": n, "successes": wins, "success_rate": round(wins / n, 4) if n else None,
        "success_ci95": [round(lo, 4), round(hi, 4)], "status": dict(statuses),
        "wall_s_all": distribution(walls),
        "wall_s_success": distribution([float(r["wall_s"]) for r in recs.values() if r["success"]]),
        "model_s_all": distribution([a["model_s"] for a in acc.values()]),
        "turns": distribution([float(len(r["turns"])) for r in recs.values()]),
        "tokens": {k: sum(int(r.get(k, 0)) for r in recs.values())
                   for k in ("prompt_tokens", "completion_tokens", "cached_tokens")},
        "totals": totals,
        "net_s_per_task": bootstrap_mean([acc[s]["net_s"] for s in sorted(acc)]),
        "paired_seeds": len(paired),
        "model_s_saved_per_task": bootstrap_mean([base_acc[s]["model_s"] - acc[s]["model_s"] for s in paired
                                                  if s in base_acc]),
        "wall_s_saved_per_task": bootstrap_mean([float(base[s]["wall_s"]) - float(recs[s]["wall_s"])
                                                 for s in paired]),
        "success_vs_ordinary": {"arm_only": sum(1 for s in paired if recs[s]["success"] and not base[s]["success"]),
                                "ordinary_only": sum(1 for s in paired if base[s]["success"] and not recs[s]["success"])},
        "recovery": {"jump_interventions": jumps, "wrong": n_wrong,
                     "frequency": round(n_wrong / jumps, 4) if jumps else None,
                     "tasks_with_wrong": sum(1 for a in acc.values() if a["wrong"]),
                     "recovered_tasks": sum(1 for s, a in acc.items() if a["wrong"] and recs[s]["success"]),
                     "unrecovered_tasks": sum(1 for a in acc.values() if a.get("unrecovered")),
                     "cost_per_recovery_s": round(cost, 6) if cost is not None else None,
                     "cost_source": "this arm" if n_wrong else ("pooled over arms" if cost is not None else None),
                     "breakeven_frequency": round(breakeven, 4) if breakeven is not None else None},
    }
    return out


NOTES = [
    "success: the task's own check on the workspace (and the final answer); a task without a final answer "
    "(step limit, timeout, error) fails",
    "wall_s_all counts every task (failures and timeouts included); wall_s_success only successes",
    "plain_round_s: the ordinary arm's median s per one-token decode round; D = supplied tokens x plain_round_s",
    "P = rounds carrying supplied tokens beyond plain_round_s, less their share of proposer time; H = proposer "
    "time + the arm's policies' on_request/on_result time (fit excluded)",
    "R: from the first turn with a wrong jump (perturbed label or an error result), the arm's later turns' model "
    "time less the ordinary arm's later turns on the same seed; a task the wrong jump made fail (the ordinary arm "
    "solved it) is also charged the ordinary arm's model time on the seed (the redo)",
    "net_s = D - P - H - R; CIs are 95%: Wilson for success, paired percentile bootstrap over seeds otherwise",
    "breakeven_frequency = (D - P - H) / (jump interventions x cost per recovery)",
]
