"""Responses compaction: POST /v1/responses/compact, compaction items sent back, and
`context_management` on /v1/responses, with the real default model, the real server and
the real openai SDK.

Checked: the compact endpoint answers OpenAI's `response.compaction` shape (user
messages, then one compaction item) with fewer prompt tokens than the input; a session
continues through `client.responses.create` with the item; the item rebuilds the same
context every time (a later turn's prompt reuses the earlier turn's whole prompt from the
prefix cache); a tampered or foreign item is a 400 naming it; server-side compaction
puts the item first in the output (streamed too) and the next turn hits the cache on
the compacted prompt; malformed context_management is a 400.
"""

from __future__ import annotations

from typing import Any

import pytest

from jumpahead.proxy.compaction_item import compact_threshold, compaction_item, open_item
from jumpahead.core.errors import APIError
from jumpahead.proxy.signing import Signer
from jumpahead.core.turn import Message, ToolCall

openai = pytest.importorskip("openai")

FILLER = " ".join(f"Side remark {i}: nothing in it is worth keeping for later steps." for i in range(10))


def _text(k: int) -> str:
    return (f"Step {k}. I looked at src/schema.py: `validate_data` gets None from the nested loader (case{k}). "
            f"I must keep the public API. Maybe the loader swallows the error? {FILLER}")


def session_items(steps: int = 6) -> list[dict[str, Any]]:
    """A coding session as Responses input items: long visible text before each finished call."""
    items: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug in src/schema.py."}]
    for k in range(steps):
        items += [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": _text(k)}]},
            {"type": "function_call", "call_id": f"c{k}", "name": "bash",
             "arguments": f'{{"command": "pytest -x -k case{k}"}}'},
            {"type": "function_call_output", "call_id": f"c{k}", "output": f"exit 1: TypeError in case{k}"},
        ]
    items.append({"role": "user", "content": "Summarize what you found in one word."})
    return items


TOOLS = [{"type": "function", "name": "bash", "description": "Run a command",
          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}]
INSTRUCTIONS = "You are a coding agent."


def _dump(items: list[Any]) -> list[dict[str, Any]]:
    return [i if isinstance(i, dict) else i.model_dump(exclude_none=True, warnings=False) for i in items]


# --- the item itself, without a model -----------------------------------------------------

def test_item_round_trip_and_tamper() -> None:
    signer = Signer(b"k" * 32)
    messages = [Message("user", "hi"), Message("assistant", "x", reasoning="r", tool_calls=[ToolCall("f", "{}", "c1")]),
                Message("tool", "out", tool_call_id="c1", name="f")]
    item = compaction_item(messages, signer)
    assert item["type"] == "compaction" and item["id"].startswith("cmp_")
    assert open_item(item, signer, "input[0]") == messages
    sealed = item["encrypted_content"]
    body, _, mac = sealed.partition(".")
    for bad in (body[:-2] + ("A" if body[-2] != "A" else "B") + body[-1] + "." + mac,  # text altered
                sealed[:-3] + "xyz",  # signature altered
                "gAAAAABopenai-style-opaque-blob",  # another server's item
                signer.seal("a reasoning text")):  # a reasoning seal is not a context
        with pytest.raises(APIError) as err:
            open_item({"type": "compaction", "encrypted_content": bad}, signer, "input[3]")
        assert err.value.status == 400 and "input[3]" in err.value.message and "did not issue" in err.value.message
    with pytest.raises(APIError, match="non-empty string"):
        open_item({"type": "compaction"}, signer, "input[0]")
    with pytest.raises(APIError):  # another key: does not verify
        open_item(item, Signer(b"j" * 32), "input[0]")


def test_context_management_is_checked() -> None:
    assert compact_threshold({}) is None
    assert compact_threshold({"context_management": [{"type": "compaction", "compact_threshold": 500}]}) == 500
    assert compact_threshold({"context_management": [{"type": "compaction"}]}) == 0  # the default threshold
    for bad in ({"type": "compaction", "compact_threshold": -1}, {"type": "compaction", "compact_threshold": "9"},
                {"type": "compaction", "compact_threshold": True}, {"type": "compaction", "compact_threshold": 0},
                {"type": "truncation"}, "compaction"):
        with pytest.raises(APIError) as err:
            compact_threshold({"context_management": [bad]})
        assert err.value.status == 400 and "context_management[0]" in err.value.message
    with pytest.raises(APIError, match="array"):
        compact_threshold({"context_management": {"type": "compaction"}})


# --- through the real server and the openai SDK ---------------------------------------------

@pytest.fixture(scope="module")
def client(engine):
    from .serving import serve

    with serve(engine) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300)


def _create(client: Any, input_items: list[dict[str, Any]], **kw: Any) -> Any:
    return client.responses.create(model="m", instructions=INSTRUCTIONS, input=input_items, tools=TOOLS,
                                   max_output_tokens=4, temperature=0, **kw)


def test_compact_endpoint_then_the_session_continues_with_the_item(client) -> None:
    items = session_items()
    plain = _create(client, items)
    compacted = client.responses.compact(model="m", instructions=INSTRUCTIONS, input=items)
    assert compacted.object == "response.compaction" and compacted.id.startswith("resp_")
    output = _dump(compacted.output)
    # OpenAI's shape: every user message, then a single compaction item
    assert [i["type"] for i in output] == ["message", "message", "compaction"]
    assert [i["role"] for i in output[:2]] == ["user", "user"]
    assert output[-1]["encrypted_content"].startswith("ja3:")
    report = compacted.model_dump(warnings=False)["jumpahead"]["compaction"]
    assert report["decision"] == "rewritten" and report["segments"] == 5  # the newest step is the last turn
    assert compacted.usage.input_tokens == report["tokens_before"] > report["tokens_after"] + 200

    # the session goes on from the item: fewer prompt tokens than the uncompacted input
    follow = [*output, {"role": "user", "content": "Go on."}]
    first = _create(client, follow)
    assert first.status in ("completed", "incomplete")
    assert first.usage.input_tokens < plain.usage.input_tokens - 200
    # the item rebuilds the same context every time: the same request again reuses its
    # whole prompt, and the next turn (answer + new message appended) reuses it too
    again = _create(client, follow)
    assert again.usage.input_tokens == first.usage.input_tokens
    assert again.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1
    nxt = _create(client, [*follow, *_dump(first.output), {"role": "user", "content": "And then?"}])
    assert nxt.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1, nxt.usage
    print(f"\ncompact: {plain.usage.input_tokens} -> {first.usage.input_tokens} prompt tokens; next turn "
          f"{nxt.usage.input_tokens_details.cached_tokens}/{nxt.usage.input_tokens} cached")


def test_tampered_or_foreign_item_is_a_400(client) -> None:
    compacted = client.responses.compact(model="m", instructions=INSTRUCTIONS, input=session_items(3))
    output = _dump(compacted.output)
    sealed = output[-1]["encrypted_content"]
    body, _, mac = sealed.partition(".")
    flipped = body[:10] + ("A" if body[10] != "A" else "B") + body[11:]
    for bad in (f"{flipped}.{mac}", "gAAAAABforeign-opaque-content"):
        tampered = [*output[:-1], {**output[-1], "encrypted_content": bad}, {"role": "user", "content": "Go on."}]
        with pytest.raises(openai.BadRequestError) as err:
            _create(client, tampered)
        assert err.value.status_code == 400
        assert "compaction item this server did not issue" in err.value.message
        assert err.value.body["param"] == f"input[{len(output) - 1}].encrypted_content"


def test_context_management_compacts_server_side_and_the_next_turn_hits_the_cache(client) -> None:
    items = session_items()
    plain = _create(client, items)
    cm = [{"type": "compaction", "compact_threshold": 500}]
    first = _create(client, items, context_management=cm)
    output = _dump(first.output)
    assert output[0]["type"] == "compaction" and output[0]["encrypted_content"].startswith("ja3:")
    assert all(i["type"] != "compaction" for i in output[1:])
    assert first.usage.input_tokens < plain.usage.input_tokens - 200  # it ran on the compacted context
    # stateless chaining: the earlier items, the output (with the item), a new message
    nxt = _create(client, [*items, *output, {"role": "user", "content": "Go on."}], context_management=cm)
    assert nxt.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 1, nxt.usage
    assert all(i.type != "compaction" for i in nxt.output)  # nothing new finished: nothing to compact
    # dropping what came before the item (the guide's latency tip) gives the same prompt
    short = _create(client, [*output, {"role": "user", "content": "Go on."}], context_management=cm)
    assert short.usage.input_tokens == nxt.usage.input_tokens
    assert short.usage.input_tokens_details.cached_tokens >= short.usage.input_tokens - 1
    # previous_response_id chaining continues from the compacted conversation
    chained = client.responses.create(model="m", instructions=INSTRUCTIONS, previous_response_id=first.id,
                                      input="Go on.", tools=TOOLS, max_output_tokens=4, temperature=0)
    assert chained.usage.input_tokens == nxt.usage.input_tokens


def test_context_management_streams_the_item_first(client) -> None:
    cm = [{"type": "compaction", "compact_threshold": 500}]
    events = list(_create(client, session_items(), context_management=cm, stream=True))
    assert events[-1].type in ("response.completed", "response.incomplete")
    final = events[-1].response
    added = [e for e in events if e.type == "response.output_item.added"]
    assert added[0].item.type == "compaction" and added[0].output_index == 0
    assert final.output[0].type == "compaction"
    assert final.output[0].encrypted_content == added[0].item.encrypted_content
    # under the threshold nothing is compacted
    small = _create(client, session_items(), context_management=[{"type": "compaction", "compact_threshold": 100000}])
    assert all(i.type != "compaction" for i in small.output)


def test_malformed_context_management_is_a_400(client) -> None:
    for cm in ([{"type": "compaction", "compact_threshold": -5}], [{"type": "other"}], {"type": "compaction"}):
        with pytest.raises(openai.BadRequestError) as err:
            _create(client, session_items(1), context_management=cm)
        assert "context_management" in err.value.message


def test_model_written_compaction_and_bad_options(client) -> None:
    """`jumpahead.compaction` passes the compaction policy's options: the serving model
    writes the account (mode=model); a bad option is a 400 naming the field."""
    compacted = client.responses.compact(model="m", instructions=INSTRUCTIONS, input=session_items(2),
                                         extra_body={"jumpahead": {"compaction": {"mode": "model",
                                                                                  "summary_tokens": 8}}})
    report = compacted.model_dump(warnings=False)["jumpahead"]["compaction"]
    assert report["decision"] == "rewritten" and report["segments"] == 1 and "fallback" not in report, report
    assert report["tokens_after"] < report["tokens_before"]
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.compact(model="m", input=session_items(2),
                                 extra_body={"jumpahead": {"compaction": {"mode": "magic"}}})
    assert "jumpahead.compaction" in err.value.message and "mode" in err.value.message


def test_compacting_again_keeps_what_the_earlier_item_stands_for(client) -> None:
    """A second compaction over an item leaves the item's messages as they were (their
    prompt tokens stay a cached prefix) and compacts only the steps after it."""
    from jumpahead.proxy.signing import default_signer

    first = _dump(client.responses.compact(model="m", instructions=INSTRUCTIONS, input=session_items(4)).output)
    later = session_items(8)[1 + 3 * 4:]  # steps 4..7 and the closing user message
    second = client.responses.compact(model="m", instructions=INSTRUCTIONS, input=[*first, *later])
    report = second.model_dump(warnings=False)["jumpahead"]["compaction"]
    # steps 4..6 (7 is the last turn); step 3, the newest step at the first compaction, is inside the item
    assert report["decision"] == "rewritten" and report["segments"] == 3
    signer = default_signer()  # the in-process server's key
    kept = open_item(first[-1], signer, "first")
    again = open_item(_dump(second.output)[-1], signer, "second")
    assert again[:len(kept)] == kept and len(again) > len(kept)
