"""OpenAI chat requests -> Turn -> prompt ids (real tokenizer), and Turn output -> wire JSON."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
from jumpahead.core.errors import APIError
from jumpahead.proxy.openai_chat import (
    IMAGE_PLACEHOLDER,
    ChatStream,
    chat_completion,
    parse_chat_request,
)
from jumpahead.core.prompt import _systems_first, _systems_into_user, render_prompt, template_messages
from jumpahead.core.turn import ContentDelta, ReasoningDelta, ToolCall, ToolCallDelta, TurnEnd, TurnOutput, Usage

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
FIXTURES = sorted((SHARED / "fixtures" / "clients").glob("*/*.json"))
CHAT_FIXTURES = [f for f in FIXTURES if json.loads(f.read_text())["path"].split("?")[0] == "/v1/chat/completions"]


@pytest.fixture(scope="module")
def tokenizer():
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from jumpahead.engine.model.default_model import ensure_default_model

    try:
        folder = ensure_default_model(progress=lambda _: None)
    except Exception as exc:
        pytest.skip(f"default model unavailable: {exc}")
    return load_tokenizer(Path(folder))


def user(text="hi"):
    return {"role": "user", "content": text}


# --- real client bodies --------------------------------------------------------------


def test_fixtures_present():
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent: no captured client requests to check")
    assert len(CHAT_FIXTURES) >= 8


@pytest.mark.parametrize("path", CHAT_FIXTURES, ids=[f"{p.parent.name}/{p.name}" for p in CHAT_FIXTURES])
def test_client_fixture_renders(tokenizer, path):
    body = json.loads(path.read_text())["body"]
    turn = parse_chat_request(body)
    ids = render_prompt(tokenizer, turn)
    assert ids and all(isinstance(i, int) for i in ids)
    text = tokenizer.decode(ids)
    assert text.endswith("<|im_start|>assistant\n")
    assert turn.stream == bool(body.get("stream"))
    last = body["messages"][-1]
    if last["role"] == "user":
        content = last["content"] if isinstance(last["content"], str) else last["content"][0]["text"]
        assert content[:40] in text
    for tool in body.get("tools", []):
        assert f'"name": "{tool["function"]["name"]}"' in text
    for message in body["messages"]:
        for call in message.get("tool_calls") or []:
            args = json.loads(call["function"]["arguments"])
            rendered = json.dumps({"name": call["function"]["name"], "arguments": args})
            assert rendered in text  # arguments became a mapping for the template
    if body["messages"][0]["role"] == "developer":
        assert text.startswith("<|im_start|>system\n" + body["messages"][0]["content"][:40])
    if "max_completion_tokens" in body:
        assert turn.max_tokens == body["max_completion_tokens"]
    assert turn.include_usage == bool((body.get("stream_options") or {}).get("include_usage"))


# --- normalization -------------------------------------------------------------------


def test_shapes_are_normalized(tokenizer):
    body = {
        "model": "whatever",
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "text", "text": "look"},
                                         {"type": "image_url", "image_url": {"url": "data:..."}}]},
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                  "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "a.txt"}]},
            {"role": "assistant", "content": None, "reasoning_content": "thought"},
            {"role": "function", "name": "bash", "content": "b.txt"},
            {"role": "system", "content": "a system message in the middle"},
            user("next?"),
        ],
        "cache_control": {"type": "ephemeral"},  # unknown fields are ignored
        "store": False,
    }
    turn = parse_chat_request(body)
    roles = [m.role for m in turn.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "system", "user"]
    assert turn.messages[1].content == "look\n" + IMAGE_PLACEHOLDER
    assert turn.messages[2].content is None and turn.messages[2].tool_calls[0].name == "bash"
    assert turn.messages[4].reasoning == "thought"
    msgs = template_messages(turn)
    assert msgs[2]["content"] == "" and msgs[2]["tool_calls"][0]["function"]["arguments"] == {"command": "ls"}
    assert msgs[3]["name"] == "bash"  # looked up from the call it answers
    text = tokenizer.decode(render_prompt(tokenizer, turn))
    assert "a system message in the middle" in text and "Be brief." in text


def test_system_reshaping():
    msgs = [{"role": "user", "content": "u"}, {"role": "system", "content": "s1"}, {"role": "system", "content": "s2"}]
    assert _systems_first(msgs) == [{"role": "system", "content": "s1\n\ns2"}, {"role": "user", "content": "u"}]
    assert _systems_into_user(msgs) == [{"role": "user", "content": "s1\n\ns2\n\nu"}]


def test_sampling_and_limits():
    turn = parse_chat_request({"messages": [user()]})
    assert turn.sampling.temperature == 1.0 and turn.max_tokens is None and not turn.stream
    turn = parse_chat_request({
        "messages": [user()], "temperature": 0, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": -1,
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
        "logit_bias": {"42": -100, "7": 2.5}, "stop": "END", "max_tokens": 50, "max_completion_tokens": 20,
        "n": 1, "stream": True, "stream_options": {"include_usage": True},
    })
    s = turn.sampling
    assert s.greedy and s.top_p == 0.9 and s.top_k == 40 and s.min_p == 0.05
    assert s.seed is not None and s.seed >= 0
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (0.5, -0.5, 1.1)
    assert s.logit_bias == {42: -100.0, 7: 2.5}
    assert turn.stop == ["END"] and turn.max_tokens == 20 and turn.stream and turn.include_usage
    assert parse_chat_request({"messages": [user()], "stop": ["a", ""]}).stop == ["a"]


def test_tools_and_tool_choice():
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}},
             {"type": "web_search"}]
    turn = parse_chat_request({"messages": [user()], "tools": tools})
    assert [t.name for t in turn.tools] == ["bash"] and turn.tool_choice.mode == "auto" and turn.tools_enabled
    turn = parse_chat_request({"messages": [user()], "tools": tools, "tool_choice": "none"})
    assert not turn.tools_enabled
    turn = parse_chat_request({"messages": [user()], "tools": tools,
                               "tool_choice": {"type": "function", "function": {"name": "bash"}}})
    assert (turn.tool_choice.mode, turn.tool_choice.name) == ("function", "bash")


MALFORMED = [
    ("not an object", [], None),
    ("no messages", {}, "messages"),
    ("empty messages", {"messages": []}, "messages"),
    ("message not an object", {"messages": ["hi"]}, "messages[0]"),
    ("bad role", {"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ("bad content", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("bad part", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages[0].content[0].text"),
    ("bad tool call", {"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]},
     "messages[0].tool_calls[0].function.name"),
    ("temperature type", {"messages": [user()], "temperature": "0.5"}, "temperature"),
    ("temperature negative", {"messages": [user()], "temperature": -1}, "temperature"),
    ("top_p zero", {"messages": [user()], "top_p": 0}, "top_p"),
    ("max_tokens zero", {"messages": [user()], "max_tokens": 0}, "max_tokens"),
    ("max_tokens float", {"messages": [user()], "max_tokens": 1.5}, "max_tokens"),
    ("n", {"messages": [user()], "n": 2}, "n"),
    ("stop type", {"messages": [user()], "stop": 3}, "stop"),
    ("stream type", {"messages": [user()], "stream": "yes"}, "stream"),
    ("stream_options type", {"messages": [user()], "stream": True, "stream_options": 1}, "stream_options"),
    ("logit_bias key", {"messages": [user()], "logit_bias": {"x": 1}}, "logit_bias"),
    ("logit_bias value", {"messages": [user()], "logit_bias": {"1": 500}}, "logit_bias"),
    ("tools type", {"messages": [user()], "tools": {}}, "tools"),
    ("tool without name", {"messages": [user()], "tools": [{"type": "function", "function": {}}]},
     "tools[0].function.name"),
    ("tool_choice string", {"messages": [user()], "tool_choice": "always"}, "tool_choice"),
    ("tool_choice unknown tool", {"messages": [user()], "tools": [{"type": "function", "function": {"name": "a"}}],
                                  "tool_choice": {"type": "function", "function": {"name": "b"}}}, "tool_choice"),
]


@pytest.mark.parametrize("body,param", [(b, p) for _, b, p in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_requests_are_400(body, param):
    with pytest.raises(APIError) as info:
        parse_chat_request(body)
    err = info.value
    assert err.status == 400 and err.param == param
    assert err.body()["error"]["type"] == "invalid_request_error" and err.message


def test_vocab_bounds_logit_bias():
    with pytest.raises(APIError):
        parse_chat_request({"messages": [user()], "logit_bias": {"49152": 1}}, vocab_size=49152)
    assert parse_chat_request({"messages": [user()], "logit_bias": {"49151": 1}}, vocab_size=49152)


# --- responses -----------------------------------------------------------------------


def test_chat_completion_body():
    call = ToolCall(name="bash", arguments='{"command":"ls"}', id="call_1")
    out = TurnOutput(reasoning="why", content="", tool_calls=[call], finish_reason="tool_calls",
                     usage=Usage(10, 5))
    body = chat_completion(out, id="chatcmpl-1", model="m", created=1)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant", "content": None, "reasoning_content": "why",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}],
    }
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    orjson.dumps(body)


def test_stream_chunks():
    enc = ChatStream(id="chatcmpl-1", model="m", include_usage=True, created=1)
    chunks = [enc.start()]
    for event in [ReasoningDelta("hm"), ContentDelta("ok"),
                  ToolCallDelta(0, ToolCall("bash", '{"command":"ls"}', id="call_1")),
                  TurnEnd("tool_calls", Usage(3, 4))]:
        chunks += enc.encode(event)
    deltas = [c["choices"][0]["delta"] if c["choices"] else None for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert deltas[1] == {"reasoning_content": "hm"} and deltas[2] == {"content": "ok"}
    assert deltas[3] == {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                         "function": {"name": "bash", "arguments": ""}}]}
    assert deltas[4] == {"tool_calls": [{"index": 0, "function": {"arguments": '{"command":"ls"}'}}]}
    assert chunks[5]["choices"][0]["finish_reason"] == "tool_calls" and chunks[5]["usage"] is None
    assert chunks[6]["choices"] == [] and chunks[6]["usage"]["total_tokens"] == 7
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_stream_error_end():
    enc = ChatStream(id="x", model="m")
    (chunk,) = enc.encode(TurnEnd("error", Usage(), "engine error: boom"))
    assert chunk["error"]["message"] == "engine error: boom" and chunk["error"]["type"] == "server_error"
