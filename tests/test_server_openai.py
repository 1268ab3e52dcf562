"""End to end: the real server, the real engine and default model, the openai SDK.

One engine and one uvicorn server (in a thread, on a free 127.0.0.1 port) serve the
whole module. The default model does not call tools on its own, so tool-call tests
force the format with an assistant prefill (`continue_final_message`): the model
writes the rest of the call, and the server parses it out of the output.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)

openai = pytest.importorskip("openai")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
BASH = {"type": "function", "function": {
    "name": "bash", "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}

def _example(i: int) -> list[dict]:
    return [
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function", "function": {
            "name": "bash", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": f"c{i}", "content": "a.txt"},
    ]


# Two earlier calls, then the start of a third: the model closes the arguments and
# writes the end marker itself (greedy), and the parser joins prefill and output.
TOOL_MESSAGES = [
    {"role": "system", "content": "Always answer with a tool call."},
    *_example(1),
    *_example(2),
    {"role": "user", "content": "List the files."},
    {"role": "assistant", "content": '<tool_call>\n{"name": "bash", "arguments": {"command": "ls'},
]


from tests.serving import rows_idle, serve  # noqa: E402


@pytest.fixture(scope="module")
def engine():
    from jumpahead.engine.engine import Engine, EngineConfig

    try:
        eng = Engine.load(None, EngineConfig(max_batch=4), progress=lambda _: None)
    except Exception as exc:
        pytest.skip(f"default model unavailable: {exc}")
    yield eng
    eng.close()


def sse_lines(response: httpx.Response) -> list[str]:
    return [line for line in response.iter_lines() if line]


# --- plain endpoints -----------------------------------------------------------------


def test_models_health_metrics_404(base_url, engine):
    models = httpx.get(f"{base_url}/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == engine.info.name
    health = httpx.get(f"{base_url}/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert health.json()["model"] == engine.info.name
    from jumpahead.engine.machine.blas import blas_info

    blas = health.json()["blas"]  # the BLAS facts: which library, why, threads, what was refused
    assert blas == blas_info() and {"library", "note", "config", "threads", "rejected", "warnings"} <= set(blas)
    metrics = httpx.get(f"{base_url}/metrics.json").json()
    assert set(metrics) == {"engine", "server"}
    missing = httpx.post(f"{base_url}/v1/nothing", json={})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_url"
    wrong = httpx.get(f"{base_url}/v1/chat/completions")
    assert wrong.status_code == 405 and "error" in wrong.json()


# --- completions ---------------------------------------------------------------------


def test_non_streaming_and_streaming_agree(client):
    messages = [{"role": "user", "content": "Say hello."}]
    full = client.chat.completions.create(model="local", messages=messages, max_tokens=6, temperature=0)
    choice = full.choices[0]
    assert full.model == "local" and full.object == "chat.completion"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length") and choice.message.tool_calls is None
    assert 0 < full.usage.completion_tokens <= 6 and full.usage.prompt_tokens > 0

    stream = client.chat.completions.create(model="local", messages=messages, max_tokens=6, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert text == choice.message.content and finishes == [choice.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_stop_string(client):
    out = client.chat.completions.create(
        model="local", messages=[{"role": "user", "content": "Count from 1 to 20, separated by commas."}],
        max_tokens=40, temperature=0, stop=[","])
    assert "," not in out.choices[0].message.content


def test_tool_call_parsed_from_output(client):
    out = client.chat.completions.create(model="local", messages=TOOL_MESSAGES, tools=[BASH], max_tokens=16,
                                         temperature=0, extra_body={"continue_final_message": True})
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "ls"}
    assert choice.message.content is None


def test_tool_call_streamed_as_deltas(base_url):
    body = {"model": "local", "messages": TOOL_MESSAGES, "tools": [BASH], "max_tokens": 16, "temperature": 0,
            "stream": True, "continue_final_message": True}
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = sse_lines(r)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["index"] == 0 and calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"] == {"name": "bash", "arguments": ""}
    # the arguments follow as deltas (the continued prefix's part first) adding up to the call's
    assert all(c["index"] == 0 and set(c) == {"index", "function"} for c in calls[1:])
    assert "".join(c["function"]["arguments"] for c in calls) == '{"command":"ls"}'
    assert not any(d.get("content") for d in deltas)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_tool_call_via_sdk_stream(client):
    stream = client.chat.completions.create(model="local", messages=TOOL_MESSAGES, tools=[BASH], max_tokens=16,
                                            temperature=0, stream=True, extra_body={"continue_final_message": True})
    name, args, finish = "", "", None
    for chunk in stream:
        delta = chunk.choices[0].delta
        for tc in delta.tool_calls or []:
            name += tc.function.name or ""
            args += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (name, json.loads(args), finish) == ("bash", {"command": "ls"}, "tool_calls")


@pytest.mark.slow  # ~1-1.5k prompt tokens each: 10-80 s on 2 busy cores
@pytest.mark.parametrize("fixture", ["mini-swe-agent/002_POST_v1_chat_completions.json",
                                     "pi-openai/002_POST_v1_chat_completions.json"])
def test_real_client_body(base_url, fixture):
    path = SHARED / "fixtures" / "clients" / fixture
    if not path.is_file():
        pytest.skip(f"{path} is absent (shared/ fixtures not laid out beside the repo)")
    body = json.loads(path.read_text())["body"]
    body["max_completion_tokens"] = 3  # the answer does not matter, the round trip does
    r = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200
    if body.get("stream"):
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.text.rstrip().endswith("data: [DONE]")
    else:
        assert r.json()["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")


# --- bad input -----------------------------------------------------------------------


BAD_BODIES = [
    b"{not json",
    b"",
    b"[1, 2]",
    b'{"messages": "hi"}',
    b'{"messages": [{"role": "user", "content": "hi"}], "temperature": -3}',
    b'{"messages": [{"role": "user", "content": "hi"}], "stream": true, "max_tokens": -1}',
    b'{"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"99999999": 1}}',
    b'{"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 5}}]}]}',
    '{"messages": [{"role": "user", "content": "caf\u00e9 \xff"}], "n": 5}'.encode("latin-1"),
]


def test_malformed_bodies_are_400_and_server_keeps_serving(base_url, client):
    for raw in BAD_BODIES:
        r = httpx.post(f"{base_url}/v1/chat/completions", content=raw,
                       headers={"content-type": "application/json"}, timeout=30)
        assert r.status_code == 400, (raw, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["message"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="local", messages=[{"role": "wizard", "content": "x"}])
    ok = client.chat.completions.create(model="local", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_prompt_longer_than_context_is_400(base_url, engine):
    words = "word " * (engine.context_length + 100)
    r = httpx.post(f"{base_url}/v1/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": words}], "stream": True})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


# --- disconnects and errors ----------------------------------------------------------


def test_client_disconnect_frees_the_row(base_url):
    body = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 2000,
            "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", json=body, timeout=120) as r:
        seen = 0
        for line in r.iter_lines():
            seen += '"content"' in line
            if seen >= 3:
                break  # leave mid-stream: the connection closes
    assert rows_idle(base_url, timeout=20), "the streaming row was not freed after the client left"

    body["stream"] = False
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=3)
    assert rows_idle(base_url, timeout=20), "the non-streaming row was not freed after the client left"
    metrics = httpx.get(f"{base_url}/metrics.json").json()
    assert metrics["server"]["client_disconnects"] >= 2 and metrics["engine"]["cancelled"] >= 2


def test_engine_failure_mid_stream_still_ends_with_done(engine):
    """An engine that fails after validation: the SSE stream carries an error and [DONE]."""
    from jumpahead.engine.engine import Engine

    broken = Engine(engine.model, engine.tokenizer, engine.info)
    broken.close()  # validate() passes, stream() fails: "engine is shut down"
    with serve(broken) as url:
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 4}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as r:
            assert r.status_code == 200
            lines = sse_lines(r)
        assert lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2].removeprefix("data: "))["error"]
        assert "shut down" in error["message"]
        r = httpx.post(f"{url}/v1/chat/completions", json={**body, "stream": False}, timeout=30)
        assert r.status_code == 500 and "shut down" in r.json()["error"]["message"]


def test_request_methods_and_fill_usage(client, base_url):
    """`jumpahead.methods` turns on a proposal method per request; the answer equals
    ordinary decoding at temperature 0 and usage reports fill telemetry and cached tokens."""
    code = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
    messages = [{"role": "user", "content": f"Repeat this code exactly:\n```python\n{code}```"}]
    plain = client.chat.completions.create(model="local", messages=messages, max_tokens=40, temperature=0)
    echo = client.chat.completions.create(model="local", messages=messages, max_tokens=40, temperature=0,
                                          extra_body={"jumpahead": {"methods": ["echo"]}})
    assert echo.choices[0].message.content == plain.choices[0].message.content
    fill = echo.usage.model_extra["fill"]
    assert sum(fill["tokens"].values()) == echo.usage.completion_tokens
    assert fill["verified"]["accepted"] == fill["tokens"].get("echo", 0)
    assert fill["verified"]["proposed"] > 0, fill
    # the second identical prompt starts from the prefix the first one published
    assert echo.usage.prompt_tokens_details.cached_tokens > 0
    bad = httpx.post(f"{base_url}/v1/chat/completions", json={
        "model": "local", "messages": messages, "max_tokens": 4, "jumpahead": {"methods": ["warp"]}})
    assert bad.status_code == 400 and "warp" in bad.json()["error"]["message"]
    bad = httpx.post(f"{base_url}/v1/chat/completions", json={
        "model": "local", "messages": messages, "max_tokens": 4, "jumpahead": ["echo"]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "jumpahead"
    metrics = httpx.get(f"{base_url}/metrics.json").json()["engine"]
    assert metrics["tokens_echo"] >= fill["tokens"].get("echo", 0) and metrics["rows_finished"] >= 2
