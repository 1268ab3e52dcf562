"""Anthropic Messages requests -> Turn, and Turn output -> message JSON / SSE event grammar."""

from __future__ import annotations

import json

import orjson
import pytest

from jumpahead.proxy.anthropic_messages import MessagesStream, message_object, parse_messages_request
from jumpahead.core.errors import APIError
from jumpahead.core.turn import ContentDelta, ReasoningDelta, ToolCall, ToolCallDelta, TurnEnd, TurnOutput, Usage

from .conftest import shared_path

WRITE = {"name": "write", "description": "Write a file", "eager_input_streaming": True,
         "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
         "cache_control": {"type": "ephemeral"}}


def fixture_body(name: str) -> dict:
    return json.loads(shared_path("fixtures", "clients", name).read_text())["body"]


def test_claude_code_body():
    turn = parse_messages_request(fixture_body("claude-code/002_POST_v1_messages.json"))
    roles = [m.role for m in turn.messages]
    assert roles == ["system", "user", "system", "assistant", "tool"]
    # the system blocks joined, less the billing-header block (it would defeat prefix reuse)
    assert turn.messages[0].content.startswith("You are a Claude agent")
    assert len(turn.tools) == 24 and turn.stream and turn.max_tokens == 32000
    assert turn.thinking is None  # adaptive: the template's default
    (call,) = turn.messages[3].tool_calls
    assert call.name == "Write" and json.loads(call.arguments)["content"] == "hello world\n"
    assert turn.messages[4].tool_call_id == call.id and turn.messages[4].content.startswith("File created")
    assert turn.context_edits is not None and not turn.continue_final


def test_pi_body_thinking_enabled():
    turn = parse_messages_request(fixture_body("pi-anthropic/002_POST_v1_messages.json"))
    assert turn.thinking is True and [t.name for t in turn.tools] == ["read", "bash", "edit", "write"]


def test_blocks_tools_and_choices():
    body = {
        "model": "m", "max_tokens": 10, "system": "be brief",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "x"},
                {"type": "redacted_thinking", "data": "zzz"},
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "toolu_1", "name": "write", "input": {"path": "p"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "ok"}],
                 "is_error": False},
                {"type": "text", "text": "thanks"}]},
        ],
        "tools": [WRITE, {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}],
        "tool_choice": {"type": "any"}, "stop_sequences": ["END"], "temperature": 0.2, "top_k": 5,
        "thinking": {"type": "disabled"}, "output_config": {"effort": "low"}, "unknown_field": 1,
    }
    turn = parse_messages_request(body)
    assert [(m.role, m.content) for m in turn.messages] == [
        ("system", "be brief"), ("user", "a\nb"), ("assistant", "calling"), ("tool", "ok"), ("user", "thanks")]
    assert turn.messages[2].reasoning == "hmm" and turn.messages[2].tool_calls[0].id == "toolu_1"
    assert [t.name for t in turn.tools] == ["write"]  # the server tool is not ours
    assert turn.tool_choice.mode == "required" and turn.stop == ["END"] and turn.thinking is False
    assert turn.sampling.temperature == 0.2 and turn.sampling.top_k == 5
    named = parse_messages_request({**body, "tool_choice": {"type": "tool", "name": "write"}})
    assert (named.tool_choice.mode, named.tool_choice.name) == ("function", "write")
    prefill = parse_messages_request({"messages": [{"role": "user", "content": "hi"},
                                                   {"role": "assistant", "content": "Sure,"}]})
    assert prefill.continue_final is True and prefill.sampling.temperature == 1.0


@pytest.mark.parametrize("body, param", [
    ([], None),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "messages[0].content[0].tool_use_id"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "stop_sequences": "END"}, "stop_sequences"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "", "input_schema": {}}]}, "tools[0].name"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "tool", "name": "nope"}},
     "tool_choice.name"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "any", "disable_parallel_tool_use": 1}},
     "tool_choice.disable_parallel_tool_use"),
])
def test_bad_bodies_are_400_naming_the_field(body, param):
    with pytest.raises(APIError) as exc:
        parse_messages_request(body)
    assert exc.value.status == 400 and exc.value.param == param
    assert exc.value.anthropic_body()["error"]["type"] == "invalid_request_error"


def test_disable_parallel_tool_use_is_parallel_tool_calls_negated():
    body = {"messages": [{"role": "user", "content": "x"}],
            "tools": [{"name": "read", "input_schema": {"type": "object"}}]}
    for choice, expected in [({"type": "any", "disable_parallel_tool_use": True}, False),
                             ({"type": "auto", "disable_parallel_tool_use": True}, False),
                             ({"type": "tool", "name": "read", "disable_parallel_tool_use": False}, True)]:
        assert parse_messages_request({**body, "tool_choice": choice}).parallel_tool_calls is expected
    for choice in (None, {"type": "any"}, {"type": "any", "disable_parallel_tool_use": None}):
        assert parse_messages_request({**body, "tool_choice": choice}).parallel_tool_calls is None


def test_message_object():
    out = TurnOutput(reasoning="r", content="text", tool_calls=[ToolCall("write", '{"path": "p"}', id="call_abc")],
                     finish_reason="tool_calls", usage=Usage(10, 5, 4))
    msg = message_object(out, id="msg_1", model="m")
    assert [b["type"] for b in msg["content"]] == ["thinking", "text", "tool_use"]
    assert msg["content"][2] == {"type": "tool_use", "id": "toolu_abc", "name": "write", "input": {"path": "p"}}
    assert msg["stop_reason"] == "tool_use" and msg["usage"]["input_tokens"] == 6
    assert msg["usage"]["cache_read_input_tokens"] == 4 and msg["usage"]["output_tokens"] == 5
    stop = message_object(TurnOutput(content="a", stop_sequence="END"), id="m", model="m")
    assert (stop["stop_reason"], stop["stop_sequence"]) == ("stop_sequence", "END")
    assert message_object(TurnOutput(finish_reason="length"), id="m", model="m")["stop_reason"] == "max_tokens"
    bad = message_object(TurnOutput(tool_calls=[ToolCall("f", "{oops")], finish_reason="tool_calls"), id="m", model="m")
    assert bad["content"][0]["input"] == {"arguments": "{oops"}


def _events(frames: list[bytes]) -> list[tuple[str, dict]]:
    out = []
    for frame in frames:
        head, data = frame.decode().strip().split("\n")
        name = head.removeprefix("event: ")
        payload = orjson.loads(data.removeprefix("data: "))
        assert payload["type"] == name
        out.append((name, payload))
    return out


def test_stream_event_grammar():
    enc = MessagesStream(id="msg_1", model="m")
    frames = enc.start(12)
    for event in [ReasoningDelta("th"), ReasoningDelta("ink"), ContentDelta("Hel"), ContentDelta("lo"),
                  ToolCallDelta(0, ToolCall("write", '{"path":"p"}', id="call_1")),
                  TurnEnd("tool_calls", Usage(12, 7))]:
        frames += enc.encode(event)
    events = _events(frames)
    names = [n for n, _ in events]
    assert names == ["message_start", "ping",  # the thinking block ends with its signature_delta
                     "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta",
                     "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
                     "content_block_start", "content_block_delta", "content_block_stop",
                     "message_delta", "message_stop"]
    starts = [p for n, p in events if n == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1, 2]
    assert [s["content_block"]["type"] for s in starts] == ["thinking", "text", "tool_use"]
    deltas = [p["delta"] for n, p in events if n == "content_block_delta"]
    assert [d["type"] for d in deltas] == ["thinking_delta"] * 2 + ["signature_delta"] + ["text_delta"] * 2 + [
        "input_json_delta"]
    assert enc.signer.verify("think", deltas[2]["signature"])
    assert json.loads(deltas[-1]["partial_json"]) == {"path": "p"}
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 7 and events[0][1]["message"]["usage"]["input_tokens"] == 12


def test_stream_failure_still_ends_with_message_stop():
    enc = MessagesStream(id="msg_1", model="m")
    frames = enc.start(3) + enc.encode(ContentDelta("par"))
    frames += enc.encode(TurnEnd("error", Usage(3, 1), error="engine broke"))
    assert enc.fail("again") == []  # only one terminal sequence
    names = [n for n, _ in _events(frames)]
    assert names[-3:] == ["content_block_stop", "error", "message_stop"]
    error = _events(frames)[-2][1]
    assert error["error"] == {"type": "api_error", "message": "engine broke"}


def test_billing_header_is_left_out_of_the_prompt():
    """Claude Code's per-version billing line would defeat prefix reuse; two requests
    that differ only there render to the same system message."""
    import copy
    import json

    from tests.conftest import shared_path
    from jumpahead.proxy.anthropic_messages import parse_messages_request

    path = shared_path("fixtures", "clients", "claude-code", "001_POST_v1_messages.json")
    body = json.loads(path.read_text())["body"]
    other = copy.deepcopy(body)
    first = other["system"][0]
    assert first["text"].startswith("x-anthropic-billing-header:")
    first["text"] = "x-anthropic-billing-header: cc_version=9.9.9.abc; cc_entrypoint=sdk-cli; cch=12345;"
    a, b = parse_messages_request(body), parse_messages_request(other)
    assert a.messages[0].role == "system" and a.messages[0].content == b.messages[0].content
    assert "billing-header" not in a.messages[0].content
