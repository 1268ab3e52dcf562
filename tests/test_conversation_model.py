"""One conversation model: an imported session's messages are the turn pipeline's own
Messages and ToolCalls, written in the one JSON form a trace context uses; content
blocks are read by one walker under each reader's own rules."""

from __future__ import annotations

import orjson
import pytest

from jumpahead.core.errors import APIError
from jumpahead.core.turn import Message, ToolCall
from jumpahead.proxy.anthropic_messages import _text_of
from jumpahead.proxy.openai_chat import IMAGE_PLACEHOLDER
from jumpahead.proxy.openai_chat import content_text as chat_content_text
from jumpahead.traces.importers._common import content_text as importer_content_text
from jumpahead.traces.session import Session
from jumpahead.traces.turn_json import message_from_json, message_to_json, turn_from_json, turn_to_json


def test_a_call_given_a_json_value_holds_its_compact_text() -> None:
    call = ToolCall("write", {"path": "a.py", "content": "x = 1\n"}, "c1")
    assert call.arguments == '{"path":"a.py","content":"x = 1\\n"}'
    assert call.args == {"path": "a.py", "content": "x = 1\n"}
    assert ToolCall("bash", "ls -la | head").args == "ls -la | head"  # raw-text arguments stay text
    assert ToolCall("noop", "").args == {} and ToolCall("noop").args == {}
    assert ToolCall("f", '{"broken": ').args == '{"broken": '
    assert ToolCall("f").id == ""  # a recorded call without an id stays without one


def _session() -> Session:
    return Session(id="s", format="test", messages=[
        Message("system", "You are an agent."),
        Message("user", "Fix it.", timestamp="2026-12-03T10:00:00Z"),
        Message("assistant", "", reasoning="", tool_calls=[ToolCall("read", {"path": "a.py"})], model="m-1",
                meta={"thinking": True}),
        Message("tool", "x = 1", tool_call_id="", name="read"),
        Message("assistant", None, reasoning="Done reading.", tool_calls=[ToolCall("write", {"path": "a.py"}, "w1")]),
    ], tools=[{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}])


def test_a_session_round_trips_exactly_through_the_one_message_json() -> None:
    session = _session()
    data = orjson.loads(orjson.dumps(session.to_dict()))
    again = Session.from_dict(data)
    assert again == session
    # reasoning "" and None stay apart, provenance is kept
    assert again.messages[2].reasoning == "" and again.messages[0].reasoning is None and again.messages[4].content is None
    assert again.messages[2].model == "m-1" and again.messages[1].timestamp == "2026-12-03T10:00:00Z"
    assert data["messages"][2] == message_to_json(session.messages[2])


def test_a_session_file_written_with_object_arguments_still_reads() -> None:
    old = {"id": "s", "format": "pi", "messages": [
        {"role": "assistant", "content": "", "reasoning": "r", "model": "m",
         "tool_calls": [{"name": "read", "arguments": {"path": "a.py"}, "id": "c1"}], "meta": {}}]}
    message = Session.from_dict(old).messages[0]
    assert message.tool_calls[0].arguments == '{"path":"a.py"}' and message.model == "m"


def test_the_turn_a_session_asks_carries_no_provenance_and_names_every_call() -> None:
    turn = _session().turn(4)
    sent = turn.messages
    assert [m.role for m in sent] == ["system", "user", "assistant", "tool"]
    assert sent[2].tool_calls[0].id == "call_2_0" and sent[2].tool_calls[0].arguments == '{"path":"a.py"}'
    assert sent[2].reasoning is None and sent[2].content == ""
    assert all(m.model is None and m.timestamp is None and m.meta == {} for m in sent)
    # and the trace's context form of that turn rebuilds it
    assert turn_from_json(orjson.loads(orjson.dumps(turn_to_json(turn)))).messages == sent
    assert message_from_json(message_to_json(sent[2])) == sent[2]


BLOCKS = ["plain ", {"type": "text", "text": "one"}, {"type": "image_url", "image_url": {"url": "x"}},
          {"type": "text", "text": "two"}]


def test_one_walker_three_readers_of_content_blocks() -> None:
    assert chat_content_text(BLOCKS, "messages[0].content") == f"plain \none\n{IMAGE_PLACEHOLDER}\ntwo"
    assert importer_content_text(BLOCKS) == "plain \n\none\n\ntwo"  # importers drop what is no text
    assert _text_of([BLOCKS[0], BLOCKS[1], BLOCKS[3]], "system") == "plain \none\ntwo"
    for read in (lambda c: chat_content_text(c, "c"), importer_content_text, lambda c: _text_of(c, "c")):
        assert read("as is") == "as is" and read({"type": "text", "text": "one block"}) == "one block"
    assert chat_content_text(None, "c") is None and _text_of(None, "c") == "" and importer_content_text(None) == ""
    assert importer_content_text(42) == "42"  # lenient: a stray value becomes its text
    with pytest.raises(APIError, match=r"messages\[0\]\.content\[1\]\.text must be a string"):
        chat_content_text(["a", {"type": "text", "text": 3}], "messages[0].content")
    with pytest.raises(APIError, match=r"system must be a string or an array"):
        _text_of(42, "system")
    with pytest.raises(APIError, match=r"system\[0\]: this model reads text only"):
        _text_of([{"type": "image", "source": {}}], "system")
