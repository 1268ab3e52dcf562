"""The real server on the real model, all three protocols, parsed by the official SDKs.

Every captured client request in ../shared/fixtures/clients is sent as captured and
answered in script mode (a scripted turn with reasoning, text and a tool call when the
request offers tools), and the answer is parsed by the `anthropic` or `openai` SDK.
Then: Anthropic and Responses details (stop sequences, count_tokens, the response
store), malformed bodies (4xx in the protocol's error shape), and engine faults
mid-stream (the protocol's terminal event still ends the stream; the server stays up).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
from jumpahead.engine.types import TokenChunk
from jumpahead.core.script import Script, ScriptedCall, ScriptTurn

from .conftest import SHARED
from .serving import rows_idle, script_engine, serve, sse_events

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

FIXTURES = sorted((SHARED / "fixtures" / "clients").glob("*/*.json"))
PROMPT_LIMIT = 256  # script mode: long client prompts are cut before prefill
WRITE = {"name": "write", "description": "Write a file",
         "input_schema": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                          "required": ["path", "content"]}}


@pytest.fixture(scope="module")
def engine(loaded_model):
    eng = script_engine(loaded_model)
    yield eng
    eng.close()


def scripted(engine, *turns: ScriptTurn, limit: int | None = PROMPT_LIMIT):
    return serve(engine, script=Script(list(turns), prompt_limit=limit))


def _tools_of(body: dict) -> list[str]:
    names = []
    for tool in body.get("tools") or []:
        fn = tool.get("function", tool)
        if isinstance(fn.get("name"), str) and (tool.get("type", "function") == "function" or "input_schema" in tool):
            names.append(fn["name"])
    return names


def _turn_for(body: dict) -> ScriptTurn:
    tools = _tools_of(body)
    if not tools:
        return ScriptTurn(text="hello.txt\n```\nhello world\n```")
    return ScriptTurn(reasoning="The user wants a file.", text="Writing it.",
                      tool_calls=[ScriptedCall(tools[-1], {"path": "hello.txt", "content": "hello world\n"})])


# --- every captured client request ----------------------------------------------------


def test_fixtures_present():
    if not FIXTURES:
        pytest.skip(f"{SHARED} is absent: no captured client requests to replay")
    assert {f.parent.name for f in FIXTURES} >= {"claude-code", "pi-anthropic", "pi-responses", "pi-openai",
                                                 "mini-swe-agent", "aider-whole"}


def _check_anthropic(url: str, path: str, body: dict, turn: ScriptTurn) -> None:
    from anthropic.lib.streaming import MessageStream
    from anthropic.types import Message, RawMessageStreamEvent

    client = anthropic.Anthropic(base_url=url, api_key="dummy", max_retries=0, timeout=600)
    assert body.get("stream") is True
    raw = client.post(path, body=body, cast_to=Message, stream=True,
                      stream_cls=anthropic.Stream[RawMessageStreamEvent])
    stream = MessageStream(raw, anthropic.NOT_GIVEN)
    kinds = [event.type for event in stream]
    message = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[0].thinking.strip() == turn.reasoning and message.content[1].text == turn.text
    tool_use = message.content[2]
    assert tool_use.name == turn.tool_calls[0].name and tool_use.input == turn.tool_calls[0].arguments
    assert tool_use.id.startswith("toolu_") and message.stop_reason == "tool_use"
    assert message.usage.output_tokens > 0


def _check_chat(url: str, body: dict, turn: ScriptTurn) -> None:
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="dummy", max_retries=0, timeout=600)
    if body.get("stream"):
        stream = client.post("/chat/completions", body=body, cast_to=ChatCompletion, stream=True,
                             stream_cls=openai.Stream[ChatCompletionChunk])
        state = ChatCompletionStreamState()
        for chunk in stream:
            state.handle_chunk(chunk)
        completion = state.get_final_completion()
    else:
        completion = client.post("/chat/completions", body=body, cast_to=ChatCompletion)
    choice = completion.choices[0]
    if turn.tool_calls:
        (call,) = choice.message.tool_calls
        assert call.function.name == turn.tool_calls[0].name
        assert json.loads(call.function.arguments) == turn.tool_calls[0].arguments
        assert choice.finish_reason == "tool_calls" and choice.message.content == turn.text
    else:
        assert choice.message.content == turn.text and choice.finish_reason == "stop"


def _check_responses(url: str, body: dict, turn: ScriptTurn) -> None:
    from openai.types.responses import Response, ResponseStreamEvent

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="dummy", max_retries=0, timeout=600)
    assert body.get("stream") is True
    stream = client.post("/responses", body=body, cast_to=Response, stream=True,
                         stream_cls=openai.Stream[ResponseStreamEvent])
    events = list(stream)
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    response = events[-1].response
    assert [i.type for i in response.output] == ["reasoning", "message", "function_call"]
    assert response.output[0].encrypted_content  # the request asked to include it
    assert response.output_text == turn.text
    call = response.output[2]
    assert call.name == turn.tool_calls[0].name and json.loads(call.arguments) == turn.tool_calls[0].arguments


@pytest.mark.parametrize("fixture", [str(f.relative_to(f.parents[1])) for f in FIXTURES])
def test_captured_client_request_is_answered(engine, fixture):
    captured = json.loads((SHARED / "fixtures" / "clients" / fixture).read_text())
    path, body = captured["path"], captured["body"]
    turn = _turn_for(body)
    with scripted(engine, turn) as url:
        if path.startswith("/v1/messages"):
            _check_anthropic(url, path, body, turn)
        elif path.startswith("/v1/responses"):
            _check_responses(url, body, turn)
        else:
            _check_chat(url, body, turn)
        health = httpx.get(f"{url}/health").json()
        assert health["script"]["served"] == 1


# --- Anthropic details ---------------------------------------------------------------


def test_anthropic_non_streaming_stop_sequence_count_tokens_and_model_generation(engine):
    messages = [{"role": "user", "content": "Count please."}]
    with scripted(engine, ScriptTurn(text="one two STOP three"), ScriptTurn(text="fine"), limit=None) as url:
        client = anthropic.Anthropic(base_url=url, api_key="dummy", max_retries=0, timeout=300)
        msg = client.messages.create(model="local", max_tokens=50, messages=messages, stop_sequences=["STOP"])
        assert [b.text for b in msg.content] == ["one two "]
        assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", "STOP")
        counted = client.messages.count_tokens(model="local", messages=messages, tools=[WRITE])
        with client.messages.stream(model="local", max_tokens=50, messages=messages, tools=[WRITE]) as stream:
            final = stream.get_final_message()
        assert final.content[0].text == "fine" and final.stop_reason == "end_turn"
        assert counted.input_tokens == final.usage.input_tokens + final.usage.cache_read_input_tokens
        r = httpx.post(f"{url}/v1/messages/count_tokens", json={"messages": []})
        assert r.status_code == 400 and r.json()["type"] == "error"
        for bad in ([[[1]]], "echo", {"methods": 3}):  # the 'jumpahead' object is checked as on /v1/messages
            r = httpx.post(f"{url}/v1/messages/count_tokens", json={"messages": messages, "jumpahead": bad})
            assert r.status_code == 400 and "jumpahead" in r.json()["error"]["message"], (bad, r.text)
        assert httpx.get(f"{url}/health").json()["script"]["served"] == 2  # count_tokens consumed none
    with serve(engine) as url:  # no script: the model writes (the default model is weak; any text will do)
        client = anthropic.Anthropic(base_url=url, api_key="dummy", max_retries=0, timeout=300)
        msg = client.messages.create(model="local", max_tokens=3, messages=messages, extra_body={"temperature": 0})
        assert msg.stop_reason in ("max_tokens", "end_turn") and 0 < msg.usage.output_tokens <= 3


TWO_TOOLS = [
    {"name": "get_weather", "description": "The current weather in a city.",
     "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"name": "add", "description": "Add two integers.",
     "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                      "required": ["a", "b"]}}]


def test_anthropic_disable_parallel_tool_use_answers_with_one_tool_use(engine):
    from jumpahead.proxy.anthropic_messages import parse_messages_request
    from jumpahead.core.turn_runner import strict_fill_fields

    messages = [{"role": "user", "content": "What is the weather in Paris? And what is 2 + 3?"}]
    body = {"model": "m", "max_tokens": 160, "messages": messages, "tools": TWO_TOOLS}

    def grammar(choice: dict) -> dict:
        turn = parse_messages_request({**body, "tool_choice": choice})
        spec, _ = strict_fill_fields(engine.tokenizer, turn, turn.tools, False)
        assert spec is not None and spec["type"] == "tool_calls"
        return spec

    # the same mechanism as chat's parallel_tool_calls: allowed, the grammar takes one call or more
    assert grammar({"type": "any", "disable_parallel_tool_use": False})["parallel"] is True
    assert grammar({"type": "any", "disable_parallel_tool_use": True})["parallel"] is False
    with serve(engine) as url:
        client = anthropic.Anthropic(base_url=url, api_key="dummy", max_retries=0, timeout=600)
        msg = client.messages.create(**body, tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                     extra_body={"temperature": 0})
        uses = [b for b in msg.content if b.type == "tool_use"]
        assert msg.stop_reason == "tool_use" and len(uses) == 1, msg
        assert uses[0].name in ("get_weather", "add")
        r = httpx.post(f"{url}/v1/messages", timeout=30, json={
            **body, "tool_choice": {"type": "any", "disable_parallel_tool_use": "yes"}})
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
        assert r.json()["error"]["type"] == "invalid_request_error"
        assert "disable_parallel_tool_use" in r.json()["error"]["message"]


def test_parallel_tool_calls_false_under_auto_ends_the_turn_after_the_first_call(loaded_model):
    """The script answers with two calls each time; with parallel calls off (chat and
    Responses `parallel_tool_calls: false`, Anthropic `disable_parallel_tool_use`) under
    tool_choice auto, the answer is the first call alone, and the turn ends there (fewer
    completion tokens than the whole scripted answer: the engine appends the script 8
    tokens a round, as a model writes a few at a time). The first request, with parallel
    calls allowed, is the control: both calls come back."""
    from jumpahead.engine.engine import Engine, EngineConfig

    model, tokenizer, info = loaded_model
    engine = Engine(model, tokenizer, info, EngineConfig(max_batch=2, max_asserted=8))
    with contextlib.closing(engine):
        _one_call_each_protocol(engine)


def _one_call_each_protocol(engine) -> None:
    from jumpahead.core.script import render_turn, turn_tokens


    calls = [ScriptedCall("get_weather", {"city": "Paris"}), ScriptedCall("add", {"a": 2, "b": 3})]
    both = ScriptTurn(text="Two things.", tool_calls=calls)
    whole = len(turn_tokens(engine.tokenizer, render_turn(engine.tokenizer, both, in_reasoning=False)))
    chat_tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                    "parameters": t["input_schema"]}} for t in TWO_TOOLS]
    resp_tools = [{"type": "function", "name": t["name"], "parameters": t["input_schema"]} for t in TWO_TOOLS]
    messages = [{"role": "user", "content": "What is the weather in Paris? And what is 2 + 3?"}]
    with scripted(engine, *[both] * 6, limit=None) as url:
        oa = openai.OpenAI(base_url=f"{url}/v1", api_key="dummy", max_retries=0, timeout=300)
        control = oa.chat.completions.create(model="local", messages=messages, tools=chat_tools)
        assert [c.function.name for c in control.choices[0].message.tool_calls] == ["get_weather", "add"]

        one = oa.chat.completions.create(model="local", messages=messages, tools=chat_tools, parallel_tool_calls=False)
        (call,) = one.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
        assert one.choices[0].finish_reason == "tool_calls" and one.choices[0].message.content == "Two things."
        assert 0 < one.usage.completion_tokens < whole <= control.usage.completion_tokens

        chunks = list(oa.chat.completions.create(model="local", messages=messages, tools=chat_tools,
                                                 parallel_tool_calls=False, stream=True,
                                                 stream_options={"include_usage": True}))
        indices = {tc.index for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])}
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert indices == {0} and finishes == ["tool_calls"] and chunks[-1].usage.completion_tokens < whole

        ac = anthropic.Anthropic(base_url=url, api_key="dummy", max_retries=0, timeout=300)
        with ac.messages.stream(model="local", max_tokens=200, messages=messages, tools=TWO_TOOLS,
                                tool_choice={"type": "auto", "disable_parallel_tool_use": True}) as stream:
            msg = stream.get_final_message()
        uses = [b for b in msg.content if b.type == "tool_use"]
        assert [(u.name, u.input) for u in uses] == [("get_weather", {"city": "Paris"})]
        assert msg.stop_reason == "tool_use" and msg.usage.output_tokens < whole

        resp = oa.responses.create(model="local", input=messages[0]["content"], tools=resp_tools,
                                   parallel_tool_calls=False)
        assert [(o.type, getattr(o, "name", None)) for o in resp.output if o.type != "message"] == \
            [("function_call", "get_weather")]
        assert resp.parallel_tool_calls is False and resp.usage.output_tokens < whole
        assert httpx.get(f"{url}/health").json()["script"]["served"] == 5


# --- Responses details ---------------------------------------------------------------


def test_responses_previous_response_id_store_and_get(engine):
    tools = [{"type": "function", "name": "write", "parameters": WRITE["input_schema"]},
             {"type": "namespace", "name": "files", "tools": [
                 {"type": "function", "name": "read", "parameters": {"type": "object", "properties": {}}}]},
             {"type": "web_search"}]
    turns = [ScriptTurn(tool_calls=[ScriptedCall("read", {})]), ScriptTurn(text="Done."), ScriptTurn(text="x")]
    with scripted(engine, *turns, limit=None) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="dummy", max_retries=0, timeout=300)
        first = client.responses.create(model="local", input="read the file", tools=tools, instructions="sys")
        (call,) = first.output
        assert (call.type, call.name, call.namespace) == ("function_call", "read", "files")
        second = client.responses.create(model="local", previous_response_id=first.id, tools=tools,
                                         input=[{"type": "function_call_output", "call_id": call.call_id,
                                                 "output": "contents"}])
        assert second.output_text == "Done." and second.previous_response_id == first.id
        assert second.usage.input_tokens > first.usage.input_tokens  # the stored conversation came along
        assert client.responses.retrieve(second.id).output_text == "Done."
        with pytest.raises(openai.BadRequestError, match="not found"):
            client.responses.create(model="local", input="x", previous_response_id="resp_unknown")
        unstored = client.responses.create(model="local", input="x", store=False)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(unstored.id)


# --- malformed bodies ----------------------------------------------------------------


BAD = [
    ("/v1/messages", b"{not json"),
    ("/v1/messages?beta=true", b""),
    ("/v1/messages", b'{"messages": "hi"}'),
    ("/v1/messages", b'{"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}'),
    ("/v1/messages", b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}'),
    ("/v1/messages/count_tokens", b"[1]"),
    ("/v1/responses", b"{not json"),
    ("/v1/responses", b'{"input": 5}'),
    ("/v1/responses", b'{"input": [{"type": "function_call"}]}'),
    ("/v1/responses", b'{"input": "x", "previous_response_id": "resp_nope"}'),
    ("/v1/responses", b'{"input": "x", "stream": true, "temperature": 9}'),
]


def test_malformed_bodies_get_4xx_in_the_protocol_shape(engine):
    with scripted(engine, ScriptTurn(text="ok")) as url:
        for path, raw in BAD:
            r = httpx.post(url + path, content=raw, headers={"content-type": "application/json"}, timeout=30)
            assert r.status_code == 400, (path, raw, r.text)
            body = r.json()
            if path.startswith("/v1/messages"):
                assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
                assert body["error"]["message"]
            else:
                assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]
        r = httpx.post(f"{url}/v1/messages/batches", json={})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        assert httpx.head(f"{url}/").status_code == 200
        client = anthropic.Anthropic(base_url=url, api_key="dummy", max_retries=0, timeout=60)
        with pytest.raises(anthropic.BadRequestError):
            client.messages.create(model="m", max_tokens=5, messages=[{"role": "wizard", "content": "x"}])
        # nothing above consumed the script's turn; the server still serves
        ok = client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])
        assert ok.content[0].text == "ok"
        with pytest.raises(anthropic.BadRequestError, match="script exhausted"):
            client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}])


# --- engine faults mid-stream --------------------------------------------------------


class FaultyEngine:
    """The real engine, but its stream breaks after the first chunk: by raising
    (`mode="raise"`) or by ending the row with an error (`mode="error"`)."""

    def __init__(self, engine: Any, mode: str) -> None:
        self._engine = engine
        self.mode = mode

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def stream(self, request: Any) -> AsyncIterator[TokenChunk]:
        async with contextlib.aclosing(self._engine.stream(request)) as chunks:
            async for chunk in chunks:
                yield chunk
                break
        if self.mode == "raise":
            raise RuntimeError("injected engine fault")
        yield TokenChunk([], [], "", finish_reason="error", error="injected engine fault")


@pytest.mark.parametrize("mode", ["raise", "error"])
def test_engine_fault_mid_stream_ends_with_terminal_event(engine, mode):
    turns = [ScriptTurn(text="Hello there, this is a longer answer.")] * 4 + [ScriptTurn(text="fine")] * 2
    with serve(FaultyEngine(engine, mode), script=Script(turns)) as url:
        body = {"model": "m", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.stream("POST", f"{url}/v1/messages", json=body, timeout=120) as r:
            assert r.status_code == 200
            events = sse_events(r)
        names = [n for n, _ in events]
        assert names[0] == "message_start" and names[-2:] == ["error", "message_stop"]
        assert "injected engine fault" in events[-2][1]["error"]["message"]
        client = anthropic.Anthropic(base_url=url, api_key="dummy", max_retries=0, timeout=60)
        with pytest.raises(anthropic.APIError, match="injected engine fault"):
            with client.messages.stream(model="m", max_tokens=50, messages=body["messages"]) as stream:
                stream.get_final_message()

        body = {"model": "m", "input": "hi", "stream": True}
        with httpx.stream("POST", f"{url}/v1/responses", json=body, timeout=120) as r:
            events = sse_events(r)
        assert events[0][0] == "response.created" and events[-1][0] == "response.failed"
        assert "injected engine fault" in events[-1][1]["response"]["error"]["message"]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="dummy", max_retries=0, timeout=60)
        last = list(client.responses.create(model="m", input="hi", stream=True))[-1]
        assert last.type == "response.failed" and last.response.status == "failed"
    with serve(engine, script=Script(turns[-2:])) as url:  # the engine itself is fine
        client = anthropic.Anthropic(base_url=url, api_key="dummy", max_retries=0, timeout=60)
        assert client.messages.create(model="m", max_tokens=9, messages=[{"role": "user", "content": "x"}]
                                      ).content[0].text == "fine"


def test_non_streaming_engine_fault_is_500_in_the_protocol_shape(engine):
    turns = [ScriptTurn(text="Hello there, this is a longer answer.")] * 2
    with serve(FaultyEngine(engine, "error"), script=Script(turns)) as url:
        r = httpx.post(f"{url}/v1/messages", timeout=120,
                       json={"max_tokens": 9, "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 500 and r.json()["error"]["type"] == "api_error"
        r = httpx.post(f"{url}/v1/responses", json={"input": "x"}, timeout=120)
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert httpx.get(f"{url}/health").json()["status"] == "ok"


def test_client_leaving_mid_stream_frees_the_row(engine):
    with serve(engine) as url:  # no script: the model writes a long answer
        for path, body in [
            ("/v1/messages", {"max_tokens": 2000, "stream": True,
                              "messages": [{"role": "user", "content": "Write a long story."}]}),
            ("/v1/responses", {"max_output_tokens": 2000, "stream": True, "input": "Write a long story."}),
        ]:
            with httpx.stream("POST", url + path, json=body, timeout=120) as r:
                seen = 0
                for line in r.iter_lines():
                    seen += "delta" in line
                    if seen >= 3:
                        break  # leave mid-stream: the connection closes
            assert rows_idle(url, timeout=30), f"{path}: the streaming row was not freed after the client left"
        assert httpx.get(f"{url}/metrics.json").json()["server"]["client_disconnects"] >= 2
