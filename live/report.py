"""A self-contained HTML page of a live run (plotly.js inlined once, no network needed):
the per-arm table, success with its CI, task wall time (every task: per-arm figures over
successes only compare different task sets), D/P/H/R stacked per arm, the saving per
task with its paired CI, and the wrong-jump rate against its break-even."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any


def _fmt(v: Any, nd: int = 3) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return html.escape(str(v))


def _ci(d: dict[str, Any]) -> str:
    if not d or d.get("mean") is None:
        return ""
    return f"{d['mean']:.3f} [{d['lo']:.3f}, {d['hi']:.3f}]"


def _point(v: Any, bounds: list[float] | None) -> str:
    """A value with its interval where it has one."""
    if v is None:
        return ""
    return _fmt(v) + (f" [{bounds[0]:.3f}, {bounds[1]:.3f}]" if bounds else "")


def table(summary: dict[str, Any]) -> str:
    head = ("<tr><th>arm</th><th>tasks</th><th>success</th><th>95% CI</th><th>wall s median (every task)</th>"
            "<th>D s</th><th>P s</th><th>H s</th><th>R s</th><th>net s</th><th>D-P-H s / task [95% CI]</th>"
            "<th>net s / task [95% CI]</th><th>time to success saved / task [CI]</th>"
            "<th>jumps</th><th>wrong</th><th>recovered / unrecovered tasks</th><th>wrong-jump rate [95% CI]</th>"
            "<th>cost / recovery s [95% CI]</th><th>break-even rate [95% CI]</th></tr>")
    rows = []
    for arm, s in summary.get("per_arm", {}).items():
        t, rec = s.get("totals", {}), s.get("recovery", {})
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in (
            html.escape(arm), s.get("tasks"), _fmt(s.get("success_rate")),
            f"[{s['success_ci95'][0]:.3f}, {s['success_ci95'][1]:.3f}]",
            _fmt(s.get("wall_s_all", {}).get("median"), 2),
            _fmt(t.get("D_s")), _fmt(t.get("P_s")), _fmt(t.get("H_s")), _fmt(t.get("R_s")), _fmt(t.get("net_s")),
            _ci(s.get("gain_s_per_task", {})), _ci(s.get("net_s_per_task", {})), _ci(s.get("tts_s_saved_per_task", {})),
            rec.get("jump_interventions"), rec.get("wrong"),
            f"{rec.get('recovered_tasks', 0)} / {rec.get('unrecovered_tasks', 0)}",
            _point(rec.get("wrong_rate", rec.get("frequency")), rec.get("wrong_rate_ci95")),
            _point(rec.get("cost_per_recovery_s"), rec.get("cost_per_recovery_ci95")),
            _point(rec.get("breakeven_frequency"), rec.get("breakeven_ci95")))) + "</tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def markdown_table(summary: dict[str, Any]) -> str:
    """The per-arm table as Markdown (OUT/table.md; the benchmark notes take it as is):
    totals over the run's tasks, per-task means with their 95% CIs."""
    def ci(d: dict[str, Any]) -> str:
        return "" if not d or d.get("mean") is None else f"{d['mean']:.2f} ({d['lo']:.2f} to {d['hi']:.2f})"

    lines = ["| arm | solved (95% CI) | wall s median, every task | time to success saved per task (CI) | D s | P s "
             "| H s | D-P-H per task (CI) | R s (per task, CI) | net D-P-H-R per task (CI) | jumps (wrong) "
             "| recovered / unrecovered | wrong-jump rate (CI) | cost per recovery s (CI) | break-even rate (CI) |",
             "|" + "---|" * 15]
    for arm, a in summary.get("per_arm", {}).items():
        t, rec = a.get("totals", {}), a.get("recovery", {})
        jumps = rec.get("jump_interventions") or 0

        def bounds(v: Any, pair: list[float] | None, nd: int = 3) -> str:
            return "" if v is None else f"{v:.{nd}f}" + (f" ({pair[0]:.{nd}f} to {pair[1]:.{nd}f})" if pair else "")

        lines.append("| " + " | ".join([
            arm, f"{a['successes']}/{a['tasks']} ({a['success_ci95'][0]:.2f} to {a['success_ci95'][1]:.2f})",
            _fmt(a['wall_s_all'].get('median'), 2), ci(a.get("tts_s_saved_per_task", {})),
            *(_fmt(t.get(k), 1) for k in ("D_s", "P_s", "H_s")), ci(a.get("gain_s_per_task", {})),
            f"{_fmt(t.get('R_s'), 1)} ({ci(a.get('R_s_per_task', {}))})", ci(a.get("net_s_per_task", {})),
            f"{jumps} ({rec.get('wrong', 0)})" if jumps else "",
            f"{rec.get('recovered_tasks', 0)} / {rec.get('unrecovered_tasks', 0)}" if rec.get("wrong") else "",
            bounds(rec.get("wrong_rate", rec.get("frequency")), rec.get("wrong_rate_ci95")) if jumps else "",
            bounds(rec.get("cost_per_recovery_s"), rec.get("cost_per_recovery_ci95"), 2) if rec.get("wrong") else "",
            bounds(rec.get("breakeven_frequency"), rec.get("breakeven_ci95")) if jumps else ""]) + " |")
    return "\n".join(lines) + "\n" + group_table(summary)


def group_table(summary: dict[str, Any], min_groups: int = 2) -> str:
    """Short and long kinds apart (summary `kind_groups`), where a run has at least
    `min_groups` of them (table.md: both; the write-up: also a run of long kinds only)."""
    groups = summary.get("kind_groups") or {}
    if len(groups) < min_groups:
        return ""
    lines = ["", "| " + " | ".join(GROUP_COLUMNS) + " |", "|" + "---|" * len(GROUP_COLUMNS)]
    lines += ["| " + " | ".join(cells) + " |" for cells in _group_rows(groups)]
    return "\n".join(lines) + "\n"


GROUP_COLUMNS = ("kinds", "arm", "solved", "turns per task", "looped", "time to success s median",
                 "paired tasks", "D s", "P s", "H s", "R s", "net D-P-H-R s")


def _group_rows(groups: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name, group in groups.items():
        for arm, g in group.get("per_arm", {}).items():
            rows.append([f"{name} ({', '.join(group.get('kinds', []))})", arm, f"{g['successes']}/{g['tasks']}",
                         _fmt(g.get("turns_per_task"), 1), str(g.get("looped_tasks", "")),
                         _fmt((g.get("tts_s") or {}).get("median"), 2), str(g["paired_tasks"]),
                         *(_fmt(g.get(k), 1) for k in ("D_s", "P_s", "H_s", "R_s", "net_s"))])
    return rows


def html_group_table(summary: dict[str, Any]) -> str:
    """report.html's short/long split (the same cells as table.md's)."""
    groups = summary.get("kind_groups") or {}
    if len(groups) < 2:
        return ""
    head = "<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in GROUP_COLUMNS) + "</tr>"
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
                   for cells in _group_rows(groups))
    return f"<h2>Short and long task kinds</h2><table>{head}{body}</table>"


def figures(summary: dict[str, Any], records: list[dict[str, Any]]) -> list[Any]:
    import plotly.graph_objects as go

    arms = list(summary.get("per_arm", {}))
    per = summary.get("per_arm", {})
    figs = []
    rate = [per[a].get("success_rate") or 0.0 for a in arms]
    lo = [r - per[a]["success_ci95"][0] for a, r in zip(arms, rate)]
    hi = [per[a]["success_ci95"][1] - r for a, r in zip(arms, rate)]
    figs.append(go.Figure(go.Bar(x=arms, y=rate, error_y={"type": "data", "symmetric": False, "array": hi,
                                                          "arrayminus": lo}))
                .update_layout(title="Success rate (Wilson 95% CI)", yaxis_tickformat=".0%"))
    fig = go.Figure()
    for a in arms:
        fig.add_trace(go.Box(y=[r["wall_s"] for r in records if r["arm"] == a], name=a, boxpoints="all"))
    figs.append(fig.update_layout(title="Task wall time: every task (failures and timeouts included)",
                                  yaxis_title="seconds", showlegend=False))
    fig = go.Figure()
    for key, sign, name in (("D_s", 1, "D (decode avoided)"), ("P_s", -1, "-P (carrying supplied tokens)"),
                            ("H_s", -1, "-H (proposing, hooks)"), ("R_s", -1, "-R (recovery)")):
        fig.add_trace(go.Bar(x=arms, y=[sign * per[a]["totals"].get(key, 0.0) for a in arms], name=name))
    fig.add_trace(go.Scatter(x=arms, y=[per[a]["totals"].get("net_s", 0.0) for a in arms], mode="markers",
                             marker={"size": 12, "color": "black"}, name="net D - P - H - R"))
    figs.append(fig.update_layout(barmode="relative", title="D / P / H / R totals per arm (seconds)"))
    fig = go.Figure()
    for label, key in (("D-P-H", "gain_s_per_task"), ("net D-P-H-R", "net_s_per_task"),
                       ("time to success saved (measured)", "tts_s_saved_per_task")):
        ds = [per[a].get(key, {}) for a in arms]
        ys = [d.get("mean") or 0.0 for d in ds]
        fig.add_trace(go.Bar(x=arms, y=ys, name=label, error_y={
            "type": "data", "symmetric": False,
            "array": [(d.get("hi") or 0.0) - y for d, y in zip(ds, ys)],
            "arrayminus": [y - (d.get("lo") or 0.0) for d, y in zip(ds, ys)]}))
    figs.append(fig.update_layout(barmode="group", title="Saving per task vs ordinary (paired bootstrap 95% CI)",
                                  yaxis_title="seconds"))
    rec = [per[a].get("recovery", {}) for a in arms]
    figs.append(go.Figure([
        go.Bar(x=arms, y=[r.get("wrong_rate", r.get("frequency")) or 0.0 for r in rec],
               name="wrong-jump rate (wrong / jumps)"),
        go.Bar(x=arms, y=[r.get("breakeven_frequency") or 0.0 for r in rec], name="break-even wrong-jump rate"),
    ]).update_layout(barmode="group", title="Wrong-jump rate and its break-even", yaxis_tickformat=".0%"))
    return figs


def write_report(summary: dict[str, Any], records: list[dict[str, Any]], out: Path) -> Path:
    parts, js = [], True
    for fig in figures(summary, records):
        parts.append("<section>" + fig.to_html(full_html=False, include_plotlyjs=js) + "</section>")
        js = False
    run = summary.get("run", {})
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in summary.get("notes", []))
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>jumpahead live</title>"
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
            "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}</style></head><body>"
            f"<h1>jumpahead live: {run.get('tasks_per_arm', '?')} tasks per arm</h1>"
            f"<p>adapter: {html.escape(str(run.get('adapter')))}; plain round "
            f"{_fmt(summary.get('plain_round_s'), 4)} s; run wall {_fmt(run.get('wall_s'), 1)} s</p>"
            f"{table(summary)}{html_group_table(summary)}<ul>{notes}</ul>{''.join(parts)}</body></html>")
    out = Path(out)
    out.write_text(page, encoding="utf-8")
    return out
