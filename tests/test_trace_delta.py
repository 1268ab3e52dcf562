"""Delta-encoded trace lines (traces/delta.py): a turn line stores what it adds to the
session's previous turn, and the reader gives every turn whole.

The oracle: one session recorded by two recorders on the same server, one writing
deltas and one writing every turn whole, reads back identical turn for turn; the
delta file is a fraction of the whole one. Plus JSON's own distinctions (1, 1.0 and
True are == in Python), a lost base line, and malformed deltas.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
from jumpahead.core.script import Script, ScriptedCall, ScriptTurn
from jumpahead.traces.delta import DeltaError, decode, encode
from jumpahead.traces.formats import load_session
from jumpahead.traces.recorder import TraceRecorder, dumps_line
from jumpahead.traces.trace_file import read_trace

from .serving import script_engine, serve

openai = pytest.importorskip("openai")

TOOLS = [{"type": "function", "function": {"name": "write", "description": "Write a file. " * 40, "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"]}}}]


def _record(index: int, messages: list, tools: list | None = None, extra: dict | None = None) -> dict:
    return {"type": "turn", "index": index, "request": {"headers": {"user-agent": "t"},
                                                        "body": {"messages": messages, "tools": tools or []}},
            "context": {"messages": messages, "tools": tools or []}, "response": {"content": f"answer {index}"},
            **(extra or {})}


def _write(path: Path, records: list[dict], delta: bool = True) -> list[dict]:
    lines, base = [], None
    for r in records:
        lines.append(encode(r, base, dumps_line) if delta else r)
        base = r
    path.write_bytes(dumps_line({"type": "session", "format": "jumpahead-trace", "version": 2, "session": "s"})
                     + b"".join(dumps_line(x) for x in lines))
    return lines


def test_turns_read_back_whole_and_json_types_are_kept(tmp_path):
    strict_1 = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": 1}}]
    history = [{"role": "system", "content": "x" * 500}, {"role": "user", "content": "go", "n": 1}]
    records = [_record(0, list(history), strict_1)]
    history += [{"role": "assistant", "content": "a"}, {"role": "user", "content": "more"}]
    records.append(_record(1, list(history), strict_1, {"request_context": {"messages": history[:3]}}))
    # == in Python, different in JSON: the second message's 1 became 1.0, the tools' 1 True
    changed = [history[0], {**history[1], "n": 1.0}, *history[2:], {"role": "user", "content": "again"}]
    tools = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": True}}]
    assert changed[1] == history[1] and tools == strict_1
    records.append(_record(2, changed, tools))
    records.append(_record(3, [{"role": "user", "content": "new conversation"}], [], {"extra": True}))
    lines = _write(tmp_path / "s.jsonl", records)
    assert "delta" not in lines[0] and lines[1]["delta"] == {
        "of": 0, "keep": {"context.messages": 2, "request.body.messages": 2},
        "same": ["context.tools", "request.body.tools", "request.headers"]}
    assert lines[1]["context"]["messages"] == history[2:4] and "tools" not in lines[1]["context"]
    # the 1 -> 1.0 message is not shared (the written bytes differ), nor are the re-typed tools
    assert lines[2]["delta"]["keep"] == {"context.messages": 1, "request.body.messages": 1}
    assert "context.tools" not in lines[2]["delta"]["same"]
    assert lines[3]["delta"] == {"of": 2, "keep": {}, "same": ["request.headers"]}
    header, turns, warnings = read_trace(tmp_path / "s.jsonl")
    assert warnings == [] and header["version"] == 2
    assert [json.loads(dumps_line(t)) for t in turns] == [json.loads(dumps_line(r)) for r in records]
    assert turns[2]["context"]["messages"][1]["n"] == 1.0 and isinstance(turns[2]["context"]["messages"][1]["n"], float)
    whole = tmp_path / "whole.jsonl"
    _write(whole, records, delta=False)
    assert read_trace(whole)[1] == turns  # a version-1 style file (every turn whole) reads the same


def test_a_lost_base_line_skips_the_turns_that_need_it(tmp_path):
    history = [{"role": "user", "content": "u" * 200}]
    records = []
    for i in range(4):
        history = history + [{"role": "assistant", "content": f"a{i}"}, {"role": "user", "content": f"u{i}"}]
        records.append(_record(i, history))
    _write(tmp_path / "s.jsonl", records)
    lines = (tmp_path / "s.jsonl").read_bytes().splitlines(keepends=True)
    lines[2] = lines[2][:40] + b"\n"  # turn 1 corrupt: turns 2 and 3 extend it, directly or not
    (tmp_path / "s.jsonl").write_bytes(b"".join(lines))
    _, turns, warnings = read_trace(tmp_path / "s.jsonl")
    assert [t["index"] for t in turns] == [0]
    assert len(warnings) == 3 and "corrupt line" in warnings[0]
    assert "extends turn 1" in warnings[1] and "extends turn 2" in warnings[2]


def test_cli_expand_prints_every_turn_whole(tmp_path):
    """`jumpahead traces expand FILE`: each printed line stands alone (no deltas) and
    the lines read back as the file's turns; other files are a CLI error naming them."""
    import subprocess
    import sys

    history = [{"role": "user", "content": "u" * 300}]
    records = []
    for i in range(3):
        history = history + [{"role": "assistant", "content": f"a{i}"}, {"role": "user", "content": f"u{i}"}]
        records.append(_record(i, history, TOOLS))
    path = tmp_path / "s.jsonl"
    raw = _write(path, records)
    assert all("delta" in line for line in raw[1:])

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "jumpahead.app.cli", "traces", "expand", *args],
                              capture_output=True, text=True, timeout=120)

    done = cli(str(path))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in done.stdout.splitlines()]
    assert lines[0]["type"] == "session" and not any("delta" in x for x in lines)
    assert lines[1:] == [json.loads(dumps_line(r)) for r in records]
    assert cli(str(path), "--out", str(tmp_path / "whole.jsonl")).returncode == 0
    assert read_trace(tmp_path / "whole.jsonl")[1] == read_trace(path)[1]
    other = tmp_path / "other.jsonl"
    other.write_text('{"type": "message"}\n')
    for bad, message in ((other, "not a jumpahead-trace file"), (tmp_path / "none.jsonl", "no such file")):
        done = cli(str(bad))
        assert done.returncode == 2 and message in done.stderr and str(bad) in done.stderr, done.stderr


@pytest.mark.parametrize("delta, message", [
    ({"of": 0, "keep": {"context.messages": 9}, "same": []}, "keeps 9 items of a base that has 1 items"),
    ({"of": 0, "keep": {"context.nothing": 1}, "same": []}, "no such list"),
    ({"of": 0, "keep": {}, "same": ["request.body.system"]}, "which has none"),
    ({"of": 0, "keep": ["context.messages"], "same": []}, "must be an object"),
])
def test_malformed_deltas_are_errors(delta, message):
    base = _record(0, [{"role": "user", "content": "hi"}])
    line = {**_record(1, []), "delta": delta}
    with pytest.raises(DeltaError, match=message):
        decode(line, base)


@pytest.fixture(scope="module")
def engine(loaded_model):
    eng = script_engine(loaded_model, max_batch=2)
    yield eng
    eng.close()


def test_a_real_session_recorded_both_ways_reads_back_the_same(engine, tmp_path):
    """Eight turns through the OpenAI SDK, the whole history resent each time, recorded by
    a delta recorder and a whole-turn recorder at once."""
    turns = 8
    script = Script([ScriptTurn(text=f"Step {i}.", tool_calls=[ScriptedCall("write", {"path": f"f{i}.txt",
                                                                                       "content": "x" * 300})])
                     for i in range(turns)], prompt_limit=128)
    deltas = TraceRecorder.for_engine(tmp_path / "delta", engine)
    whole = TraceRecorder(tmp_path / "whole", tokenizer=engine.tokenizer, model=engine.info.name, delta=False)
    with serve(engine, script=script, hooks=[deltas, whole]) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=120,
                               default_headers={"X-Session-Id": "delta-1"})
        messages = [{"role": "system", "content": "You are a careful coding agent. " * 60},
                    {"role": "user", "content": "Write eight files."}]
        for _ in range(turns):
            answer = client.chat.completions.create(model="local", messages=messages, tools=TOOLS).choices[0].message
            (call,) = answer.tool_calls
            messages += [answer.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": "wrote 300 bytes"}]
    (d_file,), (w_file,) = list((tmp_path / "delta").glob("*.jsonl")), list((tmp_path / "whole").glob("*.jsonl"))
    raw = [json.loads(x) for x in d_file.read_text().splitlines()[1:]]
    assert [("delta" in r) for r in raw] == [False] + [True] * (turns - 1)
    assert all(r["delta"]["of"] == r["index"] - 1 for r in raw[1:])
    _, got, warnings = read_trace(d_file)
    _, want, _ = read_trace(w_file)
    assert warnings == [] and len(got) == len(want) == turns

    def comparable(t: dict) -> dict:  # each recorder stamps its own "now"
        return {k: v for k, v in t.items() if k != "timings"}

    assert [comparable(t) for t in got] == [comparable(t) for t in want]
    assert len(got[-1]["request"]["body"]["messages"]) == 2 + 2 * (turns - 1)
    assert d_file.stat().st_size < 0.5 * w_file.stat().st_size, (d_file.stat().st_size, w_file.stat().st_size)
    a, b = load_session(d_file), load_session(w_file)
    assert [(m.role, m.content) for m in a.messages] == [(m.role, m.content) for m in b.messages]


def test_bench_trace_size_on_a_public_session(capsys):
    """`jumpahead bench trace-size`: the delta file reads back as the whole one (checked
    on every run) and is smaller; a missing file is a CLI error."""
    from jumpahead.bench.trace_size import main

    from .conftest import SHARED

    path = SHARED / "traces" / "public" / "swe-agent" / "swe-agent__test-repo-i1.traj"
    if not path.exists():
        pytest.skip(f"{path} is absent (../shared holds the public traces)")
    assert main([str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["identical"] is True and report["turns"] == 5
    assert report["delta_bytes"] * 3 < report["whole_bytes"]
    assert main([str(path.with_name("nope.traj"))]) == 2
    assert "no such file" in capsys.readouterr().err
