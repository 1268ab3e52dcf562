"""The write-up's numbers and computed sentences: tables and comparisons of a live run's
summary (live/summary.py), each a pure function of the summary dict.

Nothing here types a number: every figure is read from the summary, and every sentence
that compares arms (an R whose CI covers 0, a saving whose CI lies above 0, a recovery
frequency under its break-even) is decided from the data, so the same code gives the
opposite sentence when the data say the opposite (tests/test_writeup.py).
"""

from __future__ import annotations

from typing import Any

from jumpahead.live.ground_truth import OLD_OUTCOMES, OUTCOMES


def _outcome_count(tasks: dict[str, Any], key: str) -> Any:
    """A ground-truth outcome's count in a summary, under today's key or the old one."""
    if key in tasks:
        return tasks[key]
    old = next((o for o, new in OLD_OUTCOMES.items() if new == key), None)
    return tasks.get(old) if old else None

BASELINE = "ordinary"


# --- formatting --------------------------------------------------------------------------


def num(value: Any, nd: int = 2) -> str:
    """A number as the write-up prints it (`nd` decimals for floats; "n/a" for None)."""
    if value is None:
        return "n/a"
    if isinstance(value, bool) or isinstance(value, int):
        return str(int(value))
    return f"{float(value):.{nd}f}"


def sec(value: Any, nd: int = 2) -> str:
    """Seconds (a float even where the summary holds an integer 0)."""
    return "n/a" if value is None else num(float(value), nd)


def ci(d: dict[str, Any] | None, nd: int = 2) -> str:
    """A bootstrap entry ({mean, lo, hi}) as "mean (lo to hi)"; "n/a" without a mean."""
    if not d or d.get("mean") is None:
        return "n/a"
    return f"{sec(d['mean'], nd)} ({sec(d['lo'], nd)} to {sec(d['hi'], nd)})"


def per_task(d: dict[str, Any]) -> str:
    """A bootstrap entry in a sentence: "m s per task (95% CI lo to hi)"."""
    return f"{sec(d['mean'])} s per task (95% CI {sec(d['lo'])} to {sec(d['hi'])})"


def solved(s: dict[str, Any]) -> str:
    """Successes / tasks with the Wilson interval."""
    lo, hi = s["success_ci95"]
    return f"{s['successes']}/{s['tasks']} ({num(lo)} to {num(hi)})"


def where(d: dict[str, Any] | None) -> str | None:
    """Where a CI lies against 0: "above", "below", "covers", or None (no CI)."""
    if not d or d.get("lo") is None or d.get("hi") is None:
        return None
    if d["lo"] > 0:
        return "above"
    if d["hi"] < 0:
        return "below"
    return "covers"


def arms_of(summary: dict[str, Any]) -> list[str]:
    """The arms in the summary's order."""
    return list(summary.get("arms") or summary.get("per_arm", {}))


def compared(summary: dict[str, Any]) -> list[str]:
    """The arms measured against the ordinary arm (every arm but the baseline)."""
    return [a for a in arms_of(summary) if a != BASELINE and a in summary.get("per_arm", {})]


# --- tables ------------------------------------------------------------------------------


def results_table(summary: dict[str, Any]) -> str:
    """The per-arm results (BENCHMARKS.md's live A/B table): success with its Wilson CI,
    D/P/H/R and net totals over the paired seeds, per-task bootstrap CIs (D - P - H
    included)."""
    lines = ["| arm | solved (95% CI) | D s | P s | H s | R s | net s | D - P - H / task (CI) "
             "| time to success saved / task (CI) | R / task (CI) | net / task (CI) | paired seeds (unsolved pairs) "
             "| jumps (wrong) |",
             "|" + "---|" * 13]
    for arm in arms_of(summary):
        s = summary["per_arm"][arm]
        t, rec = s["totals"], s.get("recovery", {})
        lines.append("| " + " | ".join([
            arm, solved(s), *(sec(t.get(k)) for k in ("D_s", "P_s", "H_s", "R_s", "net_s")),
            ci(s.get("gain_s_per_task")), ci(s.get("tts_s_saved_per_task")), ci(s.get("R_s_per_task")), ci(s.get("net_s_per_task")),
            f"{t.get('tasks', 0)} ({s.get('unsolved_pairs', 0)})",
            f"{rec.get('jump_interventions', 0)} ({rec.get('wrong', 0)})"]) + " |")
    return "\n".join(lines)


def truth_table(summary: dict[str, Any]) -> str:
    """Calls by their ground-truth label and wrong-call tasks by what became of the files
    the wrong call changed (summary `ground_truth.tasks`: repaired, not_repaired,
    unnoticed; older summaries' `recovered` / `unrecovered`), per arm."""
    lines = ["| arm | calls right | harmless | wrong | wrong-call tasks: files repaired | not repaired | unnoticed |",
             "|" + "---|" * 7]
    for arm in arms_of(summary):
        gt = summary["per_arm"][arm].get("ground_truth", {})
        calls, tasks = gt.get("calls", {}), gt.get("tasks", {})
        lines.append("| " + " | ".join([arm, *(num(calls.get(k)) for k in ("right", "harmless", "wrong")),
                                        *(num(_outcome_count(tasks, k)) for k in OUTCOMES)])
                     + " |")
    return "\n".join(lines)


def _bounds(pair: list[float] | None, nd: int = 3) -> str:
    return "" if not pair else f" ({num(pair[0], nd)} to {num(pair[1], nd)})"


def wrong_rate(rec: dict[str, Any]) -> Any:
    """The wrong-jump rate (older summaries called it `frequency`)."""
    return rec.get("wrong_rate", rec.get("frequency"))


def recovery_table(summary: dict[str, Any]) -> str:
    """Per arm that made jumps: jumps, wrong jumps, the wrong-jump rate (Wilson 95%),
    recovered / unrecovered tasks, cost per recovery and the break-even rate (bootstrap 95%)."""
    lines = ["| arm | jumps | wrong (unattributed) | wrong-jump rate (95% CI) | tasks with a wrong jump: recovered "
             "/ unrecovered (recovered share, Wilson 95% CI) | cost per recovery s (95% CI; from) | break-even wrong-jump rate (95% CI) |",
             "|" + "---|" * 7]
    for arm in arms_of(summary):
        rec = summary["per_arm"][arm].get("recovery", {})
        if not rec.get("jump_interventions"):
            continue
        source = f"; {rec['cost_source']}" if rec.get("cost_source") else ""
        cost = rec.get("cost_per_recovery_ci95")
        lines.append("| " + " | ".join([
            arm, num(rec["jump_interventions"]), f"{num(rec.get('wrong'))} ({num(rec.get('unattributed', 0))})",
            num(wrong_rate(rec), 3) + _bounds(rec.get("wrong_rate_ci95")),
            f"{num(rec.get('recovered_tasks', 0))} / {num(rec.get('unrecovered_tasks', 0))}"
            + (f" (share {num(rec['recovered_share'], 2)}, {num(rec['recovered_share_ci95'][0], 2)} to "
               f"{num(rec['recovered_share_ci95'][1], 2)})" if rec.get("recovered_share") is not None else ""),
            sec(rec.get("cost_per_recovery_s")) + (f" ({sec(cost[0])} to {sec(cost[1])}{source})" if cost
                                                   else (f" ({source[2:]})" if source else "")),
            num(rec.get("breakeven_frequency"), 3) + _bounds(rec.get("breakeven_ci95"))]) + " |")
    if len(lines) == 2:
        return "No arm of this run made a jump intervention."
    return "\n".join(lines)


def comparison_table(summary: dict[str, Any]) -> str:
    """The arm-against-arm table (summary `comparisons`): per pair, the saving of b over a
    per task with its 95% and corrected CIs, the p-values and the verdict."""
    table = summary.get("comparisons") or {}
    rows = table.get("rows") or []
    if not rows:
        return "This run's summary has no arm-against-arm table (rebuild it from the run's records)."
    lines = ["| a | b | paired seeds | saving of b over a, s / task (95% CI) | corrected CI | p | p (Holm) "
             "| solved only by a / only by b | verdict |", "|" + "---|" * 9]
    for r in rows:
        succ = r.get("successes") or {}
        lines.append("| " + " | ".join([
            f"`{r['a']}`", f"`{r['b']}`", num(r.get("pairs")), ci(r.get("saving_s")),
            "n/a" if (r.get("saving_s_corrected") or {}).get("lo") is None else
            f"{sec(r['saving_s_corrected']['lo'])} to {sec(r['saving_s_corrected']['hi'])}",
            num(r.get("p"), 4), num(r.get("p_holm"), 4),
            f"{num(succ.get('a_only', 0))} / {num(succ.get('b_only', 0))}", r.get("verdict", "")]) + " |")
    return "\n".join(lines)


def comparison_sentences(summary: dict[str, Any]) -> list[str]:
    """One sentence per pair of arms, decided by the pair's verdict (live/comparisons.py:
    the Holm-adjusted p under alpha and the corrected interval clear of 0): a faster arm
    is named only there; elsewhere the sentence says no difference is shown."""
    table = summary.get("comparisons") or {}
    out = []
    for r in table.get("rows") or []:
        a, b, d, c = r["a"], r["b"], r.get("saving_s") or {}, r.get("saving_s_corrected") or {}
        if d.get("mean") is None:
            out.append(f"`{a}` and `{b}`: no seed where both reach a success, so no comparison.")
            continue
        corrected = f"corrected CI {sec(c.get('lo'))} to {sec(c.get('hi'))}, Holm p {num(r.get('p_holm'), 4)}"
        if r.get("verdict") == "b faster":
            out.append(f"`{b}` is faster to success than `{a}`: by {per_task(d)}; {corrected}.")
        elif r.get("verdict") == "a faster":  # said from a's side: a's saving over b, bounds negated
            neg = {"mean": -d["mean"], "lo": -d["hi"], "hi": -d["lo"]}
            out.append(f"`{a}` is faster to success than `{b}`: by {per_task(neg)}; corrected CI "
                       f"{sec(-c['hi'])} to {sec(-c['lo'])}, Holm p {num(r.get('p_holm'), 4)}.")
        else:
            out.append(f"`{a}` against `{b}`: no difference shown (saving of `{b}` {per_task(d)}; {corrected}).")
    return out


# --- sentences that compare arms -----------------------------------------------------------


def success_sentence(summary: dict[str, Any], arm: str) -> str:
    """The arm's success against the ordinary arm's: overlap of the Wilson CIs, and the
    seeds only one of the two solved."""
    s, base = summary["per_arm"][arm], summary["per_arm"].get(BASELINE)
    if base is None:
        return f"`{arm}` solved {solved(s)}; the run has no ordinary arm to compare with."
    (lo, hi), (blo, bhi) = s["success_ci95"], base["success_ci95"]
    overlap = lo <= bhi and blo <= hi
    vs = s.get("success_vs_ordinary", {})
    return (f"`{arm}` solved {solved(s)} against the ordinary arm's {solved(base)}; the two intervals "
            + ("overlap, so this run shows no difference in success" if overlap else
               ("do not overlap: the arm solves " + ("more" if lo > bhi else "fewer") + " tasks"))
            + f" ({num(vs.get('arm_only', 0))} seeds only the arm solved, "
              f"{num(vs.get('ordinary_only', 0))} only the ordinary arm).")


def saving_sentence(summary: dict[str, Any], arm: str) -> str:
    """The measured saving in time to success per task: faster, slower or no difference shown."""
    d = summary["per_arm"][arm].get("tts_s_saved_per_task")
    side = where(d)
    if side is None:
        return f"`{arm}`: no seed where both it and the ordinary arm reach a success, so no saving is measured."
    text = {"above": "is faster to success than the ordinary arm",
            "below": "is slower to success than the ordinary arm",
            "covers": "shows no difference in time to success from the ordinary arm (the CI covers 0)"}[side]
    return f"`{arm}` {text}: the saving is {per_task(d)} over {num(d['n'])} paired seeds."


def r_sentence(summary: dict[str, Any], arm: str) -> str:
    """Whether D - P - H explains the measured saving: where R's CI lies against 0."""
    s = summary["per_arm"][arm]
    d = s.get("R_s_per_task")
    side = where(d)
    if side is None:
        return f"`{arm}`: R is not measured (no paired seed with a time to success on both sides)."
    head = f"`{arm}`: R is {per_task(d)}"
    if side == "covers":
        return f"{head}; its CI covers 0: D - P - H explains the measured saving."
    if side == "above":
        return (f"{head}; its CI lies above 0: the measured saving falls short of D - P - H by "
                f"{sec(d['mean'])} s per task, what recovery, failed attempts and their redos cost.")
    return (f"{head}; its CI lies below 0: the measured saving exceeds D - P - H by {sec(-d['mean'])} s per "
            "task, time the accounting does not credit to supplied tokens.")


def breakeven_sentence(summary: dict[str, Any], arm: str) -> str | None:
    """The arm's recovery frequency against its break-even (None for an arm without jumps)."""
    rec = summary["per_arm"][arm].get("recovery", {})
    jumps = rec.get("jump_interventions") or 0
    if not jumps:
        return None
    freq, even, cost = wrong_rate(rec), rec.get("breakeven_frequency"), rec.get("cost_per_recovery_s")
    head = (f"`{arm}`: {num(rec.get('wrong', 0))} of {num(jumps)} jumps wrong (rate {num(freq, 3)}"
            f"{_bounds(rec.get('wrong_rate_ci95'))})")
    if cost is None:
        return f"{head}; no wrong jump had a measured R in this run, so no cost per recovery and no break-even."
    if even is None:
        if cost <= 0:
            return (f"{head}; the measured cost per recovery is {sec(cost)} s (not above 0), "
                    f"so wrong jumps showed no cost to break even against.")
        return f"{head}; D - P - H gives no break-even frequency."
    if even <= 0:
        return (f"{head}; D - P - H is not above 0, so the jumps do not pay even when all are right "
                f"(break-even {num(even, 3)}).")
    rate_ci, even_ci = rec.get("wrong_rate_ci95"), rec.get("breakeven_ci95")
    tail = f"break-even rate {num(even, 3)}{_bounds(even_ci)}, {sec(cost)} s per recovery"
    if freq is not None and freq < even:
        if rate_ci and even_ci and rate_ci[1] < even_ci[0]:  # claimed only with both intervals apart
            return (f"{head}, below the {tail}, the two intervals apart: at this error rate the jumps save more "
                    f"than their wrong ones cost.")
        why = "the intervals overlap" if rate_ci and even_ci else "this summary has no interval for both"
        return (f"{head}, below the {tail}, but {why}: this run does not show that the jumps save more than "
                f"their wrong ones cost.")
    return (f"{head}, at or above the {tail}: at this error rate the wrong jumps cost more than the jumps save.")


def truth_sentence(summary: dict[str, Any], arm: str) -> str:
    """The arm's wrong calls and wrong-call tasks against the ordinary arm's."""
    gt = summary["per_arm"][arm].get("ground_truth", {})
    calls, tasks = gt.get("calls", {}), gt.get("tasks", {})
    n_tasks = sum(int(_outcome_count(tasks, k) or 0) for k in OUTCOMES)
    base = summary["per_arm"].get(BASELINE, {}).get("ground_truth", {}).get("calls", {})
    text = f"`{arm}` made {num(calls.get('wrong', 0))} wrong calls"
    if arm != BASELINE and base:
        more = int(calls.get("wrong", 0)) - int(base.get("wrong", 0))
        text += (f" ({num(abs(more))} {'more' if more > 0 else 'fewer'} than the ordinary arm's "
                 f"{num(base.get('wrong', 0))})" if more else " (as many as the ordinary arm)")
    if not n_tasks:
        return text + "; no task had a wrong call."
    repaired, not_repaired, unnoticed = (int(_outcome_count(tasks, k) or 0) for k in OUTCOMES)
    return (text + f"; of its {num(n_tasks)} tasks with a wrong call, {num(repaired)} had the "
            f"files repaired by a later call, {num(not_repaired)} not repaired and "
            f"{num(unnoticed)} never noticed (no later call touched the files the wrong call changed).")


def ranking_sentence(summary: dict[str, Any], best: str, arms: list[str]) -> str:
    """Whether the arm with the largest mean saving is shown ahead of the others: only
    the arm-against-arm table (Holm-corrected, live/comparisons.py) may say so."""
    rows = (summary.get("comparisons") or {}).get("rows")
    others = [a for a in arms if a != best]
    if not others:
        return ""
    if not rows:
        return ("This summary has no arm-against-arm comparison, so the order among the arms is not tested "
                "(a larger mean is not a larger saving).")
    ahead = set()
    for r in rows:
        if r.get("verdict") == "b faster" and r["b"] == best:
            ahead.add(r["a"])
        elif r.get("verdict") == "a faster" and r["a"] == best:
            ahead.add(r["b"])
    behind = [a for a in others if a not in ahead]
    if not behind:
        return f"The Holm-corrected paired comparisons show `{best}` faster than every other arm."
    return (f"The Holm-corrected paired comparisons do not show `{best}` faster than "
            + ", ".join(f"`{a}`" for a in behind) + ": the order among those arms is not established.")


def headline(summary: dict[str, Any]) -> str:
    """The answer in two sentences: the arm that saved the most time to success (its CI
    decides the words), and the arm whose R cost the most."""
    arms = [a for a in compared(summary) if (summary["per_arm"][a].get("tts_s_saved_per_task") or {}).get("mean")
            is not None]
    if not arms:
        return "No arm has a paired seed with a success on both sides, so this run measures no saving."
    per = summary["per_arm"]
    best = max(arms, key=lambda a: per[a]["tts_s_saved_per_task"]["mean"])
    d, t = per[best]["tts_s_saved_per_task"], per[best]["totals"]
    base_tts = (per.get(BASELINE, {}).get("tts_s") or {}).get("mean")
    text = (f"Of the {num(len(arms))} arms measured against ordinary decoding, `{best}` saved the most time to "
            f"success: {per_task(d)}"
            + (f" against the ordinary arm's mean time to success of {sec(base_tts)} s" if base_tts else "")
            + (", a saving whose CI lies above 0" if where(d) == "above" else
               ", though its CI does not exclude 0" if where(d) == "covers" else ", a loss whose CI lies below 0")
            + f"; its supplied tokens replaced {sec(t.get('D_s'))} s of decoding (D) over {num(t.get('tasks'))} "
              f"paired seeds, of which P and H took back {sec((t.get('P_s') or 0) + (t.get('H_s') or 0))} s.")
    text += " " + ranking_sentence(summary, best, arms)
    costly = [a for a in arms if where(per[a].get("R_s_per_task")) == "above"]
    if costly:
        worst = max(costly, key=lambda a: per[a]["R_s_per_task"]["mean"])
        text += (f" Recovery cost the most in `{worst}`: R is {per_task(per[worst]['R_s_per_task'])}, "
                 f"its CI above 0.")
    else:
        text += " No arm's R has a CI above 0: no arm paid a measurable recovery cost."
    return text
