"""The write-up's figures: deterministic SVG files drawn with matplotlib from a live
run's summary (live/summary.py).

No pyplot state: each figure is a `matplotlib.figure.Figure` saved by the SVG canvas
inside an rc_context that fixes the SVG hash salt (element ids), writes text as text
(`svg.fonttype: none`) and drops the date and creator, so the same summary gives
byte-identical files. Each figure carries the run's command in its footer.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .writeup_text import BASELINE, arms_of

RC: dict[str, Any] = {"svg.hashsalt": "jumpahead-write-up", "svg.fonttype": "none", "font.family": "DejaVu Sans",
                      "font.size": 8, "axes.spines.top": False, "axes.spines.right": False,
                      "path.simplify": True}
METADATA = {"Date": None, "Creator": None}
COLORS = {"D": "#4c9a5b", "P": "#d08c3c", "H": "#b5a642", "R": "#c0504d"}


def _ci_err(values: list[float], los: list[float], his: list[float]) -> list[list[float]]:
    return [[max(0.0, v - lo) for v, lo in zip(values, los)], [max(0.0, hi - v) for v, hi in zip(values, his)]]


def _label(arm: str) -> str:
    """An arm's tick label, broken after ':' and '+' when long."""
    return arm if len(arm) <= 16 else arm.replace(":", ":\n").replace("+", "+\n")


def _axes(fig: Any, arms: list[str]) -> Any:
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xticks(range(len(arms)))
    ax.set_xticklabels([_label(a) for a in arms], rotation=25, ha="right", rotation_mode="anchor")
    ax.axhline(0, color="#555555", linewidth=0.6)
    return ax


def success(fig: Any, summary: dict[str, Any]) -> None:
    """Success rate per arm with its Wilson 95% CI."""
    arms, per = arms_of(summary), summary["per_arm"]
    ax = _axes(fig, arms)
    rates = [per[a].get("success_rate") or 0.0 for a in arms]
    err = _ci_err(rates, [per[a]["success_ci95"][0] for a in arms], [per[a]["success_ci95"][1] for a in arms])
    ax.bar(range(len(arms)), rates, yerr=err, capsize=3,
           color=["#999999" if a == BASELINE else "#4878a8" for a in arms])
    for i, a in enumerate(arms):
        ax.text(i, 0.02, f"{per[a]['successes']}/{per[a]['tasks']}", ha="center", va="bottom", color="white")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("tasks solved (Wilson 95% CI)")
    ax.set_title("Success rate per arm")


def dphr(fig: Any, summary: dict[str, Any]) -> None:
    """D, -P, -H, -R stacked per arm (positive and negative parts stacked apart), net marked."""
    arms, per = arms_of(summary), summary["per_arm"]
    ax = _axes(fig, arms)
    up, down = [0.0] * len(arms), [0.0] * len(arms)
    for key, sign, label in (("D", 1, "D (decode avoided)"), ("P", -1, "-P (carrying)"),
                             ("H", -1, "-H (proposing, hooks)"), ("R", -1, "-R (recovery)")):
        values = [sign * float(per[a]["totals"].get(f"{key}_s") or 0.0) for a in arms]
        bottoms = [u if v >= 0 else d for v, u, d in zip(values, up, down)]
        ax.bar(range(len(arms)), values, bottom=bottoms, color=COLORS[key], label=label)
        up = [u + max(v, 0.0) for u, v in zip(up, values)]
        down = [d + min(v, 0.0) for d, v in zip(down, values)]
    ax.plot(range(len(arms)), [float(per[a]["totals"].get("net_s") or 0.0) for a in arms], "D", color="black",
            markersize=5, label="net D - P - H - R")
    ax.set_ylabel("seconds, totals over the paired seeds")
    ax.set_title("D, P, H and R per arm")
    ax.legend(frameon=False, fontsize=7)


def saving(fig: Any, summary: dict[str, Any]) -> None:
    """Per task: D - P - H (the accounting's prediction), the measured saving in time to
    success (= net D - P - H - R) and R, each with its CI where it has one."""
    arms, per = arms_of(summary), summary["per_arm"]
    ax = _axes(fig, arms)
    width = 0.27
    gain = []
    for a in arms:
        t = per[a]["totals"]
        n = t.get("tasks") or 0
        gain.append((float(t.get("D_s") or 0) - float(t.get("P_s") or 0) - float(t.get("H_s") or 0)) / n if n else 0.0)
    # D - P - H per task: its bootstrap CI where the summary has one (gain_s_per_task)
    ds = [per[a].get("gain_s_per_task") or {} for a in arms]
    err = _ci_err(gain, [float(d["lo"]) if d.get("lo") is not None else v for d, v in zip(ds, gain)],
                  [float(d["hi"]) if d.get("hi") is not None else v for d, v in zip(ds, gain)])
    ax.bar([i - width for i in range(len(arms))], gain, width, yerr=err, capsize=2, color=COLORS["D"],
           label="D - P - H per task (95% CI)")
    for offset, key, color, label in ((0.0, "tts_s_saved_per_task", "#4878a8",
                                       "measured time-to-success saving = net D - P - H - R (95% CI)"),
                                      (width, "R_s_per_task", COLORS["R"], "R per task (95% CI)")):
        ds = [per[a].get(key) or {} for a in arms]
        values = [float(d.get("mean") or 0.0) for d in ds]
        err = _ci_err(values, [float(d["lo"]) if d.get("lo") is not None else v for d, v in zip(ds, values)],
                      [float(d["hi"]) if d.get("hi") is not None else v for d, v in zip(ds, values)])
        ax.bar([i + offset for i in range(len(arms))], values, width, yerr=err, capsize=2, color=color, label=label)
    ax.set_ylabel("seconds per task, paired with ordinary")
    ax.set_title("Saving per task: accounted vs measured")
    ax.legend(frameon=False, fontsize=7)


def recovery(fig: Any, summary: dict[str, Any]) -> None:
    """The wrong-jump rate (Wilson 95%) against the break-even rate (bootstrap 95%), per arm with jumps."""
    per = summary["per_arm"]
    arms = [a for a in arms_of(summary) if (per[a].get("recovery") or {}).get("jump_interventions")]
    ax = _axes(fig, arms)
    if not arms:
        ax.text(0.5, 0.5, "no arm of this run made a jump intervention", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_yticks([])
    width = 0.38
    tops = [0.0]
    for offset, key, bounds, color, label in (
            (-width / 2, "wrong_rate", "wrong_rate_ci95", COLORS["R"],
             "wrong-jump rate (wrong / jumps, Wilson 95% CI)"),
            (width / 2, "breakeven_frequency", "breakeven_ci95", "#4878a8", "break-even rate (bootstrap 95% CI)")):
        recs = [per[a]["recovery"] for a in arms]
        values = [r.get(key, r.get("frequency")) if key == "wrong_rate" else r.get(key) for r in recs]
        drawn = [v or 0.0 for v in values]
        cis = [r.get(bounds) for r in recs]
        err = _ci_err(drawn, [c[0] if c else v for c, v in zip(cis, drawn)],
                      [c[1] if c else v for c, v in zip(cis, drawn)])
        xs = [i + offset for i in range(len(arms))]
        ax.bar(xs, drawn, width, yerr=err, capsize=2, color=color, label=label)
        tops += [c[1] for c in cis if c] + [v for v in values if v is not None]
        for x, v in zip(xs, values):
            ax.text(x, max(v or 0.0, 0.0), "n/a" if v is None else f"{v:.3f}", ha="center", va="bottom",
                    fontsize=6)
    if arms:
        ax.set_ylim(min(0.0, *(per[a]["recovery"].get("breakeven_frequency") or 0.0 for a in arms)) * 1.25,
                    max(0.05, max(tops) * 1.25))
        ax.set_ylabel("share of jumps")
        ax.legend(frameon=False, fontsize=7)
    ax.set_title("Wrong-jump rate and its break-even")


def _footer(fig: Any, text: str) -> None:
    """`text` under everything the figure has drawn (tick labels included)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    bottom = min(ax.get_tightbbox(renderer).transformed(fig.transFigure.inverted()).y0 for ax in fig.axes)
    width = int(130 * fig.get_figwidth() / 7.0)
    fig.text(0.0, bottom - 0.02, "\n".join(textwrap.wrap(text, width)), fontsize=5.5, va="top", color="#444444",
             family="DejaVu Sans Mono")


# name -> (drawing function, caption)
FIGURES: dict[str, tuple[Callable[[Any, dict[str, Any]], None], str]] = {
    "success": (success, "Success rate per arm with its Wilson 95% interval."),
    "dphr": (dphr, "D (up), -P, -H and -R (down) stacked per arm, totals over the seeds where both the arm and "
                   "the ordinary arm reach a success; the diamond is the net D - P - H - R."),
    "saving": (saving, "Per task, paired with the ordinary arm over the seeds both solve within the retry budget "
                       "(a failure paying its redo): D - P - H, the measured saving in time to success (equal to "
                       "net D - P - H - R: R is what the measured saving leaves of D - P - H) and R, each with its "
                       "bootstrap 95% CI where the summary has one."),
    "recovery": (recovery, "Wrong-jump rate (wrong jumps / jumps, Wilson 95% CI) against the break-even rate "
                           "(bootstrap 95% CI where the summary has one), per arm that made jumps."),
}


def write_figures(summary: dict[str, Any], folder: Path, command: str) -> dict[str, Path]:
    """Draw every figure of FIGURES into `folder`/<name>.svg; the paths by name."""
    import matplotlib
    from matplotlib.figure import Figure

    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    with matplotlib.rc_context(RC):
        for name, (draw, _) in FIGURES.items():
            fig = Figure(figsize=(max(7.0, 0.8 * len(arms_of(summary))), 3.6))
            draw(fig, summary)
            _footer(fig, f"Run: {command}")
            path = folder / f"{name}.svg"
            fig.savefig(path, format="svg", metadata=METADATA, bbox_inches="tight", pad_inches=0.08)
            out[name] = path
    return out
