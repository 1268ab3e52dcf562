"""The summary of a live run: success, time to success, and D/P/H/R per arm, paired by seed.

Inputs are the per-task records (live/agent.py TaskRecord.to_json, each turn with the
server's `timings` joined from its trace file by live/command.py). D, P, H, the time to
success and R have one definition, traces/accounting.py (forced replay prices its
interventions with the same code); here they are read off a live turn's telemetry:

- plain_s: the ordinary arm's seconds per decode round, the median over its one-token
  rounds (the trace's `round_ms`; its first chunk holds the prefill);
- D = supplied tokens (completion tokens not `sampled`: strict, echo, jump, ...) x plain_s;
- P = the rounds that carried supplied tokens (more than one token), and the rounds whose
  proposals were all rejected (they carried proposal tokens and emitted one: the
  trace's third `round_ms` field), beyond plain_s, less their share of the turn's
  proposer time (the trace has per-round times, not per-round proposer time); traces
  written before the field existed cannot tell a rejected round from a plain one, and
  there its cost stays in R;
- H = proposer time (`usage.fill.propose_ms`: strict, echo and the policies' boundary
  hooks run inside it, rejected proposals included) plus the arm's policies' on_request
  / on_result hooks (the `fit` policy, which every arm of the default model runs, is
  left out);
- time to success: the task's model time where it succeeded; a failed attempt adds
  one ordinary redo (the ordinary arm's model time on the seed) where the ordinary arm
  solved it; otherwise the task has none and is reported failed, outside the paired
  time figures (`unsolved_pairs`);
- R = recovery, measured: D - P - H less the paired saving in time to success
  (ordinary - arm) on the same seed, for every task of every arm; so net = D - P - H -
  R is the measured saving, and R carries what the interventions cost that D, P, H do
  not see (wrong jumps, detected or not, and noise; its bootstrap CI says how much).

A jump is wrong when its label says it was perturbed (`mistaken ...`) or the call it
supplied is wrong by the ground truth (live/ground_truth.py: the call's effect on the
workspace against the ideal solution's, so silent wrong writes count). Blame is per
call: the jump's call is the turn's call number `calls_done` (the intervention record's
count of calls completed before it), or the turn's only call; a jump in a turn of
several calls without that index is `unattributed` (counted, not blamed unless its
label says perturbed). D counts only correct supplied tokens (traces/accounting.py
`correct_tokens`): a wrong unverified jump's tokens count nothing.

Recovered has one meaning: a task in which the arm made a wrong supplied call and still
succeeded (unrecovered: it failed). Ground truth's file-level outcome of a wrong call
(the record's `truth_outcome`) is called repaired / not repaired / unnoticed here.
Wrong-jump rate = wrong / jump interventions (Wilson interval); cost per recovery = R
of the tasks with a wrong jump / their wrong jumps; the break-even wrong-jump rate is
the one at which that cost would cancel D - P - H: (D - P - H) / (jump interventions x
cost per recovery); both with bootstrap intervals over tasks. Every pair of arms is
compared on the same seeds (live/comparisons.py).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any

import numpy as np

from jumpahead.traces.accounting import RETRIES, correct_tokens, price, recovery_s, time_to_success
from jumpahead.traces.intervals import BOOTSTRAP, bootstrap_mean, bootstrap_stat, wilson

from .comparisons import compare_arms
from .ground_truth import LOOP_REPEATS, OUTCOMES, longest_repeat, outcome_of

BASELINE = "ordinary"
NOT_ARM_POLICIES = ("fit",)  # run by every arm of the default model


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


def _decode_rounds(turn: dict[str, Any]) -> list[tuple[float, int, int]]:
    """(seconds, tokens, proposal tokens carried) of each decode round of the turn
    (trace `round_ms` after the first chunk, which holds the prefill; proposal tokens 0
    where the trace predates that field)."""
    t = _timings(turn) or {}
    out = []
    for item in (t.get("round_ms") or [])[1:]:
        if isinstance(item, (list, tuple)) and len(item) in (2, 3):
            out.append((float(item[0]) / 1000, int(item[1]), int(item[2]) if len(item) == 3 else 0))
    return out


def plain_rounds(records: list[dict[str, Any]]) -> list[float]:
    """Seconds of each one-token decode round in `records` that carried no proposal."""
    return [s for rec in records for turn in rec.get("turns", []) for s, n, k in _decode_rounds(turn)
            if n == 1 and not k]


def plain_round_s(records: list[dict[str, Any]]) -> float | None:
    """The ordinary arm's seconds per decode round: the median over its one-token rounds
    (a median: a loaded machine's stalls would drag a mean); where the trace has no
    per-round times, pooled decode_s / (rounds - 1)."""
    rounds = plain_rounds(records)
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


def policies_report(turn: dict[str, Any]) -> dict[str, Any]:
    """The policies' report of a recorded turn: `usage.report.policies`, or where records
    made before the report channel kept it, `usage.fill.policies`."""
    report = (turn.get("report") or {}).get("policies")
    return report if isinstance(report, dict) else (turn.get("fill") or {}).get("policies") or {}


def interventions(turn: dict[str, Any]) -> list[dict[str, Any]]:
    """The turn's boundary interventions (jumps) that supplied tokens."""
    items = policies_report(turn).get("interventions")
    return [i for i in items if isinstance(i, dict) and "boundary" in i and int(i.get("tokens") or 0) > 0] \
        if isinstance(items, list) else []


def jump_call(item: dict[str, Any], turn: dict[str, Any]) -> dict[str, Any] | None:
    """The call a jump supplied: the turn's call number `calls_done` (calls completed in
    the turn before the jump's boundary: the one it continued or, for an earlier action,
    the next), or the turn's only call; None where the turn has several calls and the
    record no index, or the supplied call never completed."""
    calls = turn.get("calls") or []
    index = item.get("calls_done", item.get("call"))
    if isinstance(index, int) and not isinstance(index, bool):
        return calls[index] if 0 <= index < len(calls) else None
    return calls[0] if len(calls) == 1 else None


def _perturbed(item: dict[str, Any]) -> bool:
    label = str(item.get("label") or "")
    return label.startswith("mistaken ") and not label.startswith("mistaken none")


def wrong(item: dict[str, Any], turn: dict[str, Any]) -> bool | None:
    """Whether a jump was wrong: its policy perturbed it, or the call it supplied is wrong
    by the ground truth (live/ground_truth.py: its effect on the workspace, a silent wrong
    write included; records without ground truth: the call's error result). Per call,
    never per turn: another call of the turn does not blame it. None: not attributable
    to a call (see jump_call)."""
    if _perturbed(item):
        return True
    call = jump_call(item, turn)
    if call is None:
        return None
    if "truth" in call:
        return call.get("truth") == "wrong"
    return bool(call.get("error"))


def wrong_tokens(turn: dict[str, Any]) -> int:
    """Supplied tokens of the turn's wrong unverified jumps (a verified jump's tokens are
    the model's own where accepted, so correct): no decode avoided (accounting.correct_tokens)."""
    total = 0
    for item in interventions(turn):
        if not item.get("verified") and wrong(item, turn):
            supplied = int(item.get("emitted", item.get("tokens")) or 0)
            total += supplied - correct_tokens(supplied, 0)
    return total


def turn_account(turn: dict[str, Any], plain_s: float | None) -> dict[str, float]:
    fill = turn.get("fill") or {}
    tokens = fill.get("tokens") or {}
    supplied = sum(int(n) for k, n in tokens.items() if k != "sampled")
    good = max(0, supplied - wrong_tokens(turn))  # D: correct supplied tokens only
    propose_s = float(fill.get("propose_ms") or 0.0) / 1000
    hooks = 0.0
    for name, rep in (policies_report(turn).get("by_policy") or {}).items():
        if name not in NOT_ARM_POLICIES and isinstance(rep, dict):
            hooks += float(rep.get("on_request_ms") or 0.0) + float(rep.get("on_result_ms") or 0.0)
    rounds = _decode_rounds(turn)
    # rounds that carried supplied tokens, and rounds whose proposals were all rejected
    # (a failure is priced, never left out: D counts only the accepted tokens)
    carried = [s for s, n, k in rounds if n > 1 or k]
    # the trace has no per-round proposer time: each round gets an equal share, and the
    # rest of the proposer time (rounds that carried nothing) counts in H
    share = propose_s / len(rounds) if rounds else 0.0
    cost = price(good, carried, [share] * len(carried), plain_s,
                 other_s=propose_s - share * len(carried) + hooks / 1000)
    return {"supplied": supplied, "correct": good, "D_s": cost.D_s, "P_s": cost.P_s, "H_s": cost.H_s,
            "model_s": turn_model_s(turn), "plain_units": good + len(carried) if plain_s else 0}


def records_model_s(rec: dict[str, Any] | None) -> float | None:
    return None if rec is None else sum(turn_model_s(t) for t in rec.get("turns", []))


def task_account(rec: dict[str, Any], base: dict[str, Any] | None, plain_s: float | None) -> dict[str, Any]:
    """D, P, H, time to success, R and the interventions of one task; `base`: the
    ordinary arm's record on the same seed (the pair R is measured against)."""
    out: dict[str, Any] = {"seed": rec["seed"], "supplied": 0, "correct": 0, "D_s": 0.0, "P_s": 0.0, "H_s": 0.0,
                           "model_s": 0.0, "plain_units": 0, "jumps": 0, "wrong": 0, "unattributed": 0,
                           "first_wrong_turn": None}
    turns = rec.get("turns", [])
    for i, turn in enumerate(turns):
        acc = turn_account(turn, plain_s)
        for k in ("supplied", "correct", "D_s", "P_s", "H_s", "model_s", "plain_units"):
            out[k] += acc[k]
        for item in interventions(turn):
            out["jumps"] += 1
            blamed = wrong(item, turn)
            out["unattributed"] += blamed is None
            if blamed:
                out["wrong"] += 1
                if out["first_wrong_turn"] is None:
                    out["first_wrong_turn"] = i
    base_s, base_ok = records_model_s(base), bool(base and base.get("success"))
    tts = time_to_success(out["model_s"], bool(rec.get("success")), base_s, base_ok)
    base_tts = base_s if base_ok else None
    out["tts_s"] = tts
    # the one meaning of recovered: a wrong supplied call, and the task still succeeded
    out["recovered"] = out["wrong"] > 0 and bool(rec.get("success"))
    out["unrecovered"] = out["wrong"] > 0 and not rec.get("success")
    if tts is not None and base_tts is not None:
        out["saved_s"] = base_tts - tts
        out["R_s"] = recovery_s(out["D_s"] - out["P_s"] - out["H_s"], base_tts, tts)
        out["net_s"] = out["D_s"] - out["P_s"] - out["H_s"] - out["R_s"]
    else:  # no time to success on one side: failed within the budget, outside the paired figures
        out["saved_s"] = out["R_s"] = out["net_s"] = None
    return {key: (round(v, 6) if isinstance(v, float) else v) for key, v in out.items()}


def bootstrap_r(accounts: list[dict[str, Any]], plain_rounds: list[float], plain_s: float | None, seed: int = 0,
                n: int = BOOTSTRAP) -> dict[str, Any]:
    """Mean R per task with a 95% CI that resamples both estimated quantities: the
    tasks (seeds), and plain_s (the median of a resample of the ordinary arm's one-token
    rounds; R moves with it by plain_units x the change: D and P are linear in it)."""
    rows = [(float(a["R_s"]), float(a["plain_units"])) for a in accounts if a.get("R_s") is not None]
    if not rows:
        return {"mean": None, "lo": None, "hi": None, "n": 0}
    arr = np.asarray(rows)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(arr), size=(n, len(arr)))
    shift = np.zeros(n)
    if plain_rounds and plain_s:
        rounds = np.asarray(plain_rounds)
        shift = np.array([np.median(rng.choice(rounds, size=len(rounds))) for _ in range(n)]) - plain_s
    means = (arr[pick, 0] + arr[pick, 1] * shift[:, None]).mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"mean": round(float(arr[:, 0].mean()), 6), "lo": round(float(lo), 6), "hi": round(float(hi), 6),
            "n": len(rows)}


# --- per arm ---------------------------------------------------------------------------


def rejected_rounds_priced(records: list[dict[str, Any]]) -> bool:
    """Whether the traces say which rounds carried proposal tokens (round_ms' third
    field), so that rounds whose proposals were all rejected are priced in P; older
    traces do not, and there that cost stays in R."""
    rounds = [item for rec in records for turn in rec.get("turns", [])
              for item in ((_timings(turn) or {}).get("round_ms") or [])]
    return bool(rounds) and all(isinstance(item, (list, tuple)) and len(item) == 3 for item in rounds)


def summarize(records: list[dict[str, Any]], arms: list[str]) -> dict[str, Any]:
    """The summary document of a run's task records."""
    by_arm: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for rec in records:
        by_arm[rec["arm"]][int(rec["seed"])] = rec
    base = by_arm.get(BASELINE, {})
    plain_s = plain_round_s(list(base.values()))
    accounts = {arm: {seed: task_account(rec, base.get(seed), plain_s) for seed, rec in by_arm[arm].items()}
                for arm in arms}
    # every arm's tasks where R is measured, [R, wrong jumps]: the pooled cost per recovery
    # and, resampled, its interval
    pooled_rows = np.asarray([[a["R_s"], a["wrong"]] for acc in accounts.values() for a in acc.values()
                              if a["R_s"] is not None], dtype=float).reshape(-1, 2)
    pooled_cost = _cost(pooled_rows)
    out_arms = {}
    for arm in arms:
        recs = by_arm.get(arm, {})
        out_arms[arm] = _arm_summary(arm, recs, base, accounts[arm], pooled_cost, plain_rounds(list(base.values())),
                                     plain_s, pooled_rows)
    seeds = sorted({int(r["seed"]) for r in records})
    per_seed = {int(r["seed"]): r for r in records}  # a seed's task is the same in every arm
    tasks = {key: dict(sorted(Counter(str(r.get(key, "unknown")) for r in per_seed.values()).items()))
             for key in ("kind", "steps")}
    return {"kind": "jumpahead.live.summary", "version": 3, "arms": arms, "seeds": seeds, "retries": RETRIES,
            "bootstrap_resamples": BOOTSTRAP, "tasks": tasks,
            "rejected_rounds_priced": rejected_rounds_priced(records),
            "plain_round_s": round(plain_s, 6) if plain_s else None,
            "pooled_cost_per_recovery_s": round(pooled_cost, 6) if pooled_cost is not None else None,
            "per_arm": out_arms, "accounts": {a: list(accounts[a].values()) for a in arms},
            "kind_groups": kind_groups(by_arm, accounts, arms),
            "versus": {arm: versus(by_arm, accounts, base_arm, arm) for arm, base_arm in nested_arms(arms).items()},
            "comparisons": compare_arms(by_arm, accounts, [a for a in arms if by_arm.get(a)]),
            "notes": NOTES}


def nested_arms(arms: list[str]) -> dict[str, str]:
    """Each arm `X+Y` of the run whose arm `X` also ran: {"X+Y": "X"} (`default+drafter`
    against `default`: what adding Y to X changed, paired by seed)."""
    out = {}
    for arm in arms:
        head = arm.rpartition("+")[0]
        if head and head in arms:
            out[arm] = head
    return out


def assistant_output(rec: dict[str, Any]) -> list[Any]:
    """What the model said in a task, turn by turn: content and calls (name, arguments)."""
    return [[t.get("content", ""), [[c.get("name"), c.get("arguments")] for c in t.get("calls", [])]]
            for t in rec.get("turns", [])]


def versus(by_arm: dict[str, dict[int, dict[str, Any]]], accounts: dict[str, dict[int, dict[str, Any]]],
           base_arm: str, arm: str) -> dict[str, Any]:
    """`arm` against `base_arm`, paired by seed: successes, the time to success saved per
    task (base - arm, over the seeds where both have one: a failure never counts as a
    saving, and a task only the base solves shows in `successes`), and on how many seeds
    the two arms said the same thing (an exact method must leave every seed's output as
    it was)."""
    recs, base = by_arm.get(arm, {}), by_arm.get(base_arm, {})
    acc, base_acc = accounts.get(arm, {}), accounts.get(base_arm, {})
    paired = sorted(set(recs) & set(base))
    both = [s for s in paired if acc[s]["tts_s"] is not None and base_acc[s]["tts_s"] is not None]
    return {"base": base_arm, "seeds": len(paired),
            "successes": {base_arm: sum(1 for s in paired if base[s]["success"]),
                          arm: sum(1 for s in paired if recs[s]["success"])},
            "outputs_equal": sum(1 for s in paired if assistant_output(recs[s]) == assistant_output(base[s])),
            "paired_tasks": len(both),
            "tts_s_saved_per_task": bootstrap_mean([float(base_acc[s]["tts_s"]) - float(acc[s]["tts_s"])
                                                    for s in both])}


def kind_group(kind: str) -> str:
    """`long` for the long task kinds (live/world.py LONG_KINDS), else `short`."""
    from .world import LONG_KINDS

    return "long" if kind in LONG_KINDS else "short"


def kind_groups(by_arm: dict[str, dict[int, dict[str, Any]]], accounts: dict[str, dict[int, dict[str, Any]]],
                arms: list[str]) -> dict[str, Any]:
    """Per kind group (short, long) present in the run, per arm: tasks, successes, their
    rate, statuses, turns per task, looped tasks, the time-to-success distribution, and
    the D/P/H/R totals over the group's paired tasks (net = D - P - H - R): the same
    accounts as per_arm, split by the group of each seed's kind."""
    out: dict[str, Any] = {}
    for arm in arms:
        for seed, rec in by_arm.get(arm, {}).items():
            group = out.setdefault(kind_group(str(rec.get("kind"))), {"kinds": set(), "per_arm": {}})
            group["kinds"].add(str(rec.get("kind")))
            row = group["per_arm"].setdefault(arm, {"tasks": 0, "successes": 0, "statuses": Counter(),
                                                    **{k: 0.0 for k in ("D_s", "P_s", "H_s", "R_s")},
                                                    "paired_tasks": 0, "looped_tasks": 0, "turns": 0, "tts": []})
            row["tasks"] += 1
            row["successes"] += int(bool(rec.get("success")))
            row["statuses"][str(rec.get("status"))] += 1
            row["turns"] += len(rec.get("turns", []))
            row["looped_tasks"] += int(looped(rec))
            acc = accounts.get(arm, {}).get(seed)
            if acc is not None and acc.get("tts_s") is not None:
                row["tts"].append(float(acc["tts_s"]))
            if acc is not None and acc["R_s"] is not None:
                row["paired_tasks"] += 1
                for k in ("D_s", "P_s", "H_s", "R_s"):
                    row[k] += acc[k]
    for group in out.values():
        group["kinds"] = sorted(group["kinds"])
        for row in group["per_arm"].values():
            row["success_rate"] = round(row["successes"] / row["tasks"], 6) if row["tasks"] else None
            row["statuses"] = dict(sorted(row["statuses"].items()))
            row["turns_per_task"] = round(row.pop("turns") / row["tasks"], 3) if row["tasks"] else None
            row["tts_s"] = distribution(row.pop("tts"))  # time to success within the retry budget
            for k in ("D_s", "P_s", "H_s", "R_s"):
                row[k] = round(row[k], 6)
            row["net_s"] = round(row["D_s"] - row["P_s"] - row["H_s"] - row["R_s"], 6)
    return dict(sorted(out.items()))


def _cost(rows: np.ndarray) -> float | None:
    """Cost per recovery of task rows [R, wrong jumps where R is measured, ...]: R of the
    tasks with a wrong jump over their wrong jumps."""
    wrong = rows[:, 1].sum()
    return float((rows[:, 0] * (rows[:, 1] > 0)).sum() / wrong) if wrong else None


def _breakeven(rows: np.ndarray) -> float | None:
    """Break-even wrong-jump rate of task rows [R, wrong counted, jumps, D - P - H]:
    (D - P - H) / (jumps x cost per recovery), where that cost is above 0."""
    cost, jumps = _cost(rows), rows[:, 2].sum()
    return float(rows[:, 3].sum() / (jumps * cost)) if cost and cost > 0 and jumps else None


def _pooled_breakeven_ci(rows: np.ndarray, pooled: np.ndarray, seed: int = 0, n: int = BOOTSTRAP) -> dict[str, Any]:
    """Bootstrap 95% CI of (D - P - H) / (jumps x pooled cost): this arm's task rows
    [.., .., jumps, D - P - H] and the pooled rows [R, wrong] resampled independently."""
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n):
        own = rows[rng.integers(0, len(rows), size=len(rows))]
        cost = _cost(pooled[rng.integers(0, len(pooled), size=len(pooled))])
        jumps = own[:, 2].sum()
        if cost and cost > 0 and jumps:
            draws.append(own[:, 3].sum() / (jumps * cost))
    if not draws:
        return {}
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return {"lo": round(float(lo), 6), "hi": round(float(hi), 6)}


def _ci95(d: dict[str, Any]) -> list[float] | None:
    return None if d.get("lo") is None else [d["lo"], d["hi"]]


def _recovery(recs: dict[int, dict[str, Any]], acc: dict[int, dict[str, Any]], counted: list[int],
              gain: float, pooled_cost: float | None, pooled_rows: np.ndarray | None = None) -> dict[str, Any]:
    """Jumps, wrong jumps (rate with its Wilson interval), recovered tasks, cost per
    recovery and the break-even wrong-jump rate (bootstrap intervals over tasks)."""
    jumps = sum(a["jumps"] for a in acc.values())  # the rate: every task's jumps
    n_wrong = sum(a["wrong"] for a in acc.values())
    wrong_counted = sum(acc[s]["wrong"] for s in counted)  # the cost: where R is measured
    cost = _cost(np.asarray([[acc[s]["R_s"], acc[s]["wrong"]] for s in counted], dtype=float).reshape(-1, 2)) \
        if wrong_counted else pooled_cost
    breakeven = gain / (jumps * cost) if jumps and cost and cost > 0 else None
    rows = [[acc[s]["R_s"] if s in counted else 0.0, acc[s]["wrong"] if s in counted else 0, acc[s]["jumps"],
             (acc[s]["D_s"] - acc[s]["P_s"] - acc[s]["H_s"]) if s in counted else 0.0] for s in sorted(acc)]
    cost_ci = bootstrap_stat(rows, _cost) if wrong_counted else {}
    even_ci = bootstrap_stat(rows, _breakeven) if wrong_counted and breakeven is not None else {}
    if not wrong_counted and breakeven is not None and pooled_rows is not None and len(pooled_rows):
        # the cost is other arms' (this arm measured none): its interval resamples their
        # tasks, and the break-even's resamples this arm's tasks and theirs independently
        cost_ci = bootstrap_stat(pooled_rows, _cost)
        even_ci = _pooled_breakeven_ci(np.asarray(rows, dtype=float), pooled_rows)
    lo, hi = wilson(n_wrong, jumps)
    with_wrong = sum(1 for a in acc.values() if a["wrong"])
    recovered = sum(1 for s, a in acc.items() if a["wrong"] and recs[s]["success"])
    r_lo, r_hi = wilson(recovered, with_wrong)
    return {"jump_interventions": jumps, "wrong": n_wrong,
            "unattributed": sum(a.get("unattributed", 0) for a in acc.values()),
            "wrong_rate": round(n_wrong / jumps, 4) if jumps else None,
            "wrong_rate_ci95": [round(lo, 4), round(hi, 4)] if jumps else None,
            "tasks_with_wrong": with_wrong,
            "recovered_tasks": recovered,
            "unrecovered_tasks": with_wrong - recovered,
            # the share of tasks with a wrong jump that still succeeded (Wilson 95%)
            "recovered_share": round(recovered / with_wrong, 4) if with_wrong else None,
            "recovered_share_ci95": [round(r_lo, 4), round(r_hi, 4)] if with_wrong else None,
            "cost_per_recovery_s": round(cost, 6) if cost is not None else None,
            "cost_per_recovery_ci95": _ci95(cost_ci) if cost_ci else None,
            "cost_source": "this arm" if wrong_counted else ("pooled over arms" if cost is not None else None),
            "breakeven_frequency": round(breakeven, 4) if breakeven is not None else None,
            "breakeven_ci95": _ci95(even_ci) if even_ci else None}


def _arm_summary(arm: str, recs: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]],
                 acc: dict[int, dict[str, Any]], pooled_cost: float | None, base_rounds: list[float],
                 plain_s: float | None, pooled_rows: np.ndarray | None = None) -> dict[str, Any]:
    n = len(recs)
    wins = sum(1 for r in recs.values() if r["success"])
    lo, hi = wilson(wins, n)
    statuses: dict[str, int] = defaultdict(int)
    for r in recs.values():
        statuses[r["status"]] += 1
    # the paired figures: seeds where both the arm and the ordinary arm reach a success
    # within the retry budget, a failed attempt paying its redo (net = D - P - H - R =
    # the measured saving there); never the arm's own successes alone
    counted = [s for s in sorted(acc) if acc[s]["R_s"] is not None]
    totals = {k: round(sum(acc[s][k] for s in counted), 6) for k in ("D_s", "P_s", "H_s", "R_s", "model_s")}
    totals["supplied_tokens"] = sum(acc[s]["supplied"] for s in counted)
    totals["correct_tokens"] = sum(acc[s].get("correct", acc[s]["supplied"]) for s in counted)
    totals["net_s"] = round(totals["D_s"] - totals["P_s"] - totals["H_s"] - totals["R_s"], 6)
    totals["tasks"] = len(counted)
    paired = sorted(set(recs) & set(base))
    gain = totals["D_s"] - totals["P_s"] - totals["H_s"]
    return {
        "tasks": n, "successes": wins, "success_rate": round(wins / n, 4) if n else None,
        "success_ci95": [round(lo, 4), round(hi, 4)], "status": dict(statuses),
        # every task's wall clock, failures included (no per-arm figure over successes only:
        # each arm's successes are a different task set)
        "wall_s_all": distribution([float(r["wall_s"]) for r in recs.values()]),
        "model_s_all": distribution([a["model_s"] for a in acc.values()]),
        "tts_s": distribution([float(a["tts_s"]) for a in acc.values() if a["tts_s"] is not None]),
        "unsolved_pairs": sum(1 for s in paired if acc[s]["R_s"] is None),
        "turns": distribution([float(len(r["turns"])) for r in recs.values()]),
        "tokens": {k: sum(int(r.get(k, 0)) for r in recs.values())
                   for k in ("prompt_tokens", "completion_tokens", "cached_tokens")},
        "totals": totals,
        "gain_s_per_task": bootstrap_mean([acc[s]["D_s"] - acc[s]["P_s"] - acc[s]["H_s"] for s in counted]),
        "net_s_per_task": bootstrap_mean([acc[s]["net_s"] for s in counted]),
        "R_s_per_task": bootstrap_r([acc[s] for s in counted], base_rounds, plain_s),
        "paired_seeds": len(paired),
        "tts_s_saved_per_task": bootstrap_mean([acc[s]["saved_s"] for s in counted]),
        "success_vs_ordinary": {"arm_only": sum(1 for s in paired if recs[s]["success"] and not base[s]["success"]),
                                "ordinary_only": sum(1 for s in paired if base[s]["success"] and not recs[s]["success"])},
        "ground_truth": _ground_truth(recs),
        "recovery": _recovery(recs, acc, counted, gain, pooled_cost, pooled_rows),
    }


def _ground_truth(recs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Calls by their ground-truth label, tasks with a wrong call by what followed."""
    calls = [c for r in recs.values() for t in r.get("turns", []) for c in t.get("calls", []) if "truth" in c]
    outcomes = [outcome_of(r) for r in recs.values()]
    return {"calls": {k: sum(1 for c in calls if c["truth"] == k) for k in ("right", "harmless", "wrong")},
            "tasks": {k: outcomes.count(k) for k in OUTCOMES},
            "looped_tasks": sum(1 for r in recs.values() if looped(r))}


def looped(rec: dict[str, Any]) -> bool:
    """Whether the task's model repeated one call LOOP_REPEATS times in a row (a loop);
    read from the calls, so records written before `longest_repeat` count too."""
    return longest_repeat([c for t in rec.get("turns", []) for c in t.get("calls", [])]) >= LOOP_REPEATS


NOTES = [
    "success: the task's own check on the workspace (and the final answer); a task without a final answer "
    "(step limit, timeout, error) fails",
    "wall_s_all counts every task (failures and timeouts included); no wall-time figure over successes only or "
    "wall-time saving is reported: they compare different task sets (time to success, with its retry rule, "
    "is the paired figure)",
    "plain_round_s: the ordinary arm's median s per one-token decode round; D = correct supplied tokens x "
    "plain_round_s (a wrong unverified jump's tokens count nothing; traces/accounting.py correct_tokens)",
    "P = rounds carrying supplied tokens beyond plain_round_s, less their share of proposer time; H = proposer "
    "time (rejected proposals included) + the arm's policies' on_request/on_result time (fit excluded)",
    f"time to success (tts_s): the task's model time where it succeeded; a failed attempt adds {RETRIES} ordinary "
    "redo (the ordinary arm's model time on the seed) where the ordinary arm solved it; otherwise no time to "
    "success: failed within the budget, counted in unsolved_pairs and left out of the paired figures",
    "R = (D - P - H) - (ordinary tts - arm tts) per seed, every arm, not clamped: what the measured saving leaves "
    "unexplained; its CI resamples seeds and plain_round_s",
    "totals, gain_s_per_task (D - P - H), net_s_per_task and tts_s_saved_per_task are over the seeds where both "
    "arms have a time to success, failures paying their redo; net_s = D - P - H - R equals the measured saving there",
    "ground truth: each call's effect on the workspace against the state the task's ideal solution leaves, "
    "texts compared as the task checks compare them (right / wrong / harmless; silent wrong writes and non-zero "
    "exits are wrong); ground_truth.tasks counts what became of the files a wrong call changed (the record's "
    "truth_outcome): repaired by a later call, not_repaired, or unnoticed",
    "recovered (recovery.recovered_tasks): a task whose arm made a wrong supplied call and still succeeded; "
    "unrecovered: one that failed",
    "wrong jumps: a `mistaken` label, or the call the jump supplied is wrong by ground truth (per call: the "
    "record's calls_done, or the turn's only call; jumps in a turn of several calls without it are "
    "`unattributed`); wrong_rate = wrong / jumps with a Wilson interval (which takes jumps as independent: "
    "jumps of one task may not be); cost per recovery = R of tasks with a "
    "wrong jump / their wrong jumps; breakeven_frequency = (D - P - H) / (jumps x cost per recovery); both with "
    "bootstrap intervals over tasks",
    "versus: each arm X+Y against arm X of the same run, paired by seed: time to success saved over the seeds "
    "both have one, successes of each, and the seeds whose assistant output (contents and calls) is equal",
    "comparisons: every pair of arms, paired by seed over the seeds both have a time to success: the mean saving "
    "of b over a with a bootstrap 95% CI and a Bonferroni-corrected CI, a sign-flip test's p with Holm's "
    "correction over the family; a difference is claimed only where the corrected CI excludes 0 and the Holm p "
    "is under alpha",
]
