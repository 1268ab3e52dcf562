"""Upstream mode (`serve --upstream`) against real upstreams started here: two
`jumpahead serve` processes (each recording what it received with --trace-dir, the
oracle of what went upstream) and `mlx_lm.server` on the default model folder.

The front is the real app (create_app over UpstreamEngine) in a thread, or the real CLI
in a subprocess; clients are the openai / anthropic SDKs and httpx.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from jumpahead.policies.api import BoundaryEvent, Intervention, Policy
from jumpahead.proxy.upstream.engine import UpstreamConfig, UpstreamEngine
from jumpahead.proxy.upstream.replicas import ReplicaSet
from jumpahead.proxy.upstream.translate import OutputText
from jumpahead.traces.trace_file import read_trace

from .serving import free_port, interrupt, serve

READ_TOOL = {"type": "function", "function": {
    "name": "read", "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string", "enum": ["notes.txt", "todo.txt"]}},
                   "required": ["path"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "Read the file notes.txt."}]
# An earlier read of notes.txt: the model repeats it, and the jump policy can copy it.
AGAIN = [*ASK,
         {"role": "assistant", "content": "", "tool_calls": [
             {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": '{"path": "notes.txt"}'}}]},
         {"role": "tool", "tool_call_id": "call_1", "content": "hello"},
         {"role": "user", "content": "Read it again."}]


# --- processes ---------------------------------------------------------------------------


def _wait_up(url: str, proc: subprocess.Popen, timeout: float = 400.0, path: str = "/health") -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited: {proc.stdout.read() if proc.stdout else ''}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not come up")
        time.sleep(0.5)


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(Exception):
            interrupt(proc, timeout=20)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A temporary directory of this test's own (pytest's numbered base directories are
    pruned by other pytest sessions running on the same machine)."""
    with tempfile.TemporaryDirectory(prefix="jumpahead-upstream-test-") as d:
        yield Path(d)


@pytest.fixture(scope="module")
def module_scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="jumpahead-upstream-tests-") as d:
        yield Path(d)


@pytest.fixture(scope="module")
def replicas(module_scratch) -> Iterator[list[dict[str, Any]]]:
    """Two real jumpahead upstreams, each recording the requests it gets."""
    out, procs = [], []
    try:
        for k in range(2):
            port, traces = free_port(), module_scratch / f"upstream{k}-traces"
            cache = module_scratch / f"upstream{k}-cache"
            traces.mkdir()
            proc = _spawn([sys.executable, "-m", "jumpahead.app.cli", "serve", "--port", str(port),
                           "--max-batch", "2", "--no-ssd-cache", "--prefix-cache-dir", str(cache),
                           "--trace-dir", str(traces), "--log-level", "warning"],
                          module_scratch / f"upstream{k}.log")
            procs.append(proc)
            out.append({"url": f"http://127.0.0.1:{port}", "proc": proc, "traces": traces})
        for r in out:
            _wait_up(r["url"], r["proc"])
        yield out
    finally:
        for proc in procs:
            _stop(proc)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from jumpahead.traces.analysis import load_tokenizer

    return load_tokenizer()


@contextlib.contextmanager
def front(urls: list[str], tokenizer: Any, policies: list[Any] = (), trace_dir: Path | None = None,
          script: Any = None, **config: Any) -> Iterator[tuple[str, UpstreamEngine]]:
    """The real app in upstream mode over `urls` (as serve --upstream builds it)."""
    from jumpahead.policies.runtime import PolicyHooks

    engine = UpstreamEngine(UpstreamConfig(urls=urls, health_interval_s=0.5, **config), tokenizer)
    engine.probe()
    hooks: list = [PolicyHooks(list(policies), tokenizer, engine.context_length)]
    if trace_dir is not None:
        from jumpahead.traces.recorder import TraceRecorder

        hooks.append(TraceRecorder.for_engine(trace_dir, engine))
    with serve(engine, hooks=hooks, script=script) as url:
        yield url, engine
    engine.close()


def _turns(traces: Path, session: str | None = None) -> list[dict[str, Any]]:
    """Turns an upstream recorded (all sessions, or one)."""
    files = sorted(traces.glob("*.jsonl")) if session is None else [traces / f"{session}.jsonl"]
    out = []
    for f in files:
        if f.exists():
            out += read_trace(f)[1]  # whole turns (a file's later lines are deltas)
    return out


def _args(text: str) -> dict[str, Any]:
    value = json.loads(text)
    assert isinstance(value, dict)
    return value


# --- pure parts: routing and translation ------------------------------------------------


def test_consistent_hashing_moves_few_sessions_and_skips_failed_replicas() -> None:
    sessions = [f"session-{i}" for i in range(600)]
    two = ReplicaSet(["http://a/v1", "http://b/v1"])
    three = ReplicaSet(["http://a/v1", "http://b/v1", "http://c/v1"])
    homes2 = {s: two.replicas[two.home(s)].url for s in sessions}
    homes3 = {s: three.replicas[three.home(s)].url for s in sessions}
    moved = [s for s in sessions if homes2[s] != homes3[s]]
    assert all(homes3[s] == "http://c/v1" for s in moved)  # only to the new replica
    assert 0.2 < len(moved) / len(sessions) < 0.45  # about a third, not a reshuffle
    for url in ("http://a/v1", "http://b/v1"):
        assert 0.35 < sum(1 for s in sessions if homes2[s] == url) / len(sessions) < 0.65
    # a failed replica is skipped; its sessions go to the next on the ring, the others stay
    down = three.replicas[0]
    three.mark(down, False, "test")
    for s in sessions:
        first = three.order(s)[0]
        assert first is not down
        if homes3[s] != down.url:
            assert first.url == homes3[s]
    rr = ReplicaSet(["http://a/v1", "http://b/v1"], routing="round-robin")
    assert [rr.order("same")[0].url for _ in range(4)] == ["http://a/v1", "http://b/v1"] * 2


def test_structured_deltas_become_model_text_the_parser_reads_back(tokenizer) -> None:
    """Streamed structured calls (name first, arguments in pieces) and reasoning are
    written in the model's format; the proxy's own parser turns them back into the
    same calls. A call a continued prefix opened is completed, not repeated."""
    from jumpahead.core.output_parser import OutputParser
    from jumpahead.core.turn import Tool, TurnOutput

    tools = [Tool("read", "", READ_TOOL["function"]["parameters"])]
    text = OutputText(tokenizer)
    deltas = [{"reasoning_content": "Need the file."}, {"content": "Reading."},
              {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "read", "arguments": ""}}]},
              {"tool_calls": [{"index": 0, "function": {"arguments": '{"path":'}}]},
              {"tool_calls": [{"index": 0, "function": {"arguments": ' "notes.txt"}'}}]},
              {"tool_calls": [{"index": 1, "id": "b", "function": {"name": "read", "arguments": '{"path": "b.txt"}'}}]}]
    written = "".join(text.delta(d) for d in deltas) + text.finish()
    parser = OutputParser.for_tokenizer(tokenizer, tools)
    out = TurnOutput()
    for event in parser.feed(written) + parser.finish():
        out.add(event)
    assert out.reasoning.strip() == "Need the file." and out.content.strip() == "Reading."
    assert [(c.name, _args(c.arguments)) for c in out.tool_calls] == [("read", {"path": "notes.txt"}),
                                                                      ("read", {"path": "b.txt"})]
    # continuation: the prefix (jump) opened a call; the upstream answers with the whole call
    resumed = OutputText(tokenizer)
    resumed.extend('<tool_call>\n{"name": "read", "arguments": {"path": "not')
    rest = resumed.delta({"tool_calls": [{"index": 0, "function": {"name": "read",
                                                                   "arguments": '{"path":"notes.txt"}'}}]})
    rest += resumed.finish()
    assert rest == 'es.txt"}}\n</tool_call>' and resumed.mismatches == 0
    # ... or with just the rest of the arguments, as jumpahead streams a continued call
    raw = OutputText(tokenizer)
    raw.extend('<tool_call>\n{"name": "read", "arguments": {"path": "not')
    rest = raw.delta({"tool_calls": [{"index": 0, "function": {"name": "", "arguments": 'es.txt"}'}}]}) + raw.finish()
    assert rest == 'es.txt"}}\n</tool_call>' and raw.mismatches == 0


def test_anthropic_disable_parallel_tool_use_is_sent_as_parallel_tool_calls() -> None:
    from jumpahead.proxy.anthropic_messages import parse_messages_request
    from jumpahead.proxy.upstream.translate import chat_body

    body = {"messages": ASK, "max_tokens": 8, "tools": [{"name": "read", "input_schema": READ_TOOL["function"]["parameters"]}]}
    sent = chat_body(parse_messages_request({**body, "tool_choice": {"type": "any", "disable_parallel_tool_use": True}}), "m")
    assert (sent["tool_choice"], sent["parallel_tool_calls"]) == ("required", False)
    sent = chat_body(parse_messages_request({**body, "tool_choice": {"type": "auto", "disable_parallel_tool_use": False}}), "m")
    assert (sent["tool_choice"], sent["parallel_tool_calls"]) == ("auto", True)
    for choice in ({"type": "any"}, {"type": "none", "disable_parallel_tool_use": True}):  # not given / no tools sent
        assert "parallel_tool_calls" not in chat_body(parse_messages_request({**body, "tool_choice": choice}), "m")


# --- errors ------------------------------------------------------------------------------


def test_unreachable_upstream_is_a_502_naming_the_url_in_each_protocol(tokenizer) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with front([dead], tokenizer) as (url, _):
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": ASK, "max_tokens": 4}, timeout=30)
        assert r.status_code == 502 and dead in r.json()["error"]["message"]
        r = httpx.post(f"{url}/v1/messages", json={"model": "m", "max_tokens": 4, "messages": ASK}, timeout=30)
        assert r.status_code == 502 and r.json()["type"] == "error" and dead in r.json()["error"]["message"]
        # a stream still ends with its terminal event
        with httpx.stream("POST", f"{url}/v1/messages", timeout=30,
                          json={"model": "m", "max_tokens": 4, "messages": ASK, "stream": True}) as s:
            body = s.read().decode()
        assert dead in body and body.rstrip().endswith('{"type":"message_stop"}')
        with httpx.stream("POST", f"{url}/v1/responses", timeout=30,
                          json={"model": "m", "input": "hi", "stream": True}) as s:
            body = s.read().decode()
        assert dead in body and ("response.failed" in body or "response.completed" in body)
        health = httpx.get(f"{url}/health", timeout=10)
        assert health.status_code == 503 and health.json()["upstream"]["replicas"][0]["healthy"] is False


def test_script_mode_upstream_serves_recorded_turns_without_the_upstream(tokenizer, scratch) -> None:
    """serve --script / replay --live in upstream mode: each request gets the next
    recorded turn (tool calls through the real parser), recorded as `scripted`; the
    upstream (here: nothing listening) is never asked."""
    from jumpahead.core.script import Script, parse_script

    script = Script(parse_script(json.dumps([
        {"reasoning": "Read it.", "tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}}]},
        {"text": "It says hello."}])))
    dead = f"http://127.0.0.1:{free_port()}"
    with front([dead], tokenizer, trace_dir=scratch, script=script) as (url, eng):
        first = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                           json={"model": "m", "messages": ASK, "tools": [READ_TOOL]})
        second = httpx.post(f"{url}/v1/messages", timeout=60, json={"model": "m", "max_tokens": 64, "messages": [
            *ASK, {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read",
                                                     "input": {"path": "notes.txt"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "hello"}]}]})
        assert eng.replicas.replicas[0].requests == 0
    call = first.json()["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "read" and _args(call["function"]["arguments"]) == {"path": "notes.txt"}
    assert second.json()["content"][0]["text"] == "It says hello."
    runs = [json.loads(line)["response"]["runs"] for f in scratch.glob("*.jsonl")
            for line in f.read_text().splitlines()[1:]]
    assert runs and all(r["kind"] == "scripted" for turn in runs for r in turn)


# --- against real jumpahead upstreams ----------------------------------------------------


def test_three_protocols_with_tool_calls_pass_through(replicas, tokenizer) -> None:
    openai = pytest.importorskip("openai")
    anthropic = pytest.importorskip("anthropic")
    up, session = replicas[0], "protocols-session"
    with front([up["url"]], tokenizer) as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0,
                               default_headers={"x-session-id": session})
        kw = dict(model="m", messages=ASK, tools=[READ_TOOL], tool_choice="required", max_tokens=64, temperature=0,
                  parallel_tool_calls=False)
        chat = client.chat.completions.create(**kw)
        call = chat.choices[0].message.tool_calls[0]
        assert chat.choices[0].finish_reason == "tool_calls" and call.function.name == "read"
        assert isinstance(_args(call.function.arguments)["path"], str)
        pieces: dict[int, dict[str, str]] = {}
        finish = None
        for chunk in client.chat.completions.create(**kw, stream=True):
            for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                entry = pieces.setdefault(tc.index, {"name": "", "args": ""})
                entry["name"] += tc.function.name or ""
                entry["args"] += tc.function.arguments or ""
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        assert finish == "tool_calls" and pieces[0]["name"] == "read"
        assert _args(pieces[0]["args"]) == _args(call.function.arguments)  # greedy: same call streamed

        ac = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, default_headers={"x-session-id": session})
        akw = dict(model="m", max_tokens=64, messages=ASK, tool_choice={"type": "any", "disable_parallel_tool_use": True},
                   extra_body={"temperature": 0}, tools=[{"name": "read", "description": "Read a file.",
                                                          "input_schema": READ_TOOL["function"]["parameters"]}])
        msg = ac.messages.create(**akw)  # disable_parallel_tool_use goes upstream as parallel_tool_calls: false
        use = [b for b in msg.content if b.type == "tool_use"]
        assert msg.stop_reason in ("tool_use", "max_tokens")
        assert use[0].name == "read" and use[0].input == _args(call.function.arguments)
        with ac.messages.stream(**akw) as stream:
            final = stream.get_final_message()
        assert [b.input for b in final.content if b.type == "tool_use"] == [b.input for b in use]

        rkw = dict(model="m", input="Read the file notes.txt.", tool_choice="required", max_output_tokens=64,
                   parallel_tool_calls=False, temperature=0,  # greedy, or the call is sampled
                   tools=[{"type": "function", "name": "read", "description": "Read a file.",
                           "parameters": READ_TOOL["function"]["parameters"]}])
        resp = client.responses.create(**rkw)
        calls = [o for o in resp.output if o.type == "function_call"]
        assert calls[0].name == "read" and _args(calls[0].arguments) == _args(call.function.arguments)
        done = None
        for event in client.responses.create(**rkw, stream=True):
            if event.type == "response.completed":
                done = event.response
        assert done is not None
        assert [_args(o.arguments) for o in done.output if o.type == "function_call"] == [_args(calls[0].arguments)]
    # all six went to the upstream as chat completions with the tool
    got = _turns(up["traces"], session)
    assert len(got) == 6 and all(t["request"]["body"]["tools"][0]["function"]["name"] == "read" for t in got)
    assert all(t["request"]["body"]["parallel_tool_calls"] is False for t in got)


class JumpIntoPath(Policy):
    """Test policy: once a `read` call's arguments are about to open, supply
    `{"path": "not` (the model then has to finish the value itself)."""

    name = "jump-into-path"
    TEXT = '{"path": "not'

    def on_boundary(self, event: BoundaryEvent) -> Intervention | None:
        body = event.call_text
        if event.tool_name == "read" and body.rstrip().endswith('"arguments":'):
            return Intervention(text=self.TEXT, label="test")
        return None


def test_jump_is_a_continuation_request_with_the_constructed_prefix(replicas, tokenizer, scratch) -> None:
    up, session = replicas[0], "jump-session"
    disconnects = httpx.get(f"{up['url']}/metrics.json", timeout=10).json()["server"].get("client_disconnects", 0)
    with front([up["url"]], tokenizer, policies=["tests.test_upstream:JumpIntoPath"], trace_dir=scratch) as (url, eng):
        assert eng.continuation  # the upstream says it is jumpahead
        r = httpx.post(f"{url}/v1/chat/completions", timeout=600, headers={"x-session-id": session}, json={
            "model": "m", "messages": AGAIN, "tools": [READ_TOOL], "tool_choice": "required", "max_tokens": 40,
            "temperature": 0})
    assert r.status_code == 200, r.text
    answer = r.json()
    fill = answer["usage"]["fill"]
    assert fill["upstream"]["requests"] == 2 and fill["upstream"]["jumps"] == 1
    jump = next(i for i in answer["usage"]["report"]["policies"]["interventions"] if i["policy"] == "jump-into-path")
    assert jump["emitted"] == jump["tokens"] > 0
    call = answer["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "read" and _args(call["function"]["arguments"])["path"].startswith("not")
    # the first upstream request was cut at the boundary (cancelled: the upstream records
    # it as such and counts a disconnect); the second ends with the constructed prefix
    deadline = time.monotonic() + 10  # (the upstream records the cut one when its stream closes)
    while len(_turns(up["traces"], session)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    turns = _turns(up["traces"], session)
    (cut,) = [t for t in turns if t["response"]["finish_reason"] == "cancelled"]
    (cont,) = [t for t in turns if t["response"]["finish_reason"] != "cancelled"]
    assert cut["response"]["runs"] and "continue_final_message" not in cut["request"]["body"]
    assert httpx.get(f"{up['url']}/metrics.json", timeout=10).json()["server"]["client_disconnects"] == disconnects + 1
    body = cont["request"]["body"]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    prefix = body["messages"][-1]
    assert prefix["role"] == "assistant" and prefix["content"].endswith(JumpIntoPath.TEXT)
    assert prefix["content"].startswith("<tool_call>")
    # the front's trace: sampled tokens, the jump tokens, then the upstream's continuation
    (turn,) = [json.loads(line) for f in scratch.glob("*.jsonl") for line in f.read_text().splitlines()[1:]]
    runs = turn["response"]["runs"]
    kinds = [run["kind"] for run in runs]
    at = kinds.index("jump")
    assert at > 0 and "sampled" in kinds[at + 1:]
    assert "".join(run["text"] for run in runs[at:at + 1]).strip() == JumpIntoPath.TEXT
    continuation = "".join(run["text"] for run in runs[at + 1:])
    assert continuation.startswith(_args(call["function"]["arguments"])["path"][3:])


def test_compaction_and_recording_upstream(replicas, tokenizer, scratch) -> None:
    """The upstream gets the compacted context; the front records the turn."""
    up = replicas[0]
    long_text = ("I will run the tests in tests/test_schema.py to see the failure; the cause may be the nested "
                 "schema returning None. Some filler words that carry nothing worth keeping here. ") * 6
    messages = [{"role": "user", "content": "Fix the bug in src/schema.py."}]
    for k in range(3):
        messages.append({"role": "assistant", "content": f"Step {k}. " + long_text, "tool_calls": [
            {"id": f"c{k}", "type": "function", "function": {"name": "bash",
                                                            "arguments": f'{{"command": "pytest -k case{k}"}}'}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": f"exit 1: TypeError case{k}"})
    messages.append({"role": "user", "content": "Say ok."})
    session = "compaction-session"
    with front([up["url"]], tokenizer, policies=["compaction:clear_at_least=64,target=all"],
               trace_dir=scratch) as (url, _):
        r = httpx.post(f"{url}/v1/chat/completions", timeout=600, headers={"x-session-id": session},
                       json={"model": "m", "messages": messages, "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    note = next(i for i in r.json()["usage"]["report"]["policies"]["interventions"] if i["policy"] == "compaction")
    assert note["decision"] == "rewritten" and note["removed"] >= 64
    (got,) = _turns(up["traces"], session)
    sent = got["request"]["body"]["messages"]
    assert any("[compacted step]" in (m.get("content") or "") for m in sent)
    assert sum(len(m.get("content") or "") for m in sent) < sum(len(m["content"]) for m in messages) - 500
    assert got["usage"]["prompt_tokens"] == r.json()["usage"]["prompt_tokens"]  # the upstream's count
    (recorded,) = [json.loads(line) for line in (scratch / f"{session}.jsonl").read_text().splitlines()[1:]]
    assert any("[compacted step]" in (m.get("content") or "") for m in recorded["context"]["messages"])
    assert recorded["response"]["runs"] and recorded["usage"]["completion_tokens"] == r.json()["usage"]["completion_tokens"]


# --- mlx_lm.server as the upstream, through the real CLI ------------------------------------


@pytest.fixture(scope="module")
def mlx_server(module_scratch) -> Iterator[str]:
    pytest.importorskip("mlx_lm.server")
    from jumpahead.engine.model.default_model import ensure_default_model

    folder = ensure_default_model(progress=lambda s: None)
    port = free_port()
    proc = _spawn([sys.executable, "-m", "mlx_lm", "server", "--model", str(folder), "--port", str(port),
                   "--max-tokens", "16"], module_scratch / "mlx_lm.log")
    try:
        _wait_up(f"http://127.0.0.1:{port}", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)


def test_mlx_lm_server_upstream_through_the_cli(mlx_server, scratch) -> None:
    """`jumpahead serve --upstream` in front of mlx_lm.server: answers equal the upstream's
    own (greedy), in chat (streamed and not) and Anthropic; jumps are off, said once."""
    anthropic = pytest.importorskip("anthropic")
    port = free_port()
    log = scratch / "front.log"
    proc = _spawn([sys.executable, "-m", "jumpahead.app.cli", "serve", "--port", str(port),
                   "--upstream", mlx_server, "--log-level", "info"], log)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_up(url, proc)
        # (mlx_lm.server loads whatever "model" names: the direct call leaves it out, as the front does)
        body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}
        direct = httpx.post(f"{mlx_server}/v1/chat/completions", json=body, timeout=600).json()
        body["model"] = "claude-or-anything"  # what an agent sends; the front does not pass it on
        expected = direct["choices"][0]["message"]["content"]
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == expected and expected
        assert r.json()["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]
        with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=600) as s:
            lines = [line for line in s.iter_lines() if line.startswith("data:")]
        assert lines[-1] == "data: [DONE]"
        streamed = "".join((json.loads(x[5:])["choices"][0]["delta"].get("content") or "")
                           for x in lines[:-1] if json.loads(x[5:]).get("choices"))
        assert streamed == expected
        msg = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0).messages.create(
            model="m", max_tokens=4, messages=[{"role": "user", "content": "Say hi."}], extra_body={"temperature": 0})
        assert msg.content[0].text == expected
        metrics = httpx.get(f"{url}/metrics.json", timeout=10).json()["engine"]["upstream"]
        assert metrics["continuation"] is False and metrics["replicas"][0]["requests"] == 3
    finally:
        _stop(proc)
    text = log.read_text()
    assert text.count("jumps are off") == 1


# --- two replicas: affinity, then one killed mid-run (last: it kills a module replica) -------


def test_metrics_has_per_replica_series_that_agree_with_the_json_report(replicas, tokenizer) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    urls = [r["url"] for r in replicas]
    with front(urls, tokenizer) as (url, eng):
        sids: dict[int, str] = {}
        k = 0
        while len(sids) < 2:  # one session homed on each replica
            sids.setdefault(eng.replicas.home(f"metrics-{k}"), f"metrics-{k}")
            k += 1
        for sid in sids.values():
            r = httpx.post(f"{url}/v1/chat/completions", headers={"x-session-id": sid}, timeout=600, json={
                "model": "m", "messages": [{"role": "user", "content": "Say ok."}], "max_tokens": 2,
                "temperature": 0})
            assert r.status_code == 200, r.text
        text = httpx.get(f"{url}/metrics", timeout=10).text
        report = httpx.get(f"{url}/metrics.json", timeout=10).json()["engine"]["upstream"]["replicas"]
    families = {f.name: f for f in text_string_to_metric_families(text)}
    prefix = "jumpahead_engine_upstream_replica_"
    assert {n: families[prefix + n].type for n in (
        "in_flight_requests", "requests", "errors", "failovers", "healthy", "sessions", "time_to_first_byte_seconds")} == {
        "in_flight_requests": "gauge", "requests": "counter", "errors": "counter", "failovers": "counter",
        "healthy": "gauge", "sessions": "gauge", "time_to_first_byte_seconds": "summary"}
    samples = {(s.name, s.labels["replica"]): s.value
               for f in families.values() if f.name.startswith(prefix) for s in f.samples}
    assert [r["url"] for r in report] == [u + "/v1" for u in urls]
    for r in report:  # the text and the JSON are one snapshot, and match what was sent
        label = r["url"]
        assert samples[(prefix + "requests_total", label)] == r["requests"] == 1
        assert samples[(prefix + "errors_total", label)] == r["errors"] == 0
        assert samples[(prefix + "failovers_total", label)] == r["failovers"] == 0
        assert samples[(prefix + "in_flight_requests", label)] == r["in_flight"] == 0
        assert samples[(prefix + "healthy", label)] == 1 and r["healthy"] is True
        assert samples[(prefix + "sessions", label)] == r["sessions"] == 1
        assert samples[(prefix + "time_to_first_byte_seconds_count", label)] == r["ttfb_count"] == 1
        ttfb = samples[(prefix + "time_to_first_byte_seconds_sum", label)]
        assert ttfb > 0 and abs(ttfb * 1000 - r["ttfb_ms_mean"]) < 0.01


def test_sessions_stay_on_their_replica_and_a_killed_replica_costs_only_its_in_flight(replicas, tokenizer) -> None:
    urls = [r["url"] for r in replicas]
    with front(urls, tokenizer) as (url, eng):
        homes: dict[str, int] = {}
        k = 0
        while sorted(homes.values()).count(0) < 2 or sorted(homes.values()).count(1) < 2:
            sid, k = f"affinity-{k}", k + 1
            home = eng.replicas.home(sid)
            if list(homes.values()).count(home) < 2:
                homes[sid] = home
        for turn in range(2):
            for sid in homes:
                r = httpx.post(f"{url}/v1/chat/completions", headers={"x-session-id": sid}, timeout=600, json={
                    "model": "m", "messages": [{"role": "user", "content": f"{sid}: say {turn}."}],
                    "max_tokens": 2, "temperature": 0})
                assert r.status_code == 200, r.text
        for sid, home in homes.items():  # what each upstream itself recorded
            assert len(_turns(replicas[home]["traces"], sid)) == 2
            assert not _turns(replicas[1 - home]["traces"], sid)
        report = httpx.get(f"{url}/metrics.json", timeout=10).json()["engine"]["upstream"]["replicas"]
        assert [r["sessions"] for r in report] == [2, 2] and [r["requests"] for r in report] == [4, 4]
        assert [r["errors"] for r in report] == [0, 0]

        victim = next(s for s, h in homes.items() if h == 1)
        survivor = next(s for s, h in homes.items() if h == 0)
        story = [{"role": "user", "content": "Write a long story about a dragon who learns to cook."}]
        started = threading.Event()
        results: dict[str, Any] = {}

        def stream(sid: str, max_tokens: int) -> None:
            lines = results[sid] = []
            with httpx.stream("POST", f"{url}/v1/chat/completions", headers={"x-session-id": sid}, timeout=600,
                              json={"model": "m", "messages": story, "max_tokens": max_tokens, "temperature": 0,
                                    "stream": True}) as s:
                for line in s.iter_lines():
                    lines.append(line)
                    event = json.loads(line[5:]) if line.startswith("data: {") else {}
                    if sid == victim and any(c.get("delta", {}).get("content") for c in event.get("choices") or []):
                        started.set()  # the upstream is generating (not just the front's opening event)

        threads = [threading.Thread(target=stream, args=(victim, 400)), threading.Thread(target=stream, args=(survivor, 24))]
        for t in threads:
            t.start()
        assert started.wait(300), "the victim's stream never started"
        replicas[1]["proc"].kill()  # replica 1 dies with the victim's request in flight
        for t in threads:
            t.join(timeout=600)
        dead = [x for x in results[victim] if x.startswith("data:")]
        assert dead[-1] == "data: [DONE]" and any('"error"' in x and replicas[1]["url"] in x for x in dead)
        alive = [json.loads(x[5:]) for x in results[survivor] if x.startswith("data:") and x != "data: [DONE]"]
        assert not any("error" in x for x in alive) and alive[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        # the next turn of the victim's session fails over to replica 0; the survivor stays
        for sid in (victim, survivor):
            r = httpx.post(f"{url}/v1/chat/completions", headers={"x-session-id": sid}, timeout=600, json={
                "model": "m", "messages": [{"role": "user", "content": f"{sid}: say 2."}], "max_tokens": 2,
                "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["fill"]["upstream"]["replica"] == replicas[0]["url"] + "/v1"
        assert len(_turns(replicas[0]["traces"], victim)) >= 1
        report = httpx.get(f"{url}/metrics.json", timeout=10).json()["engine"]["upstream"]["replicas"]
        assert report[1]["healthy"] is False and report[1]["errors"] >= 1
        assert report[0]["errors"] == 0 and report[0]["failovers"] >= 1
