"""Every tool-call family's module (engine/strict/tool_formats/<family>.py): writer, partial-call
reader and completer, tracker scanner, and logical jump-ahead in the family's own format.

Each family is served with its chat template on the default model's weights and
tokenizer (tests/test_tool_families.py builds the folders: mlx-lm infers the family's own
parser from the template, as for the real model). Oracles:

- writer == template: what the family's writer writes for one and two calls is what its
  chat template renders (harmony: the spec layout, see test_tool_families.py), and the
  server's output parser (`OutputParser.for_tokenizer`) reads it back to the same calls;
- completion: from every prefix of a written call that the family's reader reads, its
  completer finishes the call so the output parser reads the same call back;
- the boundary tracker crosses `tool_name` and each `argument_key` of a written call;
- jumps: the online jump (content stated in the output) and the oracle jump (a recorded
  continuation) append the rest of the call in the family's own format: the output
  parser reads exactly the stated content; end to end through the real engine, the
  model's output is the family's writing of the call and the client's call is exact.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
from jumpahead.engine.strict.tool_formats import FAMILIES as TABLE
from jumpahead.engine.strict.tool_formats import detect_family
from tests.test_tool_families import (
    CALLS_1,
    CALLS_2,
    FAMILIES,
    TOOLS,
    default_folder,  # noqa: F401  (fixture)
    family_folder,
    rendered_calls,
    tokenizers,  # noqa: F401  (fixture)
)

ALL = FAMILIES  # every family a template is shipped for (deepseek_r1: below, without a template)
WRITE_TOOL = {"type": "function", "function": {
    "name": "write", "description": "Write a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                   "required": ["path", "content"]}}}
# quotes, backslashes, tabs, newlines, non-ASCII, an emoji, a special-token marker
# (harmony's end of a call: escaped inside its JSON strings)
CONTENT = 'x = "a\\"b"\n\tpath = "C:\\\\tmp"\nprint("héllo wörld 你好 🙂")\ns = "<|call|>"\nend()\n'
STATED = f"I will create hello.py with this content:\n```python\n{CONTENT}```\nNow the call."


def _tools() -> list[Any]:
    from jumpahead.core.turn import Tool

    return [Tool(t["function"]["name"], t["function"]["description"], t["function"]["parameters"])
            for t in [*TOOLS, WRITE_TOOL]]


def server_parse(tok: Any, text: str) -> list[tuple[str, dict]]:
    """The calls the server's output parser reads from `text` (fed in small pieces)."""
    from jumpahead.core.output_parser import OutputParser

    parser = OutputParser.for_tokenizer(tok, _tools())
    for i in range(0, len(text), 5):
        parser.feed(text[i:i + 5])
    parser.finish()
    assert not parser.malformed, parser.malformed
    assert all(not c.issues for c in parser.tool_calls), [c.issues for c in parser.tool_calls]
    return [(c.name, json.loads(c.arguments)) for c in parser.tool_calls]


def unescaped(text: str) -> str:
    """`text` with JSON's \\u escapes of ASCII characters read (how a guarded marker is written)."""
    return re.sub(r"\\u00([0-7][0-9a-f])", lambda m: chr(int(m.group(1), 16)), text)


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def content_call(family: str) -> tuple[str, dict]:
    return ("write", {"path": "hello.py", "content": CONTENT})


def as_parsed(family: str, call: tuple[str, dict]) -> tuple[str, dict]:
    """The call as the family's parser reads it back: GLM's (mlx-lm's `glm47`) trims a raw
    value's outer whitespace."""
    if family != "glm":
        return call
    return (call[0], {k: v.strip() if isinstance(v, str) else v for k, v in call[1].items()})


# --- the table ------------------------------------------------------------------------------


def test_one_table_built_from_the_modules():
    assert set(TABLE) == {*ALL, "deepseek_r1"}
    for name, family in TABLE.items():
        assert family.format is not None and family.name == name
        assert callable(family.parse)
    # families mlx-lm has a parser for name it; the others carry their own
    assert {n for n, f in TABLE.items() if f.own_parser is None} == {"hermes", "qwen3_coder", "glm", "kimi", "mistral"}


# --- writer ----------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ALL)
def test_writer_is_the_template_and_parses_back(tokenizers, family):
    tok = tokenizers[family]
    assert detect_family(tok).name == family
    fam = TABLE[family]
    for calls in (CALLS_1, CALLS_2):
        text = fam.write(calls)
        assert server_parse(tok, text) == calls, (family, text)
        if family != "harmony":  # the HF gpt-oss template puts the recipient in the header
            rendered = rendered_calls(family, tok, calls)
            assert text == rendered or squash(text) == squash(rendered), (family, text, rendered)
    hard = [content_call(family), ("add", {"a": -2, "b": 30})]
    assert server_parse(tok, fam.write(hard)) == [as_parsed(family, c) for c in hard]


def test_deepseek_r1_writer_parses_back():
    fam = TABLE["deepseek_r1"]
    for calls in (CALLS_1, CALLS_2, [content_call("deepseek_r1")]):
        text = fam.write(calls)
        assert text.startswith(fam.start) and text.endswith(fam.end)
        assert fam.parse(text[len(fam.start):-len(fam.end)], TOOLS) == [{"name": n, "arguments": a} for n, a in calls]


# --- partial-call reader and completer ------------------------------------------------------------


def _remaining(call: Any, args: dict) -> list[tuple[str, Any]]:
    rest = [k for k in args if k not in call.args]
    first = call.key if call.key in rest else None
    if call.stage == "key":
        first = next(k for k in rest if k.startswith(call.partial))  # the one the text goes on with
    if first is not None:
        rest.remove(first)
        rest.insert(0, first)
    return [(k, args[k]) for k in rest]


@pytest.mark.parametrize("family", [*ALL, "deepseek_r1"])
def test_completion_from_every_prefix(tokenizers, family):
    fam = TABLE[family]
    calls = [("add", {"a": 2, "b": 3}), content_call(family)]
    if family in ("hermes", "qwen3_coder", "glm"):  # one call between each pair of markers
        calls = calls[1:]
    text = fam.write(calls)
    body = text[len(fam.start):]
    # where the calls share a section, the prefixes run through the second call
    first = len(body) - len(fam.write(calls[-1:])) + len(fam.start) if len(calls) > 1 else 0
    read = 0
    for k in range(first, len(body)):
        prefix = body[:k]
        call = fam.read(prefix)
        if call is None:
            continue
        read += 1
        assert call.name == "write", (family, prefix)
        done = fam.complete(call, _remaining(call, calls[-1][1]), fam.layout(prefix))
        assert done is not None, (family, prefix, call)
        whole = fam.start + prefix + done
        if family == "deepseek_r1":
            got = [(c["name"], c["arguments"]) for c in fam.parse(whole[len(fam.start):], TOOLS)]
        else:
            got = server_parse(tokenizers[family], whole)
        assert got == [as_parsed(family, c) for c in calls], (family, prefix, done)
        # the template's own text (a marker inside a string may be escaped once more)
        assert unescaped(whole) == unescaped(text), (family, prefix, done)
    assert read > len(CONTENT), (family, read)  # every position inside the content reads


@pytest.mark.parametrize("family", ALL)
def test_tracker_crosses_the_name_and_each_key(tokenizers, family):
    from jumpahead.policies.tracker import OutputTracker
    from jumpahead.core.output_parser import OutputParser

    tok = tokenizers[family]
    text = "Sure." + ("\n" if family != "llama3_json" else " ") + TABLE[family].write(CALLS_2)
    tracker = OutputTracker(tok, OutputParser.for_tokenizer(tok, _tools()))
    crossed = [c for t in tok.encode(text, add_special_tokens=False) for c in tracker.add(t)]
    got = [(c.boundary, c.tool_name if c.boundary == "tool_name" else c.argument_key) for c in crossed]
    assert got == [("tool_call_opened", None), ("tool_name", "get_weather"), ("argument_key", "city"),
                   ("tool_call_opened", None), ("tool_name", "add"), ("argument_key", "a"), ("argument_key", "b")], got


# --- jumps, at the policy level ------------------------------------------------------------------


def _cut(family: str, full: str) -> int:
    """Where a prefix of the written call ends: just past the content key."""
    key = {"qwen3_coder": "<parameter=content>", "glm": "<arg_key>content</arg_key>"}.get(family, '"content":')
    return full.index(key) + len(key)


def _context(tok: Any) -> str:
    from jumpahead.core.prompt import render_prompt
    from jumpahead.core.turn import Message, Turn

    return tok.decode(render_prompt(tok, Turn(messages=[Message("user", "Create hello.py")], tools=_tools())))


def _event(tok: Any, family: str, output: str, boundary: str = "argument_key") -> Any:
    from jumpahead.policies.api import BoundaryEvent

    fam = TABLE[family]
    start = output.index(fam.start)
    return BoundaryEvent(boundary, output, [], "", output[:start].strip(), _context(tok), tool_name="write",
                         call_text=output[start + len(fam.start):])


def _policy(cls: Any, tok: Any, oracle: str | None = None) -> Any:
    from jumpahead.core.options import RequestOptions
    from jumpahead.policies.api import RequestContext, SessionState
    from jumpahead.core.turn import Message, Turn

    p = cls()
    turn = Turn(messages=[Message("user", "x")], tools=_tools(), options=RequestOptions(oracle_output=oracle))
    p.on_request(RequestContext(turn=turn, session=SessionState("s"), tokenizer=tok, context_length=8192))
    return p


@pytest.mark.parametrize("family", ALL)
def test_online_and_oracle_jumps_write_the_family_format(tokenizers, family):
    from jumpahead.policies.jump import Jump, OracleJump

    tok, fam = tokenizers[family], TABLE[family]
    call = content_call(family)
    full = fam.write([call])
    lead = STATED + "\n"
    for step in (0, 1):  # just past the content key, and a character further
        output = lead + full[:_cut(family, full) + step]
        event = _event(tok, family, output)
        iv = _policy(Jump, tok).on_boundary(event)
        assert iv is not None and iv.kind == "jump", (family, output)
        assert lead + full == output + iv.text, (family, iv.text)  # the template's own text
        assert server_parse(tok, output + iv.text) == [as_parsed(family, call)]
        assert iv.source_in == "output" and output[iv.source[0]:iv.source[1]] == CONTENT
        # the oracle: the recording continues with the same call
        oracle = _policy(OracleJump, tok, lead + full)
        ov = oracle.on_boundary(event)
        assert ov is not None and output + ov.text == lead + full, (family, ov and ov.text)
        assert "stopped" not in ov.label
    # the oracle stops at content it could not have copied: only the structure comes
    novel = ("write", {"path": "hello.py", "content": "def brand_new_function(argument_one):\n    return 4242"})
    recorded = "I will create hello.py now.\n" + fam.write([novel])
    output = recorded[: recorded.index(fam.start) + _cut(family, fam.write([novel]))]
    ov = _policy(OracleJump, tok, recorded).on_boundary(_event(tok, family, output))
    assert ov is not None and ov.text and "def" not in ov.text and recorded.startswith(output + ov.text), ov


# --- jumps end to end through the engine ------------------------------------------------------------


class _Force:
    """A proxy hook adding a proposer that forces the first output tokens (asserted, as
    script mode does), then proposes nothing."""

    name = "scripted"

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def propose(self, view: Any, max_len: int) -> Any:
        from jumpahead.engine.methods.proposal import Proposal

        n = len(view.tokens) - view.prompt_len
        return None if n >= len(self.tokens) else Proposal(list(self.tokens[n:]), "scripted")

    def feedback(self, proposal: Any, accepted: int) -> None:
        pass

    def before_render(self, exchange: Any, turn: Any) -> Any:
        return turn

    def row_proposers(self, exchange: Any, prepared: Any) -> list[Any]:
        return [_Force(self.tokens)]

    def after_turn(self, exchange: Any, prepared: Any, out: Any) -> None:
        return None


# ~40 s a family on 2 cores (a model load and two turns): one JSON and one XML family in
# the default run, all with -m slow
@pytest.mark.parametrize("family", [f if f in ("kimi", "qwen3_coder") else pytest.param(f, marks=pytest.mark.slow)
                                    for f in ALL])
def test_jump_end_to_end_in_the_family_format(default_folder, tmp_path, family):  # noqa: F811
    """The model writes the start of the call (forced), one token of its own (biased to
    the template's), then the jump appends the rest: the output is the family's writing of
    the call, the jump tokens are asserted, and the client's call is exactly the stated one."""
    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import load_model
    from jumpahead.engine.types import SamplingParams
    from jumpahead.policies.runtime import PolicyHooks
    from jumpahead.core.exchange import Exchange
    from jumpahead.core.turn_runner import complete_turn, prepare_turn
    from jumpahead.core.options import RequestOptions
    from jumpahead.core.turn import Message, Turn

    model, tok, info = load_model(str(family_folder(default_folder, tmp_path, family)), progress=lambda s: None)
    fam = TABLE[family]
    call = content_call(family)
    full = STATED + "\n" + fam.write([call])
    cut = full.index(fam.start) + _cut(family, fam.write([call]))
    forced = tok.encode(full[:cut], add_special_tokens=False)
    assert tok.decode(forced) == full[:cut]
    # The model's own token after the forced start is the template's (biased to it); the
    # budget leaves the one token the row samples after the jump.
    own_id = tok.encode(full[cut:], add_special_tokens=False)[0]
    own = tok.decode([own_id])
    assert full.startswith(own, cut)
    jump = tok.encode(full[cut + len(own):], add_special_tokens=False)  # what the jump appends
    engine = Engine(model, tok, info, EngineConfig(max_batch=2, max_asserted=1024, prefix_cache=False))
    try:
        for policy, options in (("jump", RequestOptions()), ("oracle-jump", RequestOptions(oracle_output=full))):
            bias = {int(own_id): 100.0}
            turn = Turn(messages=[Message("user", "Create hello.py")], tools=_tools(), options=options,
                        max_tokens=len(forced) + 1 + len(jump) + 1, sampling=SamplingParams(logit_bias=bias))
            exchange = Exchange("chat", session_id=f"{family}-{policy}")
            prepared = prepare_turn(engine, turn, exchange=exchange,
                                    hooks=[PolicyHooks([policy], tok, engine.context_length), _Force(forced)])
            out = asyncio.run(complete_turn(engine, prepared))
            kinds, tokens = prepared.output_kinds, prepared.output_tokens
            assert kinds[:len(forced)] == ["scripted"] * len(forced), (family, policy)
            assert kinds[len(forced)] == "sampled"
            jumped = [i for i, k in enumerate(kinds) if k == "jump"]
            assert jumped == list(range(len(forced) + 1, len(tokens) - 1)), (family, policy, kinds[len(forced):])
            assert [tokens[i] for i in jumped] == jump, (family, policy)  # all asserted, as constructed
            assert kinds[-1] == "sampled"  # the model goes on after the call
            assert tok.decode(list(tokens[:-1])) == full, (family, policy)  # the template's text
            if fam.end:  # the client's call (the biased token after it is text outside the call)
                assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [as_parsed(family, call)]
            else:  # the calls run to the end of the output: the biased token would join the call
                assert server_parse(tok, tok.decode(list(tokens[:-1]))) == [as_parsed(family, call)]
            [record] = exchange.notes["interventions"]
            assert record["policy"] == policy and record["emitted"] == record["tokens"] == len(jumped)
    finally:
        engine.close()
