"""Strict fill on the real default model: constrained decoding with xgrammar, the grammar
jump-forward proposer and the template-scaffold proposer.

Oracles: strict fill yields the same tokens as ordinary (constrained) decoding, at
temperature 0 and with seeded sampling; schema-constrained output validates; the
scaffold never fires in prose, fenced code or a JSON string; telemetry counts strict
tokens.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from jumpahead.engine.strict.grammar import JumpForwardProposer
from jumpahead.engine.methods.proposal import RowView
from jumpahead.engine.types import EngineError, GenerationRequest, SamplingParams
from tests.conftest import shared_path


def _slim(schema):
    """A schema without descriptions (a shorter prompt: these tests run on 2 CPU cores)."""
    if isinstance(schema, dict):
        return {k: _slim(v) for k, v in schema.items() if k != "description"}
    if isinstance(schema, list):
        return [_slim(v) for v in schema]
    return schema


def _client_tools(client: str) -> list[dict]:
    path = shared_path("fixtures", "clients", client, "001_POST_v1_chat_completions.json")
    tools = json.loads(path.read_text())["body"]["tools"]
    out = []
    for tool in tools:
        fn = tool["function"]
        brief = fn.get("description", "").split(". ")[0][:80]
        out.append({"type": "function", "function": {"name": fn["name"], "description": brief,
                                                     "parameters": _slim(fn["parameters"])}})
    return out


@pytest.fixture(scope="module")
def pi_tools() -> list[dict]:
    """pi's four tools (read, bash, edit, write) with their real parameter schemas."""
    return _client_tools("pi-openai")


@pytest.fixture(scope="module")
def bash_tools() -> list[dict]:
    """mini-swe-agent's bash tool."""
    return _client_tools("mini-swe-agent")


def chat(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)


def run(engine, **kw) -> tuple[list[int], list[str], str, object]:
    chunks = engine.generate_sync(GenerationRequest(**kw))
    return (
        [t for c in chunks for t in c.tokens],
        [k for c in chunks for k in c.kinds],
        "".join(c.text for c in chunks),
        chunks[-1],
    )


def few_shot(tools: list[dict], task: str) -> list[dict]:
    """A history of tool calls in the template's format, so the model writes one itself."""

    def call(i: int, name: str, args: dict) -> dict:
        fn = {"name": name, "arguments": args}
        return {"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function", "function": fn}]}

    return [
        {"role": "user", "content": "Show me setup.py"}, call(1, "read", {"path": "setup.py"}),
        {"role": "user", "content": "Run ls"}, call(2, "bash", {"command": "ls"}),
        {"role": "user", "content": "Show me main.py"}, call(3, "read", {"path": "main.py"}),
        {"role": "user", "content": "Run make"}, call(4, "bash", {"command": "make"}),
        {"role": "user", "content": task},
    ]


# --- grammar jump-forward ------------------------------------------------------------


def test_grammar_strict_fill_equals_constrained_decoding(engine, loaded_model, pi_tools, bash_tools):
    """tool_choice required: strict fill on vs off, same tokens; strict tokens counted."""
    _, tokenizer, _ = loaded_model
    cases = [
        (pi_tools, "Read the file src/main.py"),
        (pi_tools, "Replace foo with bar in app.py"),
        (bash_tools, "Run the tests with pytest"),
    ]
    strict_total = 0
    for tools, task in cases:
        prompt = chat(tokenizer, [{"role": "user", "content": task}], tools)
        grammar = {"type": "tool_call", "tools": tools}
        off, _, text, _ = run(engine, prompt=prompt, max_tokens=64, grammar=grammar, methods=["none"])
        on, kinds, text_on, last = run(engine, prompt=prompt, max_tokens=64, grammar=grammar)
        assert on == off, f"{task!r}:\n off {text!r}\n on  {text_on!r}"
        assert text.startswith("<tool_call>\n{\"name\": \"")
        fill = last.fill
        assert fill["tokens"].get("strict", 0) == kinds.count("strict") > 0
        assert fill["verified"]["accepted"] >= fill["tokens"]["strict"]
        assert fill["forwards"] < len(on)  # fewer forwards than tokens
        strict_total += kinds.count("strict")
        call = json.loads(text[len("<tool_call>\n") : text.index("\n</tool_call>")])
        assert call["name"] in {t["function"]["name"] for t in tools}
    assert strict_total >= 30


def test_json_schema_output_validates_and_strict_fill_is_exact(engine, loaded_model):
    _, tokenizer, _ = loaded_model
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 16},
            "country": {"type": "string", "enum": ["France", "Spain", "Germany"]},
            "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 2},
            "capital": {"type": "boolean"},
        },
        "required": ["city", "country", "landmarks", "capital"],
    }
    prompt = chat(tokenizer, [{"role": "user", "content": "Describe Paris as JSON."}])
    grammar = {"type": "json_schema", "schema": schema}
    off, _, text, last_off = run(engine, prompt=prompt, max_tokens=64, grammar=grammar, methods=["none"])
    on, kinds, text_on, last = run(engine, prompt=prompt, max_tokens=64, grammar=grammar)
    assert on == off
    assert last.finish_reason == "stop" and last_off.finish_reason == "stop"
    jsonschema.validate(json.loads(text), schema)
    assert kinds.count("strict") > 0 and "strict" not in last_off.fill["tokens"]
    # json_object: any object
    out = run(engine, prompt=prompt, max_tokens=24, grammar={"type": "json_object"})
    if out[3].finish_reason == "stop":
        assert isinstance(json.loads(out[2]), dict)
    else:
        assert out[2].startswith("{")


def test_seeded_sampling_strict_fill_is_exact(engine, loaded_model, pi_tools):
    """Verified strict tokens are accepted only where the row's sampler picks them."""
    _, tokenizer, _ = loaded_model
    prompt = chat(tokenizer, [{"role": "user", "content": "Show me what is in README.md"}], pi_tools)
    grammar = {"type": "tool_call", "tools": pi_tools}
    sampling = SamplingParams(temperature=0.8, top_p=0.95, seed=7)
    off = run(engine, prompt=prompt, max_tokens=40, grammar=grammar, sampling=sampling, methods=["none"])[0]
    on, kinds, _, _ = run(engine, prompt=prompt, max_tokens=40, grammar=grammar, sampling=sampling)
    assert on == off and "strict" in kinds


def test_asserted_strict_fill_keeps_the_grammar(engine, loaded_model, pi_tools):
    """DESIGN's unverified mode: tokens appended unsampled; output still in the grammar."""
    _, tokenizer, _ = loaded_model
    prompt = chat(tokenizer, [{"role": "user", "content": "Run the tests"}], pi_tools)
    engine.strict.asserted = True
    try:
        tokens, kinds, text, last = run(engine, prompt=prompt, max_tokens=64, grammar={"type": "tool_call", "tools": pi_tools})
    finally:
        engine.strict.asserted = False
    assert kinds.count("strict") >= 15 and last.fill["verified"]["proposed"] == 0
    if last.finish_reason == "stop":
        assert text.endswith("\n</tool_call>")
        call = json.loads(text[len("<tool_call>\n") : -len("\n</tool_call>")])
        assert call["name"] in {"read", "bash", "edit", "write"}


def test_jump_forward_leaves_a_mergeable_last_token_to_the_model(engine, pi_tools):
    """The retokenization boundary: `' "'` before a free string value is not asserted."""
    strict = engine.strict
    tools = [t for t in pi_tools if t["function"]["name"] == "read"]
    hf = strict.book.hf
    asserted = JumpForwardProposer(strict.book.constraint({"type": "tool_call", "tools": tools}), verify=False)
    prop = asserted.propose(RowView([1], 1, 100), 64)
    text = hf.decode(prop.tokens)
    assert text == '<tool_call>\n{"name": "read", "arguments": {"path":', text
    verified = JumpForwardProposer(strict.book.constraint({"type": "tool_call", "tools": tools}), verify=True)
    prop = verified.propose(RowView([1], 1, 100), 64)
    assert hf.decode(prop.tokens) == '<tool_call>\n{"name": "read", "arguments": {"path": "' and prop.verify
    # proposals are capped and stop at what the matcher accepts
    assert len(asserted.propose(RowView([1], 1, 100), 3).tokens) == 3


def test_bad_grammar_is_a_request_error(engine, loaded_model, pi_tools):
    _, tokenizer, _ = loaded_model
    prompt = chat(tokenizer, [{"role": "user", "content": "hi"}])
    for grammar in (
        {"type": "regex"},
        {"type": "json_schema"},
        {"type": "json_schema", "schema": {"$ref": "#/nowhere"}},
        {"type": "tool_call", "tools": pi_tools, "name": "nope"},
    ):
        with pytest.raises(EngineError):
            engine.validate(GenerationRequest(prompt=prompt, grammar=grammar))


# --- template scaffold ----------------------------------------------------------------


def test_scaffold_strict_fill_equals_ordinary_decoding(engine, loaded_model, pi_tools):
    """The model writes tool calls in its template format (few-shot): scaffold on vs off."""
    _, tokenizer, _ = loaded_model
    fired = 0
    for task in ["Show me a.py", "Show me b.py"]:
        prompt = chat(tokenizer, few_shot(pi_tools, task), pi_tools)
        off, _, text, _ = run(engine, prompt=prompt, max_tokens=32, tools=pi_tools, methods=["none"])
        on, kinds, _, _ = run(engine, prompt=prompt, max_tokens=32, tools=pi_tools)
        assert on == off
        assert text.startswith("<tool_call>\n")
        fired += kinds.count("strict")
    assert fired >= 20


def test_scaffold_alone_under_a_grammar_is_exact(engine, loaded_model, bash_tools, pi_tools):
    """Scaffold spans (from real renderings) without the grammar's jump-forward."""
    _, tokenizer, _ = loaded_model
    scaffold = engine.strict.scaffold(pi_tools)
    prompt = chat(tokenizer, [{"role": "user", "content": "Create a file hello.txt containing hello world"}], pi_tools)
    grammar = {"type": "tool_call", "tools": pi_tools}
    off = run(engine, prompt=prompt, max_tokens=64, grammar=grammar, methods=["none"])[0]
    on, kinds, _, _ = run(engine, prompt=prompt, max_tokens=64, grammar=grammar, methods=["none"],
                          proposers=[scaffold.proposer(verify=True)])
    assert on == off and kinds.count("strict") >= 8


def _fire(proposer, tokenizer, text: str) -> list[str]:
    """Feed the canonical tokens of `text` one at a time; the spans proposed (accepting
    those that match the text)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    prompt = [1, 2, 3]
    out: list[int] = []
    fired = []
    i = 0
    while i < len(ids):
        out.append(ids[i])
        i += 1
        prop = proposer.propose(RowView(prompt + out, len(prompt), 1000), 64)
        if prop is not None:
            fired.append(tokenizer.decode(prop.tokens))
            if ids[i : i + len(prop.tokens)] == prop.tokens:
                out += prop.tokens
                i += len(prop.tokens)
    return fired


def test_scaffold_fires_only_in_a_tool_call(engine, loaded_model, pi_tools):
    _, tokenizer, _ = loaded_model
    scaffold = engine.strict.scaffold(pi_tools)
    call = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call><|im_end|>'
    fired = _fire(scaffold.proposer(), tokenizer, "Let me look.\n" + call)
    assert fired == ['\n{"name": "', '", "arguments": {"command":', "\n</tool_call>"]
    # a unique prefix completes the name; "edit" has two required keys: no key asserted
    fired = _fire(scaffold.proposer(), tokenizer, '<tool_call>\n{"name": "edit", "arguments": {"path": "a"}}\n</tool_call>')
    assert '", "arguments":' in fired
    # prose, fenced code, inline mention: never
    for text in [
        "Wrap the call in <tool_call> tags, like <tool_call>\n{\"name\": \"read\"} and so on.",
        "Example:\n```\n<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"x\"}}\n</tool_call>\n```\nDone.",
        "~~~\n<tool_call>\n{\"name\": \"bash\"}\n~~~",
    ]:
        assert _fire(scaffold.proposer(), tokenizer, text) == [], text
    # an opener inside a JSON string of an open call is text, not a new call
    inner = '<tool_call>\n{"name": "bash", "arguments": {"command": "echo \\"\\n<tool_call>\\n{\\"name\\": \\"read\\""}}\n</tool_call>'
    fired = _fire(scaffold.proposer(), tokenizer, inner)
    assert fired == ['\n{"name": "', '", "arguments": {"command":', "\n</tool_call>"]
    # a call the template does not know (unknown tool) is left alone after the name
    fired = _fire(scaffold.proposer(), tokenizer, '<tool_call>\n{"name": "pytest", "arguments": {}}\n</tool_call>')
    assert fired == ['\n{"name": "']


# --- proxy wiring ---------------------------------------------------------------------


def test_proxy_maps_tool_choice_and_response_format(engine, pi_tools):
    import asyncio

    from jumpahead.core.turn_runner import complete_turn, prepare_turn
    from jumpahead.core.turn import Message, ResponseFormat, Tool, ToolChoice, Turn

    tools = [Tool(t["function"]["name"], t["function"]["description"], t["function"]["parameters"]) for t in pi_tools]
    turn = Turn(messages=[Message("user", "Run ls")], tools=tools, tool_choice=ToolChoice("function", "bash"),
                max_tokens=40)
    prepared = prepare_turn(engine, turn)
    assert prepared.request.grammar == {"type": "tool_calls", "family": "hermes", "tools": [t.as_openai() for t in tools],
                                        "parallel": False, "name": "bash"}
    assert prepared.request.tools
    out = asyncio.run(complete_turn(engine, prepared))
    assert out.finish_reason == "tool_calls" and out.tool_calls[0].name == "bash", out
    assert not out.tool_calls[0].issues

    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    turn = Turn(messages=[Message("user", "hi")], response_format=ResponseFormat.from_wire(fmt))
    assert prepare_turn(engine, turn).request.grammar == {"type": "json_schema", "schema": {"type": "object"}, "strict": True}
    turn = Turn(messages=[Message("user", "hi")], response_format=ResponseFormat.from_wire({"type": "json_object"}))
    assert prepare_turn(engine, turn).request.grammar == {"type": "json_object"}
    turn = Turn(messages=[Message("user", "hi")], tools=tools)  # tool_choice auto: scaffold only
    prepared = prepare_turn(engine, turn)
    assert prepared.request.grammar is None and len(prepared.request.tools) == 4
