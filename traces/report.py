"""`jumpahead report`: one self-contained HTML page from replay and analysis JSON.

Inputs are JSON files written by `jumpahead replay` ("kind": "jumpahead.replay") and
`jumpahead traces analyze --json` ("kind": "jumpahead.analysis"); either may be
absent. Plots use plotly with plotly.js inlined once, so the page needs no network.
Beside the page goes a JSON file (same stem) with the inputs and each figure's data.
Replay results come from another tool and may lack fields: every read is defensive.
"""

from __future__ import annotations

import argparse
import html
import sys
from pathlib import Path
from typing import Any

import orjson

REPLAY = "jumpahead.replay"
ANALYSIS = "jumpahead.analysis"
KINDS = (REPLAY, ANALYSIS)

# analysis measures drawn per session (share of tool-call tokens), with legend names
SOURCE_MEASURES = [
    ("reasoning_text", "(a) reasoning + text"), ("reasoning", "(a') reasoning alone"),
    ("context", "(b) context"), ("context_stripped", "(b) context, N→ stripped"),
    ("tool_results", "tool results"), ("calls", "earlier calls"), ("user", "user"), ("system", "system"),
]


class InputError(ValueError):
    """A results file that is missing, not JSON, or of an unknown kind."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", metavar="RESULTS",
                        help="JSON files from `jumpahead replay` or `jumpahead traces analyze --json`")
    parser.add_argument("--out", default="report.html",
                        help="the HTML page to write (default report.html); the JSON goes beside it "
                             "with the same stem (report.json)")


def run(args: argparse.Namespace) -> int:
    try:
        inputs = [load_input(p) for p in args.results]
    except InputError as exc:
        print(f"jumpahead report: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.suffix.lower() == ".json":
        print(f"jumpahead report: --out {out} would be overwritten by the JSON written beside it; "
              "name an .html file", file=sys.stderr)
        return 2
    try:
        html_path, json_path = write_report(inputs, out)
    except OSError as exc:
        print(f"jumpahead report: cannot write {out}: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {html_path} and {json_path}")
    return 0


def load_input(path: str | Path) -> dict[str, Any]:
    """{"path", "kind", "data"} of one results file, or InputError naming the problem."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc.strerror or exc}") from None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"{p} is not JSON: {exc}") from None
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in KINDS:
        raise InputError(f"{p} is not a replay or analysis result (kind {kind!r}; expected one of {', '.join(KINDS)})")
    return {"path": str(p), "kind": kind, "data": data}


# --- defensive readers -----------------------------------------------------------

def _num(d: Any, key: str) -> float:
    v = d.get(key) if isinstance(d, dict) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def _dict(d: Any, key: str) -> dict[str, Any]:
    v = d.get(key) if isinstance(d, dict) else None
    return v if isinstance(v, dict) else {}


def _list(d: Any, key: str) -> list[Any]:
    v = d.get(key) if isinstance(d, dict) else None
    return v if isinstance(v, list) else []


def _arms(data: dict[str, Any]) -> list[str]:
    """The replay's arms in its order, else as they first appear in totals or turns."""
    arms = [a for a in _list(data, "arms") if isinstance(a, str)]
    seen = set(arms)
    for s in _list(data, "sessions"):
        for name in list(_dict(s, "totals")) + [a for t in _list(s, "turns") for a in _dict(t, "arms")]:
            if name not in seen:
                seen.add(name)
                arms.append(name)
    return arms


def _baseline(arms: list[str]) -> str | None:
    return "ordinary" if "ordinary" in arms else (arms[0] if arms else None)


def _replay_totals(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per arm: prefill_s, decode_s, model_s, tokens_by_kind; summed from sessions if no summary."""
    summary = _dict(_dict(data, "summary"), "totals")
    if summary:
        return {a: t for a, t in summary.items() if isinstance(t, dict)}
    totals: dict[str, dict[str, Any]] = {}
    for s in _list(data, "sessions"):
        for arm, t in _dict(s, "totals").items():
            acc = totals.setdefault(arm, {"prefill_s": 0.0, "decode_s": 0.0, "model_s": 0.0, "tokens_by_kind": {}})
            for k in ("prefill_s", "decode_s", "model_s"):
                acc[k] += _num(t, k)
            for kind, n in _dict(t, "tokens_by_kind").items():
                acc["tokens_by_kind"][kind] = acc["tokens_by_kind"].get(kind, 0) + _num({"n": n}, "n")
    return totals


def _label(inp: dict[str, Any], arm: str, many: bool) -> str:
    return f"{Path(inp['path']).stem}: {arm}" if many else arm


# --- figures -----------------------------------------------------------------------

def _fig_time_per_arm(replays: list[dict[str, Any]]) -> Any:
    import plotly.graph_objects as go

    many = len(replays) > 1
    x, prefill, decode, other = [], [], [], []
    for inp in replays:
        totals = _replay_totals(inp["data"])
        for arm in _arms(inp["data"]) or list(totals):
            t = totals.get(arm, {})
            x.append(_label(inp, arm, many))
            prefill.append(_num(t, "prefill_s"))
            decode.append(_num(t, "decode_s"))
            other.append(max(0.0, _num(t, "model_s") - _num(t, "prefill_s") - _num(t, "decode_s")))
    if not x:
        return None
    fig = go.Figure([go.Bar(name="prefill", x=x, y=prefill), go.Bar(name="decode", x=x, y=decode)])
    if any(v > 1e-9 for v in other):
        fig.add_bar(name="other model time", x=x, y=other)
    fig.update_layout(barmode="stack", title="Model time per arm", yaxis_title="seconds")
    return fig


def _fig_saving_per_turn(replays: list[dict[str, Any]]) -> Any:
    import plotly.graph_objects as go

    many = len(replays) > 1
    fig = go.Figure()
    for inp in replays:
        arms = _arms(inp["data"])
        base = _baseline(arms)
        series: dict[str, tuple[list[str], list[float]]] = {a: ([], []) for a in arms if a != base}
        for s in _list(inp["data"], "sessions"):
            sid = str(s.get("id", "?")) if isinstance(s, dict) else "?"
            for t in _list(s, "turns"):
                by_arm = _dict(t, "arms")
                base_s = _num(by_arm.get(base), "model_s")
                if base_s <= 0:
                    continue
                for arm, (xs, ys) in series.items():
                    if arm in by_arm:
                        xs.append(f"{sid[:12]} #{t.get('index', len(xs))}")
                        ys.append(1.0 - _num(by_arm[arm], "model_s") / base_s)
        for arm, (xs, ys) in series.items():
            if xs:
                fig.add_scatter(name=_label(inp, arm, many), x=xs, y=ys, mode="lines+markers")
    if not fig.data:
        return None
    fig.update_layout(title="Share of ordinary model time saved, per turn", xaxis_title="session #turn",
                      yaxis_title="saved share", yaxis_tickformat=".0%")
    return fig


def _fig_saving_vs_span(replays: list[dict[str, Any]]) -> Any:
    import plotly.graph_objects as go

    many = len(replays) > 1
    fig = go.Figure()
    for inp in replays:
        points: dict[str, tuple[list[float], list[float], list[str]]] = {}
        for s in _list(inp["data"], "sessions"):
            for t in _list(s, "turns"):
                for arm, a in _dict(t, "arms").items():
                    for iv in _list(a, "interventions"):
                        if not isinstance(iv, dict):
                            continue
                        xs, ys, texts = points.setdefault(arm, ([], [], []))
                        xs.append(_num(iv, "tokens"))
                        ys.append(_num(iv, "D_s") - _num(iv, "P_s") - _num(iv, "H_s"))
                        texts.append(str(iv.get("kind", "")))
        for arm, (xs, ys, texts) in points.items():
            fig.add_scatter(name=_label(inp, arm, many), x=xs, y=ys, text=texts, mode="markers",
                            hovertemplate="%{text}: %{x} tokens, %{y:.3f} s<extra></extra>")
    if not fig.data:
        return None
    fig.update_layout(title="Saving against span length, per intervention (D - P - H)",
                      xaxis_title="span tokens", yaxis_title="seconds saved")
    return fig


def _fig_tokens_by_provenance(replays: list[dict[str, Any]]) -> Any:
    import plotly.graph_objects as go

    many = len(replays) > 1
    x: list[str] = []
    counts: dict[str, list[float]] = {}
    for inp in replays:
        totals = _replay_totals(inp["data"])
        for arm in _arms(inp["data"]) or list(totals):
            by_kind = _dict(totals.get(arm), "tokens_by_kind")
            x.append(_label(inp, arm, many))
            for kind in by_kind:
                counts.setdefault(kind, [0.0] * (len(x) - 1))
            for kind, col in counts.items():
                col.append(_num(by_kind, kind))
    if not x or not counts:
        return None
    fig = go.Figure([go.Bar(name=kind, x=x, y=col) for kind, col in counts.items()])
    fig.update_layout(barmode="stack", title="Output tokens by provenance, per arm", yaxis_title="tokens")
    return fig


def _fig_copyable_by_source(analyses: list[dict[str, Any]]) -> Any:
    import plotly.graph_objects as go

    names: list[str] = []
    rows: list[dict[str, Any]] = []
    for inp in analyses:
        for s in _list(inp["data"], "sessions"):
            names.append(str(s.get("id", "?"))[:24] if isinstance(s, dict) else "?")
            rows.append(_dict(s, "shares"))
        overall = _dict(inp["data"], "overall")
        if overall:
            names.append("overall" if len(analyses) == 1 else f"overall: {Path(inp['path']).stem}")
            rows.append(_dict(overall, "shares"))
    if not names:
        return None
    fig = go.Figure([go.Bar(name=legend, x=names, y=[_num(r, m) for r in rows]) for m, legend in SOURCE_MEASURES])
    fig.update_layout(barmode="group", title="Tool-call tokens copyable from earlier material, by source",
                      yaxis_title="share of tool-call tokens", yaxis_tickformat=".0%")
    return fig


def _fig_span_lengths(analyses: list[dict[str, Any]]) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for inp in analyses:
        for s in _list(inp["data"], "sessions"):
            calls = [c for c in _list(s, "calls") if isinstance(c, dict) and _num(c, "tokens") > 0]
            if not calls:
                continue
            fig.add_scatter(
                name=str(s.get("id", "?"))[:24], mode="markers",
                x=[_num(c, "tokens") for c in calls], y=[max(_num(c, "longest_span"), 0.5) for c in calls],
                text=[f"{c.get('tool', '?')} (turn {c.get('turn', '?')}): {int(_num(c, 'copyable'))} copyable"
                      for c in calls],
                hovertemplate="%{text}<br>%{x} tokens, longest span %{y}<extra></extra>")
    if not fig.data:
        return None
    fig.update_layout(title="Longest copyable span per tool call (0 drawn at 0.5)", xaxis_type="log",
                      yaxis_type="log", xaxis_title="call tokens", yaxis_title="longest copyable span (tokens)")
    return fig


FIGURES = [  # div id, input kind, builder
    ("time-per-arm", REPLAY, _fig_time_per_arm),
    ("saving-per-turn", REPLAY, _fig_saving_per_turn),
    ("saving-vs-span", REPLAY, _fig_saving_vs_span),
    ("tokens-by-provenance", REPLAY, _fig_tokens_by_provenance),
    ("copyable-by-source", ANALYSIS, _fig_copyable_by_source),
    ("span-lengths", ANALYSIS, _fig_span_lengths),
]


# --- tables --------------------------------------------------------------------------

def _replay_table(inp: dict[str, Any]) -> str:
    data = inp["data"]
    summary = _dict(data, "summary")
    totals = _replay_totals(data)
    ratios, saved = _dict(summary, "ratios"), _dict(summary, "saved_share")
    head = "<tr><th>arm</th><th>model s</th><th>prefill s</th><th>decode s</th><th>ordinary / arm</th><th>saved</th></tr>"
    body = []
    for arm in _arms(data) or list(totals):
        t = totals.get(arm, {})
        ratio = f"{_num(ratios, arm):.2f}x" if arm in ratios else ""
        share = f"{100 * _num(saved, arm):.1f}%" if arm in saved else ""
        body.append(f"<tr><td>{html.escape(arm)}</td><td>{_num(t, 'model_s'):.3f}</td><td>{_num(t, 'prefill_s'):.3f}</td>"
                    f"<td>{_num(t, 'decode_s'):.3f}</td><td>{ratio}</td><td>{share}</td></tr>")
    sessions = _list(data, "sessions")
    caption = (f"{html.escape(Path(inp['path']).name)}: model {html.escape(str(data.get('model', '?')))}, "
               f"{len(sessions)} session(s), "
               f"{sum(int(_num(s, 'turns_replayed')) for s in sessions)} turn(s) replayed")
    return f"<table><caption>{caption}</caption>{head}{''.join(body)}</table>"


def _analysis_table(inp: dict[str, Any]) -> str:
    from .analysis import format_table

    try:
        text = format_table(inp["data"])
    except (KeyError, TypeError, ValueError):
        text = "(this analysis file lacks the fields of a table)"
    return f"<p>{html.escape(Path(inp['path']).name)}</p><pre>{html.escape(text)}</pre>"


# --- the page ------------------------------------------------------------------------

_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}
caption{text-align:left;font-weight:bold}pre{font-size:12px;overflow-x:auto}"""


def build_report(inputs: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """(the HTML page, the JSON beside it: inputs and each figure's plotly data)."""
    import plotly.io as pio

    by_kind = {k: [i for i in inputs if i["kind"] == k] for k in KINDS}
    sections, figures, js_included = [], {}, False
    for div_id, kind, builder in FIGURES:
        if not by_kind[kind]:
            continue
        fig = builder(by_kind[kind])
        if fig is None:
            sections.append(f'<section><p>No data for {div_id.replace("-", " ")}.</p></section>')
            continue
        fig.update_layout(template="plotly_white", height=460)
        figures[div_id] = orjson.loads(pio.to_json(fig))
        # plotly.js (~4 MB) inline in the first figure only: the page works offline
        sections.append("<section>" + fig.to_html(full_html=False, include_plotlyjs=not js_included,
                                                  div_id=div_id, config={"displaylogo": False}) + "</section>")
        js_included = True
    tables = [_replay_table(i) for i in by_kind[REPLAY]] + [_analysis_table(i) for i in by_kind[ANALYSIS]]
    files = ", ".join(html.escape(Path(i["path"]).name) for i in inputs)
    page = (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>jumpahead report</title>"
            f"<style>{_STYLE}</style></head><body><h1>jumpahead report</h1><p>Inputs: {files}</p>"
            + "".join(tables) + "".join(sections) + "</body></html>")
    data = {"kind": "jumpahead.report", "version": 1, "inputs": inputs, "figures": figures}
    return page, data


def write_report(inputs: list[dict[str, Any]], out: Path) -> tuple[Path, Path]:
    page, data = build_report(inputs)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    json_path = out.with_suffix(".json")
    json_path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    return out, json_path
