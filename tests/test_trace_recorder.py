"""The trace recorder through the real server on the real default model.

Sessions recorded through all three protocols with the official SDKs (one file per
session id, secrets redacted, provenance runs that add up to the output), script-mode
turns and echo runs with source spans, re-import with traces.formats, a real
`jumpahead serve --trace-dir` subprocess killed mid-turn, and hostile session ids.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
from jumpahead.core.exchange import BaseHooks
from jumpahead.core.prompt import render_prompt
from jumpahead.core.script import Script, ScriptedCall, ScriptTurn
from jumpahead.proxy.session_identity import conversation_session_id
from jumpahead.core.turn import Message, ResponseFormat, Turn
from jumpahead.traces.formats import load_session
from jumpahead.traces.recorder import TraceError, TraceRecorder
from jumpahead.traces.trace_file import read_trace
from jumpahead.traces.turn_json import turn_from_json

from .serving import SCRIPT_SLICE, free_port, serve

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

SECRETS = ("sk-ant-secret-41", "sk-resp-secret-42", "sk-chat-secret-43", "sk-body-secret-44")
WRITE = {"name": "write", "description": "Write a file",
         "input_schema": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                          "required": ["path", "content"]}}


@pytest.fixture(scope="module")
def engine(loaded_model, tmp_path_factory):
    from jumpahead.engine.engine import Engine, EngineConfig

    model, tokenizer, info = loaded_model
    eng = Engine(model, tokenizer, info, EngineConfig(max_batch=4, max_asserted=SCRIPT_SLICE,
                                                      prefix_cache_dir=str(tmp_path_factory.mktemp("prompt-cache"))))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def live(engine, tmp_path_factory):
    """A generating server with a recorder: (base URL, trace dir, recorder)."""
    directory = tmp_path_factory.mktemp("traces") / "live"
    recorder = TraceRecorder.for_engine(directory, engine, server={"test": "live"})
    with serve(engine, hooks=[recorder]) as url:
        yield url, directory, recorder
    recorder.close()


class ElideToolResults(BaseHooks):
    """A real context-rewriting hook (as a policy would be): long tool results become a
    stub and the rewrite is noted as an intervention."""

    def before_render(self, exchange, turn):
        messages = []
        for m in turn.messages:
            if m.role == "tool" and len(m.content or "") > 20:
                exchange.notes.setdefault("interventions", []).append({"kind": "elide", "chars": len(m.content)})
                m = Message("tool", "[elided]", tool_call_id=m.tool_call_id, name=m.name)
            messages.append(m)
        return dataclasses.replace(turn, messages=messages)


def _files(directory: Path) -> dict[str, Path]:
    """session id (from each file's header) -> file."""
    out = {}
    for p in sorted(directory.iterdir()):
        header, _, _ = read_trace(p)
        out[header["session"]] = p
    return out


def _tokens(turn: dict) -> list[int]:
    return [t for run in turn["response"]["runs"] for t in run["tokens"]]


def _check_runs(turn: dict, tokenizer: Any, content: str, completion_tokens: int) -> None:
    """The runs add up to the output: as many tokens as the client was told, decoding to
    the text it received (plus the EOS token that ended it), kinds as usage.fill counts."""
    ids = _tokens(turn)
    assert len(ids) == completion_tokens == turn["usage"]["completion_tokens"]
    text = tokenizer.decode(ids)
    assert text.startswith(content) and text[len(content):] in ("", tokenizer.decode([tokenizer.eos_token_id]))
    kinds = Counter()
    for run in turn["response"]["runs"]:
        kinds[run["kind"]] += len(run["tokens"])
        assert run["text"] == tokenizer.decode(run["tokens"])
    assert dict(kinds) == turn["usage"]["fill"]["tokens"]
    runs = turn["response"]["runs"]
    assert all(a["kind"] != b["kind"] or a["source"] or b["source"] for a, b in zip(runs, runs[1:]))  # grouped


def test_three_protocols_stream_and_not_one_file_per_session(live, engine):
    url, directory, recorder = live
    tok = engine.tokenizer
    # Anthropic messages, Claude Code's session header, x-api-key
    claude = anthropic.Anthropic(base_url=url, api_key=SECRETS[0], max_retries=0, timeout=120,
                                 default_headers={"X-Claude-Code-Session-Id": "cc-session-1", "x-api-key": SECRETS[0]})
    history = [{"role": "user", "content": "Say hi."}]
    first = claude.messages.create(model="local", max_tokens=5, messages=history, extra_body={"temperature": 0})
    history += [{"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "Again."}]
    with claude.messages.stream(model="local", max_tokens=5, messages=history, extra_body={"temperature": 0}) as stream:
        second = stream.get_final_message()
    claude_out = [(first.content[0].text, first.usage.output_tokens), (second.content[0].text, second.usage.output_tokens)]

    # OpenAI responses, Codex's session_id header, bearer token
    codex = openai.OpenAI(base_url=f"{url}/v1", api_key=SECRETS[1], max_retries=0, timeout=120,
                          default_headers={"session_id": "codex-session-1"})
    r1 = codex.responses.create(model="local", input="Name a color.", max_output_tokens=5, temperature=0)
    events = list(codex.responses.create(model="local", max_output_tokens=5, temperature=0, stream=True, input=[
        {"role": "user", "content": "Name a color."}, {"role": "assistant", "content": r1.output_text},
        {"role": "user", "content": "Another."}]))
    r2 = events[-1].response
    codex_out = [(r1.output_text, r1.usage.output_tokens), (r2.output_text, r2.usage.output_tokens)]

    # OpenAI chat, no session header: the conversation hash keys the file
    chat = openai.OpenAI(base_url=f"{url}/v1", api_key=SECRETS[2], max_retries=0, timeout=120)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count to three."}]
    c1 = chat.chat.completions.create(model="local", messages=messages, max_tokens=5, temperature=0,
                                      extra_body={"user": "u1", "metadata": {"api_key": SECRETS[3]}})
    messages += [{"role": "assistant", "content": c1.choices[0].message.content}, {"role": "user", "content": "More."}]
    text, usage = "", None
    for chunk in chat.chat.completions.create(model="local", messages=messages, max_tokens=5, temperature=0,
                                              stream=True, stream_options={"include_usage": True}):
        text += "".join(c.delta.content or "" for c in chunk.choices)
        usage = chunk.usage or usage
    chat_out = [(c1.choices[0].message.content, c1.usage.completion_tokens), (text, usage.completion_tokens)]
    conv = conversation_session_id(Turn([Message("system", "Be brief."), Message("user", "Count to three.")]))

    files = _files(directory)
    for sid, protocol, outs, secret_header in [("cc-session-1", "messages", claude_out, "x-api-key"),
                                               ("codex-session-1", "responses", codex_out, "authorization"),
                                               (conv, "chat", chat_out, "authorization")]:
        path = files[sid]
        assert path.parent == directory and path.name == f"{sid}.jsonl"
        raw = path.read_bytes()
        assert not any(s.encode() in raw for s in SECRETS), f"a secret reached {path}"
        header, turns, warnings = read_trace(path)
        assert warnings == [] and header["version"] == 2 and header["model"] == engine.info.name
        assert header["server"] == {"test": "live"}
        assert [t["index"] for t in turns] == [0, 1] and {t["protocol"] for t in turns} == {protocol}
        for turn, (content, n) in zip(turns, outs):
            assert turn["session"] == sid
            headers = {k.lower(): v for k, v in turn["request"]["headers"].items()}
            assert headers[secret_header] == "<redacted>" and headers.get("authorization", "<redacted>") == "<redacted>"
            _check_runs(turn, tok, content, n)
            # the recorded context renders to the prompt the model saw
            assert len(render_prompt(tok, turn_from_json(turn["context"]))) == turn["prompt_tokens"]
            timings = turn["timings"]
            assert timings["total_s"] >= timings["prefill_s"] > 0 and timings["rounds"] >= 1
            assert sum(n for _, n, _ in timings["round_ms"]) == n and all(ms >= 0 for ms, _, _ in timings["round_ms"])
            # each round's proposal tokens (accepted or not): at least every verified one
            verified = (turn["usage"]["fill"] or {}).get("verified", {}).get("proposed", 0)
            assert sum(k for _, _, k in timings["round_ms"]) >= verified
            assert turn["interventions"] == [] and "request_context" not in turn
        assert turns[1]["request"]["body"].get("stream") is True and not turns[0]["request"]["body"].get("stream")
    chat_turn = read_trace(files[conv])[1][0]
    assert chat_turn["request"]["body"]["metadata"] == {"api_key": "<redacted>"}
    assert chat_turn["request"]["body"]["user"] == "u1"

    # re-import: the client's conversation plus each recorded answer, with provenance
    session = load_session(files["cc-session-1"])
    assert session.format == "jumpahead" and session.id == "cc-session-1"
    assert [(m.role, m.content) for m in session.messages] == [
        ("user", "Say hi."), ("assistant", claude_out[0][0]), ("user", "Again."), ("assistant", claude_out[1][0])]
    assert [m.meta["turn_index"] for m in session.messages if m.role == "assistant"] == [0, 1]
    assert session.messages[3].meta["runs"] == read_trace(files["cc-session-1"])[1][1]["response"]["runs"]
    chat_session = load_session(files[conv])
    assert [(m.role, m.content) for m in chat_session.messages] == [
        ("system", "Be brief."), ("user", "Count to three."), ("assistant", chat_out[0][0]), ("user", "More."),
        ("assistant", chat_out[1][0])]
    health = httpx.get(f"{url}/health").json()["traces"]
    assert health["dir"] == str(directory) and health["sessions"] >= 3 and health["turns"] >= 6
    assert health["errors"] == 0


def test_echo_runs_point_at_their_source(live, engine):
    url, directory, _ = live
    code = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="dummy", max_retries=0, timeout=120)
    out = client.chat.completions.create(
        model="local", messages=[{"role": "user", "content": f"Repeat this code exactly:\n```python\n{code}```"}],
        max_tokens=40, temperature=0, extra_body={"jumpahead": {"methods": ["echo"], "session": "echo-session"}})
    _, (turn,), _ = read_trace(directory / "echo-session.jsonl")
    assert turn["methods"] == ["echo"]
    _check_runs(turn, engine.tokenizer, out.choices[0].message.content, out.usage.completion_tokens)
    assert turn["usage"]["fill"] == out.usage.model_extra["fill"]
    prompt = render_prompt(engine.tokenizer, turn_from_json(turn["context"]))
    assert len(prompt) == turn["prompt_tokens"]
    sequence = prompt + _tokens(turn)
    copied = [r for r in turn["response"]["runs"] if r["source"] is not None]
    assert copied and {r["kind"] for r in copied} == {"echo"}
    assert sum(len(r["tokens"]) for r in copied) == out.usage.model_extra["fill"]["tokens"]["echo"] >= 8
    for run in copied:
        start, end = run["source"]
        assert end - start == len(run["tokens"]) and sequence[start:end] == run["tokens"]
    assert all(r["source"] is None for r in turn["response"]["runs"] if r["kind"] == "sampled")


def test_script_mode_turns_rewrites_and_tool_results_reimport(engine, tmp_path):
    recorder = TraceRecorder.for_engine(tmp_path, engine)
    turns = [ScriptTurn(reasoning="I should write it.", text="Writing.",
                        tool_calls=[ScriptedCall("write", {"path": "a.txt", "content": "hi"})]),
             ScriptTurn(text="Done, the file is written.")]
    with serve(engine, script=Script(turns, prompt_limit=128), hooks=[ElideToolResults(), recorder]) as url:
        client = anthropic.Anthropic(base_url=url, api_key=SECRETS[0], max_retries=0, timeout=120,
                                     default_headers={"X-Claude-Code-Session-Id": "scripted-1"})
        history: list[dict] = [{"role": "user", "content": "Write a.txt"}]
        first = client.messages.create(model="local", max_tokens=200, messages=history, tools=[WRITE])
        tool_use = first.content[-1]
        assert tool_use.type == "tool_use" and tool_use.input == {"path": "a.txt", "content": "hi"}
        result = "wrote 2 bytes to a.txt; the file now exists"
        history += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": result}]}]
        with client.messages.stream(model="local", max_tokens=200, messages=history, tools=[WRITE]) as stream:
            second = stream.get_final_message()
        assert second.content[0].text == turns[1].text
    header, recorded, warnings = read_trace(tmp_path / "scripted-1.jsonl")
    assert warnings == [] and [t["script_turn"] for t in recorded] == [0, 1]
    for turn, msg in zip(recorded, (first, second)):
        assert {r["kind"] for r in turn["response"]["runs"]} == {"scripted"}
        assert len(_tokens(turn)) == msg.usage.output_tokens
        assert turn["usage"]["fill"]["tokens"] == {"scripted": msg.usage.output_tokens}
    call = recorded[0]["response"]["tool_calls"][0]
    assert (call["name"], json.loads(call["arguments"]), call["id"]) == ("write", {"path": "a.txt", "content": "hi"},
                                                                         tool_use.id)
    assert recorded[0]["response"]["reasoning"].strip() == "I should write it."
    # the hook rewrote the tool result: the context has the stub, request_context the original
    assert recorded[1]["context"]["messages"][-1]["content"] == "[elided]"
    assert recorded[1]["request_context"]["messages"][-1]["content"] == result
    assert recorded[1]["interventions"] == [{"kind": "elide", "chars": len(result)}]
    assert "request_context" not in recorded[0]

    session = load_session(tmp_path / "scripted-1.jsonl")
    roles = [m.role for m in session.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    answer, tool, last = session.messages[1:]
    assert answer.reasoning.strip() == "I should write it." and answer.content == "Writing."
    assert [(c.name, c.args, c.id) for c in answer.tool_calls] == [("write", {"path": "a.txt", "content": "hi"},
                                                                         tool_use.id)]
    assert (tool.content, tool.tool_call_id) == (result, tool_use.id)  # as the client sent it
    assert last.content == "Done, the file is written." and last.meta["turn_index"] == 1
    assert {r["kind"] for r in last.meta["runs"]} == {"scripted"} and session.tools[0]["function"]["name"] == "write"
    turn = session.turn(3)  # the bridge replay uses: the history before the last answer
    assert [m.role for m in turn.messages] == ["user", "assistant", "tool"]


def test_a_turn_the_client_leaves_is_recorded_as_cancelled(live, engine):
    """The user interrupts the agent mid-answer: the stream is closed after a few events.
    The trace keeps the turn (finish "cancelled", the output so far, its tokens), the
    engine row is cancelled, and the importer leaves the turn out of the conversation."""
    url, directory, _ = live
    session = "interrupted-1"
    body = {"model": "m", "max_tokens": 400, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "Count from one to one hundred in words."}]}
    cancelled_before = engine.scheduler.counters["cancelled"]
    seen = ""
    with httpx.Client(timeout=120) as client:
        with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers={"x-session-id": session}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    seen += delta.get("content") or ""
                    if len(seen) >= 20:
                        break  # leaving the block closes the connection
        path = directory / f"{session}.jsonl"
        deadline = time.monotonic() + 30
        while not (path.exists() and read_trace(path)[1]) and time.monotonic() < deadline:
            time.sleep(0.1)
        (turn,) = read_trace(path)[1]
        response = turn["response"]
        assert response["finish_reason"] == "cancelled" and "went away" in response["error"]
        assert response["content"].startswith(seen) and len(response["content"]) >= len(seen)
        assert 0 < turn["usage"]["completion_tokens"] == len(_tokens(turn)) < 400
        # the row stopped, not ran to 400 (the engine thread reaps it just after the trace is written)
        deadline = time.monotonic() + 30
        while engine.scheduler.counters["cancelled"] == cancelled_before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.scheduler.counters["cancelled"] > cancelled_before
        # the user goes on: the next request does not carry the interrupted answer
        body = {**body, "stream": False, "max_tokens": 4,
                "messages": [*body["messages"], {"role": "user", "content": "Stop. Just say hi."}]}
        answer = client.post(f"{url}/v1/chat/completions", json=body, headers={"x-session-id": session}).json()
    imported = load_session(path)
    assert imported.meta["cancelled_turns"] == [0] and imported.meta["turn_indices"] == [1]
    assert [m.role for m in imported.messages] == ["user", "user", "assistant"]
    assert imported.messages[-1].content == answer["choices"][0]["message"]["content"]
    assert not imported.warnings


def test_a_response_format_is_recorded_and_replay_asks_with_it(live, engine):
    """A JSON response format is a grammar: the trace's context keeps it (and nothing of
    the per-request options or metadata), so the imported turn asks with the same grammar."""
    from jumpahead.core.turn_runner import strict_fill_fields

    url, directory, _ = live
    body = {"model": "m", "max_tokens": 12, "temperature": 0, "response_format": {"type": "json_object"},
            "metadata": {"run": "x"}, "messages": [{"role": "user", "content": "Give me a JSON object."}]}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"x-session-id": "json-1"}, timeout=120)
    assert r.status_code == 200, r.text
    (turn,) = read_trace(directory / "json-1.jsonl")[1]
    assert turn["context"]["response_format"] == {"type": "json_object"}
    session = load_session(directory / "json-1.jsonl")
    asked = session.turn(session.assistant_indices()[-1])
    assert asked.response_format == ResponseFormat("json_object")
    assert strict_fill_fields(engine.tokenizer, asked, None, False)[0] == {"type": "json_object"}
    assert turn_from_json(turn["context"]).response_format == asked.response_format
    # a trace written before the typed Turn kept the protocol's field under "extra"
    for old in ({"response_format": {"type": "json_object"}}, {"text": {"format": {"type": "json_object"}}},
                {"output_config": {"format": {"type": "json_object"}}}):
        context = {k: v for k, v in turn["context"].items() if k != "response_format"}
        assert turn_from_json({**context, "extra": old}).response_format == ResponseFormat("json_object"), old
    plain = {**body, "messages": [{"role": "user", "content": "Say hi."}]}
    del plain["response_format"]
    assert httpx.post(f"{url}/v1/chat/completions", json=plain, headers={"x-session-id": "json-2"},
                      timeout=120).status_code == 200
    assert "response_format" not in read_trace(directory / "json-2.jsonl")[1][0]["context"]


def test_hostile_session_ids_stay_inside_the_trace_dir(live, tmp_path):
    url, directory, recorder = live
    long_a, long_b = "a" * 5000 + "x", "a" * 5000 + "y"
    ids = ["../../etc/passwd", long_a, long_b, "séance/日本語\\..\\x", "..", "/abs/path"]
    for sid in ids:
        body = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}],
                "jumpahead": {"session": sid}}
        headers = {"x-session-id": sid} if sid.isascii() and len(sid) < 200 else {}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
    files = _files(directory)
    assert set(ids) <= set(files)
    names = {files[sid].name for sid in ids}
    assert len(names) == len(ids)  # distinct ids, distinct files (the long ones differ only at the end)
    for sid in ids:
        path = files[sid]
        assert path.parent == directory and path.resolve().parent == directory.resolve()
        assert len(path.name) <= 110 and not path.name.startswith(".")
        assert read_trace(path)[1][0]["session"] == sid
    assert all(p.is_file() for p in directory.iterdir())  # no folders were made
    assert not (directory.parent / "etc").exists()
    # a symlink planted in the trace dir is not followed out of it
    target = tmp_path / "outside.jsonl"
    os.symlink(target, directory / "planted.jsonl")
    with pytest.raises(TraceError):
        recorder.path_for("planted")
    assert not target.exists()


# --- a real `jumpahead serve` killed mid-turn ----------------------------------------


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "jumpahead.app.cli", "serve", *args]


def test_trace_dir_that_cannot_be_made_is_a_cli_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = subprocess.run(_cli("--trace-dir", str(blocker / "traces")), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--trace-dir" in out.stderr and "Traceback" not in out.stderr


def test_killed_server_keeps_every_completed_turn(tmp_path):
    long_text = " ".join(f"word{i}" for i in range(700))  # ~2000 tokens: one long asserted round
    script = tmp_path / "script.jsonl"
    script.write_text("\n".join(json.dumps(t) for t in [{"text": "one"}, {"text": "two"}, {"text": "three"},
                                                        {"text": long_text}]) + "\n")
    traces = tmp_path / "traces"
    port = free_port()
    proc = subprocess.Popen(_cli("--script", str(script), "--trace-dir", str(traces), "--port", str(port),
                                 "--no-prefix-cache", "--log-level", "warning"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)
        body = {"model": "m", "max_tokens": 4000, "messages": [{"role": "user", "content": "go"}]}
        headers = {"session_id": "crash-1", "authorization": "Bearer sk-crash-secret"}
        answers = [httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60).json()
                   ["choices"][0]["message"]["content"] for _ in range(3)]
        assert answers == ["one", "two", "three"]
        assert httpx.get(f"{url}/health").json()["traces"]["turns"] == 3
        failed: list[BaseException] = []

        def long_turn() -> None:
            try:
                httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120)
            except BaseException as exc:  # the server dies under it
                failed.append(exc)

        thread = threading.Thread(target=long_turn, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/health", timeout=5).json()["rows_running"] == 0:
            assert time.monotonic() < deadline, "the long turn never started"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        thread.join(timeout=30)
        assert failed, "the long turn completed before the kill"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (path,) = traces.iterdir()
    assert b"sk-crash-secret" not in path.read_bytes()
    header, turns, warnings = read_trace(path)
    assert warnings == [] and header["session"] == "crash-1"
    assert [t["response"]["content"] for t in turns] == answers
    assert all({r["kind"] for r in t["response"]["runs"]} == {"scripted"} for t in turns)
    # a half-written line (what a kill inside a write leaves) is skipped with a warning
    with path.open("ab") as fh:
        fh.write(b'{"type": "turn", "index": 3, "response": {"content": "wor')
    header, again, warnings = read_trace(path)
    assert again == turns and len(warnings) == 1 and "half-written" in warnings[0]
    session = load_session(path)
    assert [m.content for m in session.messages if m.role == "assistant"][-1] == "three"
    assert session.warnings == warnings
