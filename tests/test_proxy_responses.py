"""OpenAI Responses requests -> Turn (items, tools, previous_response_id), output -> items and events."""

from __future__ import annotations

import json

import orjson
import pytest

from jumpahead.core.errors import APIError
from jumpahead.proxy.openai_responses import (
    assistant_message,
    call_item,
    output_items,
    parse_responses_request,
    reasoning_item,
)
from jumpahead.proxy.response_store import ResponseStore, StoredResponse
from jumpahead.proxy.responses_stream import ResponsesStream
from jumpahead.core.turn import ContentDelta, Message, ReasoningDelta, ToolCall, ToolCallDelta, TurnEnd, TurnOutput, Usage

from .conftest import shared_path

FN = {"type": "function", "name": "write", "description": "Write", "strict": False,
      "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}


def test_pi_body():
    path = shared_path("fixtures", "clients", "pi-responses", "002_POST_v1_responses.json")
    body = json.loads(path.read_text())["body"]
    turn, ctx = parse_responses_request(body)
    assert [m.role for m in turn.messages] == ["system", "user", "assistant", "tool"]
    (call,) = turn.messages[2].tool_calls
    assert call.name == "write" and call.id == turn.messages[3].tool_call_id
    assert [t.name for t in turn.tools] == ["read", "bash", "edit", "write"]
    assert turn.stream and turn.max_tokens == 8192 and ctx.store is False and ctx.include_encrypted
    assert turn.extra["prompt_cache_key"] and turn.thinking is None


def test_items_roles_and_reasoning():
    stored = reasoning_item("earlier thought", parse_responses_request({"input": "x", "include":
                                                                        ["reasoning.encrypted_content"]})[1])
    body = {
        "instructions": "be brief",
        "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
            {"type": "message", "role": "user", "content": "hi"},
            {**stored, "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "calling"}]},
            {"type": "function_call", "call_id": "c1", "name": "write", "arguments": "{\"path\": \"p\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "ok"}]},
            {"type": "item_reference", "id": "x"},
            {"type": "web_search_call", "id": "ws", "status": "completed"},
        ],
        "tools": [FN], "tool_choice": {"type": "function", "name": "write"},
        "reasoning": {"effort": "none"}, "temperature": 0.5, "unknown": True,
    }
    turn, _ = parse_responses_request(body)
    assert [(m.role, m.content) for m in turn.messages] == [
        ("system", "be brief"), ("system", "dev"), ("user", "hi"), ("assistant", "calling"), ("tool", "ok")]
    assert turn.messages[3].reasoning == "earlier thought"  # read back from encrypted_content
    assert turn.messages[3].tool_calls[0].arguments == '{"path": "p"}'
    assert (turn.tool_choice.mode, turn.tool_choice.name) == ("function", "write")
    assert turn.thinking is False and turn.sampling.temperature == 0.5


def test_namespace_flattened_hosted_tools_skipped_custom_tools_offered():
    nested = {"type": "namespace", "name": "mcp__files", "description": "files", "tools": [
        {"type": "function", "name": "read", "parameters": {"type": "object", "properties": {}}},
        {"type": "function", "name": "write", "parameters": {"type": "object", "properties": {}}}]}
    custom = {"type": "custom", "name": "apply_patch", "description": "patch", "format": {"type": "text"}}
    body = {"input": "x", "tools": [FN, nested, custom, {"type": "web_search"}, {"type": "file_search"}]}
    turn, ctx = parse_responses_request(body)
    assert [t.name for t in turn.tools] == ["write", "read", "mcp__files__write", "apply_patch"]
    assert turn.tools[3].parameters["properties"]["input"]["type"] == "string"
    item = call_item(ToolCall("read", "{}", id="c"), ctx)
    assert (item["name"], item["namespace"]) == ("read", "mcp__files")
    item = call_item(ToolCall("mcp__files__write", "{}", id="c"), ctx)
    assert (item["type"], item["name"], item["namespace"]) == ("function_call", "write", "mcp__files")
    item = call_item(ToolCall("apply_patch", '{"input": "*** Begin Patch"}', id="c"), ctx)
    assert item["type"] == "custom_tool_call" and item["input"] == "*** Begin Patch"
    assert "namespace" not in call_item(ToolCall("write", "{}", id="c"), ctx)
    # the client's namespaced call comes back as the model-visible name
    turn, _ = parse_responses_request({**body, "input": [
        {"type": "function_call", "call_id": "c", "name": "write", "namespace": "mcp__files", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "ok"}]})
    assert turn.messages[0].tool_calls[0].name == "mcp__files__write"


def test_previous_response_id_and_bounded_store():
    store = ResponseStore(max_entries=2)
    history = [Message("user", "first"), Message("assistant", "answer")]
    store.put("resp_1", StoredResponse(history, {"id": "resp_1"}))
    turn, ctx = parse_responses_request({"input": "second", "previous_response_id": "resp_1",
                                         "instructions": "sys"}, store)
    assert [(m.role, m.content) for m in turn.messages] == [
        ("system", "sys"), ("user", "first"), ("assistant", "answer"), ("user", "second")]
    assert [m.content for m in ctx.history] == ["first", "answer", "second"]  # instructions do not carry over
    assert history == [Message("user", "first"), Message("assistant", "answer")]  # stored copy untouched
    with pytest.raises(APIError) as exc:
        parse_responses_request({"input": "x", "previous_response_id": "resp_gone"}, store)
    assert exc.value.status == 400 and exc.value.code == "previous_response_not_found"
    store.put("resp_2", StoredResponse([]))
    store.get("resp_1")  # recently used: kept
    store.put("resp_3", StoredResponse([]))
    assert store.get("resp_1") is not None and store.get("resp_2") is None and len(store) == 2


@pytest.mark.parametrize("body, param", [
    ("x", None),
    ({"input": 5}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"input": "x", "tools": {}}, "tools"),
    ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "temperature": "hot"}, "temperature"),
    ({"input": "x", "instructions": ["a"]}, "instructions"),
    ({"input": "x", "previous_response_id": 3}, "previous_response_id"),
])
def test_bad_bodies_are_400_naming_the_field(body, param):
    with pytest.raises(APIError) as exc:
        parse_responses_request(body)
    assert exc.value.status == 400 and exc.value.param == param


def test_output_items_and_assistant_message():
    _, ctx = parse_responses_request({"input": "x", "tools": [FN]})
    out = TurnOutput(reasoning="r", content="c", tool_calls=[ToolCall("write", "{}", id="call_1")],
                     finish_reason="tool_calls")
    items = output_items(out, ctx)
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call"]
    assert "encrypted_content" not in items[0] and items[1]["content"][0]["text"] == "c"
    assert items[2]["call_id"] == "call_1" and items[2]["status"] == "completed"
    message = assistant_message(out)
    assert (message.content, message.reasoning, message.tool_calls[0].id) == ("c", "r", "call_1")


def _events(frames: list[bytes]) -> list[dict]:
    out = []
    for frame in frames:
        if frame.startswith(b":"):
            continue
        head, data = frame.decode().strip().split("\n")
        payload = orjson.loads(data.removeprefix("data: "))
        assert payload["type"] == head.removeprefix("event: ")
        out.append(payload)
    return out


def test_stream_events():
    _, ctx = parse_responses_request({"input": "x", "tools": [FN]})
    enc = ResponsesStream(ctx, id="resp_1", model="m", created_at=1)
    frames = enc.start()
    for event in [ReasoningDelta("thi"), ReasoningDelta("nk"), ContentDelta("Hel"), ContentDelta("lo"),
                  ToolCallDelta(0, ToolCall("write", '{"path":"p"}', id="call_1")), TurnEnd("tool_calls", Usage(5, 9))]:
        frames += enc.encode(event)
    events = _events(frames)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta", "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done", "response.reasoning_summary_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert [e["output_index"] for e in done] == [0, 1, 2]
    final = events[-1]["response"]
    assert final["status"] == "completed" and [i["type"] for i in final["output"]] == [
        "reasoning", "message", "function_call"]
    assert final["output"][1]["content"][0]["text"] == "Hello" and final["usage"]["output_tokens"] == 9
    assert enc.out.content == "Hello" and enc.out.tool_calls[0].id == "call_1"

    enc = ResponsesStream(ctx, id="resp_2", model="m")
    frames = enc.start() + enc.encode(ContentDelta("a")) + enc.encode(TurnEnd("length", Usage(1, 1)))
    assert _events(frames)[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_stream_failure_ends_with_response_failed():
    _, ctx = parse_responses_request({"input": "x"})
    enc = ResponsesStream(ctx, id="resp_1", model="m")
    frames = enc.start() + enc.encode(ContentDelta("par")) + enc.fail("engine broke")
    events = _events(frames)
    assert [e["type"] for e in events][-4:] == [
        "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.failed"]
    assert events[-1]["response"]["error"] == {"code": "server_error", "message": "engine broke"}
    assert enc.fail("again") == []
