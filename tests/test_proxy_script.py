"""Script mode: file formats, rendering a turn in the model's format, the scripted proposer,
and a scripted turn run through the real engine (provenance `scripted`)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
from jumpahead.engine.proposal import RowView
from jumpahead.core.errors import APIError
from jumpahead.core.runner import complete_turn, prepare_turn
from jumpahead.core.script import (
    Script,
    ScriptedCall,
    ScriptedProposer,
    ScriptError,
    ScriptTurn,
    fit_prompt,
    parse_script,
    render_turn,
    turn_tokens,
)
from jumpahead.core.turn import Message, Tool, Turn, TurnOutput

from .serving import script_engine

WRITE = Tool("write", "Write a file", {"type": "object", "properties": {"path": {"type": "string"},
                                                                        "content": {"type": "string"}}})
TURN = ScriptTurn(text="I will write it.", reasoning="The user wants a file.",
                  tool_calls=[ScriptedCall("write", {"path": "/tmp/x/hello.txt", "content": "hello world\n"})])


# --- file formats --------------------------------------------------------------------


def test_parse_jsonl_list_and_object_forms():
    lines = ['{"text": "a"}', "", '{"reasoning": "r", "tool_calls": [{"name": "f", "arguments": "{\\"x\\": 1}"}]}']
    jsonl = parse_script("\n".join(lines))
    assert [t.text for t in jsonl] == ["a", ""]
    assert jsonl[1].reasoning == "r" and jsonl[1].tool_calls == [ScriptedCall("f", {"x": 1})]
    as_list = parse_script(json.dumps([{"text": "a"}, {"text": "b", "comment": "ignored"}]))
    as_obj = parse_script(json.dumps({"turns": [{"text": "a"}, {"text": "b"}]}))
    assert [t.text for t in as_list] == [t.text for t in as_obj] == ["a", "b"]
    assert parse_script('{"text": "only"}')[0].text == "only"


@pytest.mark.parametrize("text, message", [
    ('{"txt": "typo"}', "unknown keys"),
    ('{"text": 5}', "text must be a string"),
    ('{"tool_calls": [{"arguments": {}}]}', "non-empty string name"),
    ('{"tool_calls": [{"name": "f", "arguments": "{bad"}]}', "not valid JSON"),
    ('{"text": "a"}\n{oops', "line 2: not JSON"),
    ('[1]', "must be a JSON object"),
])
def test_parse_errors_name_the_turn(text, message):
    with pytest.raises(ScriptError, match=message):
        parse_script(text, "s.jsonl")


def test_load_and_claim_in_order(tmp_path: Path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"text": "one"}\n{"text": "two"}\n')
    script = Script.load(path)
    with script.claim() as (i, turn):
        assert (i, turn.text) == (0, "one")
    with pytest.raises(RuntimeError), script.claim():  # a failed request does not consume its turn
        raise RuntimeError("request failed")
    with script.claim() as (i, turn):
        assert (i, turn.text) == (1, "two")
    with pytest.raises(APIError) as exc, script.claim():
        pass
    assert exc.value.status == 400 and exc.value.code == "script_exhausted"
    assert script.status() == {"file": str(path), "turns": 2, "served": 2}
    with pytest.raises(ScriptError, match="no turns"):
        empty = tmp_path / "empty.jsonl"
        empty.write_text("\n")
        Script.load(empty)
    with pytest.raises(ScriptError, match="cannot read"):
        Script.load(tmp_path / "missing.jsonl")


# --- rendering -----------------------------------------------------------------------


def test_render_turn_in_the_model_format_parses_back(loaded_model):
    from jumpahead.core.output_parser import OutputParser

    tokenizer = loaded_model[1]
    text = render_turn(tokenizer, TURN, tools=[WRITE])
    assert text.startswith("<think>\nThe user wants a file.\n</think>\n\nI will write it.\n<tool_call>\n")
    assert text.endswith("\n</tool_call>")
    parser = OutputParser.for_tokenizer(tokenizer, [WRITE])
    out = TurnOutput()
    for event in parser.feed(text) + parser.finish():
        out.add(event)
    assert out.reasoning.strip() == TURN.reasoning and out.content == TURN.text
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [("write", TURN.tool_calls[0].arguments)]
    # a prompt that already opened the reasoning block: only the close marker is written
    opened = render_turn(tokenizer, ScriptTurn(text="hi"), in_reasoning=True)
    assert opened == "\n</think>\n\nhi"
    ids = turn_tokens(tokenizer, "hi")
    assert ids[-1] == tokenizer.eos_token_id and tokenizer.decode(ids[:-1]) == "hi"
    assert turn_tokens(tokenizer, "") == [tokenizer.eos_token_id]


def test_fit_prompt_keeps_head_and_tail():
    prompt = list(range(100))
    assert fit_prompt(prompt, 200) is prompt
    cut = fit_prompt(prompt, 10)
    assert cut == [0, 1, 2, 3, 4, 95, 96, 97, 98, 99]


def test_scripted_proposer_follows_the_row_and_counts_strays():
    script = [10, 11, 12, 13, 2]
    p = ScriptedProposer(script)
    prompt = [7, 7, 7]
    view = RowView(prompt + [10], 3, 100)  # the first token was forced by the logit bias
    assert p.propose(view, 2).tokens == [11, 12]
    # the engine capped the slice at 2 and sampled a stray token after it
    view = RowView(prompt + [10, 11, 12, 99], 3, 100)
    prop = p.propose(view, 64)
    assert prop.tokens == [13, 2] and prop.kind == "scripted" and prop.asserted and p.strays == 1
    view = RowView(prompt + [10, 11, 12, 99, 13, 2], 3, 100)
    assert p.propose(view, 64) is None


# --- through the real engine ---------------------------------------------------------


@pytest.fixture(scope="module")
def engine(loaded_model):
    eng = script_engine(loaded_model, max_batch=2)
    yield eng
    eng.close()


def test_scripted_turn_runs_through_the_model(engine):
    script = Script([TURN, ScriptTurn(text="Done.")], prompt_limit=48)
    turn = Turn(messages=[Message("system", "You are helpful. " * 40), Message("user", "create hello.txt")],
                tools=[WRITE])
    prepared = prepare_turn(engine, turn, hooks=[script])
    assert len(prepared.request.prompt) == 48 and prepared.script_turn == 0
    kinds: list[str] = []

    async def run() -> TurnOutput:
        stream = engine.stream(prepared.request)
        async for chunk in stream:
            kinds.extend(chunk.kinds)
            for event in prepared.parser.feed(chunk.text):
                out.add(event)
        for event in prepared.parser.finish():
            out.add(event)
        return out

    out = TurnOutput()
    asyncio.run(run())
    assert set(kinds) == {"scripted"}  # the first token too: the engine takes it from the script
    assert out.content == "I will write it." and out.reasoning.strip() == "The user wants a file."
    (call,) = out.tool_calls
    assert call.name == "write" and json.loads(call.arguments) == TURN.tool_calls[0].arguments
    assert prepared.scripted.strays == 0

    second = asyncio.run(complete_turn(engine, prepare_turn(engine, turn, hooks=[script])))
    assert (second.content, second.finish_reason, second.tool_calls) == ("Done.", "stop", [])
    assert second.usage.completion_tokens == len(turn_tokens(engine.tokenizer, "Done."))
    with pytest.raises(APIError, match="script exhausted"):
        prepare_turn(engine, turn, hooks=[script])


def test_long_prompt_is_cut_to_fit_and_invalid_requests_keep_their_turn(engine):
    script = Script([ScriptTurn(text="x")])
    bad = Turn(messages=[Message("user", "hi")], max_tokens=0)
    with pytest.raises(APIError) as exc:
        prepare_turn(engine, bad, hooks=[script])
    assert exc.value.status == 400 and script.served == 0
    huge = Turn(messages=[Message("user", "word " * (engine.context_length + 10))])
    prepared = prepare_turn(engine, huge, hooks=[script])  # script mode: the prompt is cut to fit the context
    assert len(prepared.request.prompt) <= engine.context_length - 2 and script.served == 1
