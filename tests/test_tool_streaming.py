"""Tool-call arguments stream as they are written, in all three protocols.

Through the real server and the official SDKs: a scripted turn (serve --script: the
default model appends it as asserted tokens, in one round) and calls the default model
writes itself, token by token, under tool_choice required. The streamed argument
deltas, reassembled, must equal the non-streamed answer; a call cut off by max_tokens
stays a partial call with the protocol's length finish.
"""

from __future__ import annotations

import json

import pytest

from jumpahead.core.script import Script, ScriptedCall, ScriptTurn

from .serving import engine_of, serve

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

ARGS = {"path": "hello.py", "content": "def greet(name):\n    return f\"hello {name}\"\n\nprint(greet('world'))\n"}
TURN = ScriptTurn(reasoning="Write the file.", text="Writing it.", tool_calls=[ScriptedCall("write", ARGS)])
WRITE_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "write", "description": "Write a file",
                                                "parameters": WRITE_SCHEMA}}]
ANTHROPIC_TOOLS = [{"name": "write", "description": "Write a file", "input_schema": WRITE_SCHEMA}]
RESPONSES_TOOLS = [{"type": "function", "name": "write", "description": "Write a file", "parameters": WRITE_SCHEMA}]
MESSAGES = [{"role": "user", "content": "Write hello.py"}]
CUT = 45  # max_tokens that ends the scripted turn inside the content argument


@pytest.fixture(scope="module")
def engine(loaded_model, tmp_path_factory):
    # A whole scripted turn per round (a turn cut across rounds gets sampled tokens
    # between its slices in script mode; see the report of issue 12).
    with engine_of(loaded_model, max_batch=2, max_asserted=1024,
                   prefix_cache_dir=str(tmp_path_factory.mktemp("pc"))) as eng:
        yield eng


def _chat(url: str):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="dummy", max_retries=0, timeout=600)


def _anthropic(url: str):
    return anthropic.Anthropic(base_url=url, api_key="dummy", max_retries=0, timeout=600)


def _chat_stream(client, **kwargs) -> tuple[list[str], dict, str | None, str]:
    """Argument deltas of call 0, the call as assembled, the finish reason, the content."""
    deltas: list[str] = []
    call: dict = {}
    finish = None
    content = ""
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for tc in choice.delta.tool_calls or []:
            assert tc.index == 0
            if tc.id:
                call.update(id=tc.id, name=tc.function.name, arguments="")
            if tc.function and tc.function.arguments:
                deltas.append(tc.function.arguments)
                call["arguments"] += tc.function.arguments
        finish = choice.finish_reason or finish
    return deltas, call, finish, content


def test_chat_arguments_stream_and_match_the_answer(engine):
    with serve(engine, script=Script([TURN, TURN])) as url:
        client = _chat(url)
        whole = client.chat.completions.create(model="m", messages=MESSAGES, tools=CHAT_TOOLS)
        deltas, call, finish, content = _chat_stream(client, model="m", messages=MESSAGES, tools=CHAT_TOOLS)
    (expected,) = whole.choices[0].message.tool_calls
    assert deltas, deltas
    assert call["name"] == expected.function.name == "write"
    assert call["arguments"] == expected.function.arguments
    assert json.loads(call["arguments"]) == ARGS
    assert finish == whole.choices[0].finish_reason == "tool_calls"
    assert content == whole.choices[0].message.content == "Writing it."


def test_anthropic_input_json_streams_and_matches_the_answer(engine):
    with serve(engine, script=Script([TURN, TURN])) as url:
        client = _anthropic(url)
        whole = client.messages.create(model="m", max_tokens=400, messages=MESSAGES, tools=ANTHROPIC_TOOLS)
        with client.messages.stream(model="m", max_tokens=400, messages=MESSAGES, tools=ANTHROPIC_TOOLS) as stream:
            events = list(stream)
            final = stream.get_final_message()
    parts = [e.delta.partial_json for e in events if e.type == "content_block_delta"
             and e.delta.type == "input_json_delta"]
    assert parts and json.loads("".join(parts)) == ARGS
    assert [b.type for b in final.content] == [b.type for b in whole.content] == ["thinking", "text", "tool_use"]
    assert final.content[2].input == whole.content[2].input == ARGS
    assert final.content[2].name == "write" and final.stop_reason == whole.stop_reason == "tool_use"


def test_responses_arguments_stream_and_match_the_answer(engine):
    with serve(engine, script=Script([TURN, TURN])) as url:
        client = _chat(url)
        whole = client.responses.create(model="m", input="Write hello.py", tools=RESPONSES_TOOLS)
        events = list(client.responses.create(model="m", input="Write hello.py", tools=RESPONSES_TOOLS, stream=True))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert deltas and "".join(deltas) == done.arguments
    (expected,) = [i for i in whole.output if i.type == "function_call"]
    (streamed,) = [i for i in events[-1].response.output if i.type == "function_call"]
    assert streamed.arguments == expected.arguments and json.loads(expected.arguments) == ARGS
    assert streamed.name == expected.name == "write"
    # the item was announced before its arguments, once
    added = [e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    assert len(added) == 1 and events.index(added[0]) < events.index(
        next(e for e in events if e.type == "response.function_call_arguments.delta"))


# --- cut off by max_tokens ----------------------------------------------------------


def test_cut_off_call_stays_a_partial_call_in_every_protocol(engine):
    turns = [TURN] * 6
    with serve(engine, script=Script(turns)) as url:
        chat, messages = _chat(url), _anthropic(url)
        whole = chat.chat.completions.create(model="m", messages=MESSAGES, tools=CHAT_TOOLS, max_tokens=CUT)
        deltas, call, finish, content = _chat_stream(chat, model="m", messages=MESSAGES, tools=CHAT_TOOLS,
                                                     max_tokens=CUT)
        m_whole = messages.messages.create(model="m", max_tokens=CUT, messages=MESSAGES, tools=ANTHROPIC_TOOLS)
        with messages.messages.stream(model="m", max_tokens=CUT, messages=MESSAGES, tools=ANTHROPIC_TOOLS) as s:
            m_final = s.get_final_message()
        r_whole = chat.responses.create(model="m", input="Write hello.py", tools=RESPONSES_TOOLS,
                                        max_output_tokens=CUT)
        r_events = list(chat.responses.create(model="m", input="Write hello.py", tools=RESPONSES_TOOLS,
                                              max_output_tokens=CUT, stream=True))
    # chat: a tool call with the arguments so far, finish_reason length, no markup as text
    choice = whole.choices[0]
    assert choice.finish_reason == finish == "length"
    (partial,) = choice.message.tool_calls
    assert partial.function.name == call["name"] == "write"
    # (script mode samples the last token before max_tokens instead of asserting it,
    # so each answer is checked against the script up to that token, not the other)
    for arguments in (partial.function.arguments, call["arguments"]):
        got = _partial_content(arguments)
        same = next((i for i, (x, y) in enumerate(zip(got, ARGS["content"])) if x != y), min(len(got), 80))
        assert same >= max(len(got) - 8, 10), (got, ARGS["content"])  # all but the sampled last token
    assert "<tool_call>" not in (choice.message.content or "") and "<tool_call>" not in content
    # anthropic: a tool_use block, stop_reason max_tokens
    assert m_whole.stop_reason == m_final.stop_reason == "max_tokens"
    assert [b.type for b in m_whole.content][-1] == "tool_use" and m_whole.content[-1].name == "write"
    assert m_final.content[-1].input["path"] == m_whole.content[-1].input["path"] == "hello.py"
    assert all("<tool_call>" not in getattr(b, "text", "") for b in m_whole.content)
    # responses: incomplete, the call item kept
    assert r_whole.status == r_events[-1].response.status == "incomplete"
    (r_call,) = [i for i in r_whole.output if i.type == "function_call"]
    (s_call,) = [i for i in r_events[-1].response.output if i.type == "function_call"]
    assert r_call.name == s_call.name == "write"
    assert _partial_content(r_call.arguments) and _partial_content(s_call.arguments)
    assert "".join(e.delta for e in r_events if e.type == "response.function_call_arguments.delta") == s_call.arguments
    assert "<tool_call>" not in (r_whole.output_text or "")


def _partial_content(arguments: str) -> str:
    from jumpahead.core.tool_stream import partial_json

    value = partial_json(arguments)
    assert isinstance(value, dict) and value.get("path") == "hello.py", arguments
    return value.get("content", "")


# --- the default model writes the call itself (tool_choice required) ----------------

ASK = "Create notes.txt saying hi"


@pytest.fixture(scope="module")
def decoding_url(loaded_model):
    """A server on an engine without prefix cache: two identical greedy requests
    decode the same tokens (a cache hit would change the float sums)."""
    from jumpahead.engine.engine import Engine, EngineConfig

    model, tokenizer, info = loaded_model
    eng = Engine(model, tokenizer, info, EngineConfig(max_batch=2, prefix_cache=False))
    try:
        with serve(eng) as url:
            yield url
    finally:
        eng.close()


def test_model_written_call_streams_in_chat(decoding_url):
    body = dict(model="m", messages=[{"role": "user", "content": ASK}], tools=CHAT_TOOLS, tool_choice="required",
                temperature=0, max_tokens=48)
    client = _chat(decoding_url)
    whole = client.chat.completions.create(**body)
    deltas, call, finish, _ = _chat_stream(client, **body)
    (expected,) = whole.choices[0].message.tool_calls
    assert expected.function.name == call["name"] == "write"
    assert call["arguments"] == expected.function.arguments
    assert finish == whole.choices[0].finish_reason
    assert len(deltas) > 1, deltas


def test_model_written_call_streams_in_anthropic(decoding_url):
    body = dict(model="m", max_tokens=48, messages=[{"role": "user", "content": ASK}], tools=ANTHROPIC_TOOLS,
                tool_choice={"type": "any"}, extra_body={"temperature": 0})  # this SDK has no temperature
    client = _anthropic(decoding_url)
    whole = client.messages.create(**body)
    with client.messages.stream(**body) as stream:
        events = list(stream)
        final = stream.get_final_message()
    parts = [e.delta.partial_json for e in events if e.type == "content_block_delta"
             and e.delta.type == "input_json_delta"]
    assert len(parts) > 1, parts
    assert [b.type for b in final.content] == [b.type for b in whole.content]
    assert final.content[-1].type == "tool_use" and final.content[-1].name == "write"
    assert final.content[-1].input == whole.content[-1].input and final.stop_reason == whole.stop_reason


def test_model_written_call_streams_in_responses(decoding_url):
    body = dict(model="m", input=ASK, tools=RESPONSES_TOOLS, tool_choice="required", temperature=0,
                max_output_tokens=48)
    client = _chat(decoding_url)
    whole = client.responses.create(**body)
    events = list(client.responses.create(stream=True, **body))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    (expected,) = [i for i in whole.output if i.type == "function_call"]
    (streamed,) = [i for i in events[-1].response.output if i.type == "function_call"]
    assert len(deltas) > 1, deltas
    assert "".join(deltas) == streamed.arguments == expected.arguments
    assert streamed.name == expected.name == "write" and events[-1].response.status == whole.status


# --- encoders, fed the parser's own events (no model) --------------------------------


def _parser_events(text: str, tools, chunk: int = 3):
    from jumpahead.core.output_parser import OutputParser

    parser = OutputParser(tool_start="<tool_call>", tool_end="</tool_call>",
                          tool_parser=lambda body, _tools: json.loads(body), tools=tools)
    events = []
    for i in range(0, len(text), chunk):
        events += parser.feed(text[i:i + chunk])
    return events + parser.finish()


def test_custom_tool_input_streams_as_its_string():
    from jumpahead.proxy.openai_responses import CUSTOM_INPUT_SCHEMA, parse_responses_request
    from jumpahead.proxy.responses_stream import ResponsesStream
    from jumpahead.core.turn import Tool, TurnEnd, Usage

    patch = "*** Begin Patch\n*** Add File: a.py\n+print(\"h\u00e9llo\")\n*** End Patch\n"
    body = json.dumps({"name": "apply_patch", "arguments": {"input": patch}})
    events = _parser_events(f"<tool_call>\n{body}\n</tool_call>", [Tool("apply_patch", "", CUSTOM_INPUT_SCHEMA)])
    _, ctx = parse_responses_request({"input": "x", "tools": [{"type": "custom", "name": "apply_patch"}]})
    enc = ResponsesStream(ctx, id="resp_1", model="m", created_at=1)
    frames = b"".join(f for e in [*events, TurnEnd("tool_calls", Usage(1, 1))] for f in enc.encode(e))
    payloads = [json.loads(line[6:]) for line in frames.decode().splitlines() if line.startswith("data: ")]
    deltas = [p["delta"] for p in payloads if p["type"] == "response.custom_tool_call_input.delta"]
    (done,) = [p for p in payloads if p["type"] == "response.custom_tool_call_input.done"]
    assert len(deltas) > 1 and "".join(deltas) == done["input"] == patch
    assert [p["item"]["type"] for p in payloads if p["type"] == "response.output_item.added"] == ["custom_tool_call"]


def test_streamed_arguments_are_always_a_prefix_of_the_final_ones():
    from jumpahead.core.turn import Tool, ToolCallArgs, ToolCallDelta, ToolCallStart

    args = {"a": 1.5, "b": [1, 20, {"c": "x\"y\\z"}], "d": True, "e": None, "n": -12, "big": 1e21,
            "u": "\u4e16\U0001F600"}
    text = f"<tool_call>\n{json.dumps({'name': 'f', 'arguments': args})}\n</tool_call>"
    for chunk in (1, 2, 5):
        events = _parser_events(text, [Tool("f")], chunk)
        streamed = "".join(e.text for e in events if isinstance(e, ToolCallArgs))
        (final,) = [e for e in events if isinstance(e, ToolCallDelta)]
        assert [type(e).__name__ for e in events].count("ToolCallStart") == 1
        assert final.call.arguments.startswith(streamed) and streamed + final.rest == final.call.arguments
        assert json.loads(final.call.arguments) == args
        assert final.call.id == next(e for e in events if isinstance(e, ToolCallStart)).call.id
