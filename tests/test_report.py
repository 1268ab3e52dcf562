"""`jumpahead report`: the real CLI in a subprocess on replay and analysis JSON."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jumpahead.app.cli import COMMANDS
from jumpahead.traces import analysis as A
from jumpahead.core.turn import Message, ToolCall
from jumpahead.traces.session import Session

REPLAY = {
    "kind": "jumpahead.replay", "version": 1, "model": "SmolLM2-135M-Instruct", "arms": ["ordinary", "echo"],
    "sessions": [{
        "id": "sess-1", "source": "x.jsonl", "format": "pi", "turns_total": 3, "turns_replayed": 2, "window": None,
        "turns": [
            {"index": 1, "prompt_tokens": 100, "output_tokens": 40, "arms": {
                "ordinary": {"prefill_s": 0.5, "decode_s": 2.0, "model_s": 2.5, "tokens_by_kind": {"sampled": 40},
                             "rounds": 40, "identical": True, "interventions": []},
                "echo": {"prefill_s": 0.5, "decode_s": 1.0, "model_s": 1.5, "tokens_by_kind": {"sampled": 20, "echo": 20},
                         "rounds": 21, "identical": True,
                         "interventions": [{"kind": "echo", "tokens": 20, "D_s": 1.1, "P_s": 0.05, "H_s": 0.01}]}}},
            {"index": 3, "prompt_tokens": 150, "output_tokens": 30, "arms": {
                "ordinary": {"prefill_s": 0.2, "decode_s": 1.5, "model_s": 2.0, "tokens_by_kind": {"sampled": 30}},
                "echo": {"prefill_s": 0.2, "decode_s": 1.4, "model_s": 1.6,
                         "tokens_by_kind": {"sampled": 28, "echo": 2}}}},
        ],
        "totals": {"ordinary": {"prefill_s": 0.7, "decode_s": 3.5, "model_s": 4.5, "tokens_by_kind": {"sampled": 70}},
                   "echo": {"prefill_s": 0.7, "decode_s": 2.4, "model_s": 3.1,
                            "tokens_by_kind": {"sampled": 48, "echo": 22}}},
        "ratios": {"ordinary": 1.0, "echo": 4.5 / 3.1}, "saved_share": {"ordinary": 0.0, "echo": 1 - 3.1 / 4.5},
    }],
}
REPLAY["summary"] = {k: REPLAY["sessions"][0][k] for k in ("totals", "ratios", "saved_share")}
FIGURE_IDS = ["time-per-arm", "saving-per-turn", "saving-vs-span", "tokens-by-provenance",
              "copyable-by-source", "span-lengths"]


def jumpahead(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jumpahead.app.cli", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def analysis_json(tmp_path_factory) -> Path:
    """A real analysis of a constructed session: a read file written back."""
    body = "\n".join(f"def f{i}(x):\n    return x * {i} + helper(x, depth={i})" for i in range(10))
    s = Session("analysed", "test", [
        Message("user", "copy it"),
        Message("assistant", reasoning="read first", tool_calls=[ToolCall("read", {"path": "a.py"})]),
        Message("tool", body),
        Message("assistant", tool_calls=[ToolCall("write", {"path": "b.py", "content": body})]),
    ])
    r = A.analyze_session(s, A.load_tokenizer())
    result = {"kind": A.KIND, "version": A.VERSION, "window": A.W, "sessions": [r], "overall": A.combine([r])}
    path = tmp_path_factory.mktemp("analysis") / "analysis.json"
    path.write_text(json.dumps(result))
    return path


def check_page(page: str) -> None:
    # self-contained: no script loaded from the network, plotly.js inlined exactly once
    assert not re.search(r"<script[^>]*\bsrc=[\"']?(https?:)?//", page)
    assert len(re.findall(r"plotly\.js v\d", page)) == 1
    assert page.count("<script") >= 2


def test_report_from_replay_and_analysis_json(tmp_path, analysis_json):
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps(REPLAY))
    out = tmp_path / "out" / "report.html"
    proc = jumpahead("report", str(replay), str(analysis_json), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    check_page(page)
    for div in FIGURE_IDS:
        assert f'id="{div}"' in page
    assert "sess-1" in page and "analysed" in page
    side = out.with_suffix(".json")
    assert side.name == "report.json" and side.parent == out.parent
    data = json.loads(side.read_text())
    assert data["kind"] == "jumpahead.report"
    assert [i["kind"] for i in data["inputs"]] == ["jumpahead.replay", "jumpahead.analysis"]
    assert data["inputs"][0]["data"] == REPLAY
    figs = data["figures"]
    assert sorted(figs) == sorted(FIGURE_IDS)
    # the figure data are the inputs' numbers
    bars = {t["name"]: t for t in figs["time-per-arm"]["data"]}
    assert bars["prefill"]["x"] == ["ordinary", "echo"] and bars["decode"]["y"] == [3.5, 2.4]
    assert bars["other model time"]["y"] == pytest.approx([0.3, 0.0])
    (turns,) = figs["saving-per-turn"]["data"]
    assert turns["name"] == "echo" and turns["y"] == pytest.approx([1 - 1.5 / 2.5, 1 - 1.6 / 2.0])
    (span,) = figs["saving-vs-span"]["data"]
    assert span["x"] == [20] and span["y"] == pytest.approx([1.1 - 0.05 - 0.01])
    prov = {t["name"]: t["y"] for t in figs["tokens-by-provenance"]["data"]}
    assert prov == {"sampled": [70, 48], "echo": [0, 22]}
    src = {t["name"]: t["y"] for t in figs["copyable-by-source"]["data"]}
    a = json.loads(analysis_json.read_text())["sessions"][0]
    assert src["(b) context"][0] == pytest.approx(a["shares"]["context"]) and src["(b) context"][0] > 0.9
    assert src["(a) reasoning + text"][0] == 0


def test_replay_without_summary_and_missing_fields(tmp_path):
    """Defensive reading: totals summed from sessions; turns and interventions may be absent."""
    sparse = {"kind": "jumpahead.replay", "sessions": [
        {"id": "a", "totals": {"ordinary": {"prefill_s": 1.0, "decode_s": 2.0, "model_s": 3.0},
                               "jump": {"prefill_s": 1.0, "decode_s": 1.0}}},
        {"id": "b", "totals": {"ordinary": {"prefill_s": 0.5, "decode_s": 0.5, "model_s": 1.0}}, "turns": [{}]},
    ]}
    path = tmp_path / "sparse.json"
    path.write_text(json.dumps(sparse))
    out = tmp_path / "sparse.html"
    proc = jumpahead("report", str(path), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.with_suffix(".json").read_text())
    bars = {t["name"]: t for t in data["figures"]["time-per-arm"]["data"]}
    assert bars["prefill"]["x"] == ["ordinary", "jump"] and bars["prefill"]["y"] == [1.5, 1.0]
    assert "saving-per-turn" not in data["figures"]  # no turns to draw
    check_page(out.read_text())


@pytest.mark.parametrize("content, message", [
    (None, "cannot read"),
    ("{not json", "is not JSON"),
    ('{"kind": "something.else"}', "not a replay or analysis result"),
    ("[1, 2]", "not a replay or analysis result"),
])
def test_bad_input_is_a_one_line_error(tmp_path, content, message):
    path = tmp_path / "in.json"
    if content is not None:
        path.write_text(content)
    proc = jumpahead("report", str(path), "--out", str(tmp_path / "r.html"))
    assert proc.returncode == 2
    assert message in proc.stderr and str(path) in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


def test_out_must_not_be_the_json_path(tmp_path):
    path = tmp_path / "replay.json"
    path.write_text(json.dumps(REPLAY))
    proc = jumpahead("report", str(path), "--out", str(path))
    assert proc.returncode == 2 and "--out" in proc.stderr
    assert json.loads(path.read_text()) == REPLAY


def test_report_from_traces_analyze_json(tmp_path):
    """The real chain on a public session: `traces analyze --json` then `report`."""
    shared = Path(__file__).resolve().parents[2] / "shared" / "traces" / "public"
    session = shared / "mini-swe-agent" / "marshmallow-code__marshmallow-1343.traj.json"
    if not session.is_file():
        pytest.skip(f"{session} is absent: the public sessions live in ../shared")
    if "traces" not in COMMANDS:
        pytest.skip("`jumpahead traces analyze` is not there yet")
    proc = jumpahead("traces", "analyze", str(session), "--json")
    assert proc.returncode == 0, proc.stderr
    analysis = tmp_path / "analysis.json"
    analysis.write_text(proc.stdout)
    result = json.loads(proc.stdout)
    (s,) = result["sessions"]
    out = tmp_path / "report.html"
    proc = jumpahead("report", str(analysis), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    check_page(page)
    assert 'id="copyable-by-source"' in page and 'id="span-lengths"' in page
    assert 'id="time-per-arm"' not in page  # no replay input, no replay plots
    figs = json.loads(out.with_suffix(".json").read_text())["figures"]
    src = {t["name"]: t for t in figs["copyable-by-source"]["data"]}
    assert src["(b) context"]["x"] == [s["id"][:24], "overall"]
    assert src["(b) context"]["y"][0] == pytest.approx(s["shares"]["context"])
    (points,) = figs["span-lengths"]["data"]
    assert len(points["x"]) == sum(1 for c in s["calls"] if c["tokens"] > 0)


@pytest.mark.slow
def test_report_from_a_real_replay_run(tmp_path, loaded_model):
    """A real forced replay (traces/replay.py, ordinary vs echo) of one turn, then the report.

    Slow: two engines each prefill and force ~60 tokens (about 2-3 minutes on the shared
    2-core machine)."""
    try:
        from jumpahead.traces.arms import parse_arms
        from jumpahead.traces.replay import ReplayOptions, replay
    except ImportError:
        pytest.skip("the forced replay (traces/replay.py) is not there yet")
    body = "\n".join(f"total_{i} = price_{i} * count_{i}" for i in range(4))
    session = Session("tiny-replay", "test", [
        Message("user", "Copy totals.py to out.py"),
        Message("assistant", tool_calls=[ToolCall("read", {"path": "totals.py"}, id="c1")]),
        Message("tool", body, tool_call_id="c1", name="read"),
        Message("assistant", tool_calls=[ToolCall("write", {"path": "out.py", "content": body}, id="c2")]),
    ])
    doc = replay([session], ReplayOptions(arms=parse_arms("ordinary,echo"), turns=1, max_context=512,
                                          max_output_tokens=128), loaded_model)
    (s,) = doc["sessions"]
    assert s["turns_replayed"] == 1
    path = tmp_path / "replay.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "replay-report.html"
    proc = jumpahead("report", str(path), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    check_page(out.read_text())
    figs = json.loads(out.with_suffix(".json").read_text())["figures"]
    bars = {t["name"]: t for t in figs["time-per-arm"]["data"]}
    assert bars["decode"]["x"] == ["ordinary", "echo"]
    totals = doc["summary"]["totals"]
    assert bars["decode"]["y"] == pytest.approx([totals["ordinary"]["decode_s"], totals["echo"]["decode_s"]])
    (turn,) = s["turns"]
    (line,) = figs["saving-per-turn"]["data"]
    expected = 1 - turn["arms"]["echo"]["model_s"] / turn["arms"]["ordinary"]["model_s"]
    assert line["name"] == "echo" and line["y"] == pytest.approx([expected])
    prov = {t["name"]: t["y"] for t in figs["tokens-by-provenance"]["data"]}
    assert sum(v[1] for v in prov.values()) == sum(totals["echo"]["tokens_by_kind"].values())
    assert prov.get("echo", [0, 0])[1] > 0  # the written body is echoed from the read result
