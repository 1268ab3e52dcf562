"""Earlier action selection (`early-jump`, policies/early_jump.py): the whole next tool
call proposed at the reasoning boundary, before the model opens it.

- the boundary: `block_closed` (policies/tracker.py, jump_sources.FenceScanner) is
  crossed exactly where a fenced block of the visible text closes, never inside
  reasoning or a tool call;
- at the policy level, with the real default tokenizer and the server's real output
  parser: a write from the block whose lead names its file, an edit from a settled
  old/new pair, a shell command from a fenced command; anything ambiguous gives none;
- every tool-call family whose template writes text before a call: the appended call
  is the template's own text (whitespace between text and call included) and the
  server's parser reads it back;
- end to end on the real model and engine (policy runtime, HTTP server + OpenAI SDK,
  forced replay): asserted, the call's tokens are the policy's `jump` intervention with
  D, P and H; verified (`verify=1`), greedy output is ordinary decoding token for token.

Fixtures and helpers come from tests/test_jump.py (the online jump's tests) and
tests/test_tool_format_families.py (the families).
"""

from __future__ import annotations

import asyncio
import json

import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
from jumpahead.engine.strict.tool_formats import FAMILIES as TABLE
from jumpahead.policies.api import BOUNDARIES, BoundaryEvent, RequestContext, SessionState
from jumpahead.policies.early_jump import EarlyJump
from jumpahead.policies.jump_sources import FenceScanner, fenced_blocks
from jumpahead.policies.registry import PolicyError, parse_spec
from jumpahead.core.output_parser import OutputParser
from jumpahead.core.turn import Message, Tool, ToolCall, ToolChoice, Turn
from tests.test_jump import (  # noqa: F401  (tok, jump_engine: fixtures)
    BASH,
    EDIT,
    EDITOR,
    HARD,
    WRITE,
    PrefixHook,
    args_of,
    context_of,
    jump_engine,
    no_eos,
    read_result_messages,
    tok,
)
from tests.test_tool_format_families import (  # noqa: F401  (default_folder, tokenizers: fixtures)
    ALL,
    _tools as family_tools,
    as_parsed,
    default_folder,
    server_parse,
    tokenizers,
    unescaped,
)
from tests.test_tool_families import END_OF_TURN, family_folder

# The live world's tools (live/sandbox.py): one tool of each role.
LIVE = [Tool("read_file", "Read a text file.", {"type": "object", "properties": {"path": {"type": "string"}},
                                                "required": ["path"]}),
        WRITE, EDIT, BASH]
STATED = f"I will create src/hello.py with this content:\n```python\n{HARD}```"


def early(tok, tools=LIVE, choice: ToolChoice | None = None, parallel: bool | None = None, **options) -> EarlyJump:
    p = EarlyJump(**options)
    turn = Turn(messages=[Message("user", "x")], tools=tools, tool_choice=choice or ToolChoice(), parallel_tool_calls=parallel)
    p.on_request(RequestContext(turn=turn, session=SessionState("s"), tokenizer=tok, context_length=8192))
    return p


def event(tok, output: str, boundary: str = "block_closed", messages: list[Message] | None = None,
          tools=LIVE, budget: int = 4096) -> BoundaryEvent:
    context = context_of(tok, messages or [Message("user", "Please do the task.")], tools)
    return BoundaryEvent(boundary, output, [], "", output, context, budget=budget)


def calls_of(tok, output: str, text: str, tools=LIVE) -> list[ToolCall]:
    """The calls the server's output parser reads from the output plus the proposal."""
    parser = OutputParser.for_tokenizer(tok, tools)
    for i in range(0, len(output + text), 7):
        parser.feed((output + text)[i:i + 7])
    parser.finish()
    assert not parser.malformed, parser.malformed
    return parser.tool_calls


def hermes(name: str, args: dict) -> str:
    return TABLE["hermes"].write([(name, args)])


# --- the boundary -------------------------------------------------------------------------------

FENCED = [
    "I write a.py with:\n```python\nprint(1)\n```\nThen I run it.\n",
    "Two blocks:\n```\none\n```\ntext between\n~~~sh\ntwo\n~~~\n",
    "A longer fence holds a short one:\n````md\n```python\nx = 1\n```\n````\nafter\n",
    "Indented:\n   ```\ncode\n   ```   \nand an empty one:\n```\n```\n",
    "Never closed:\n```\nstill open\n",
    "Mixed markers:\n```\na\n~~~\nb\n```\n",
]


def closing_ends(text: str) -> list[int]:
    """Where each closed block's closing fence characters end (fenced_blocks' reading)."""
    out = []
    for b in fenced_blocks(text):
        if b.closed:
            line = text[b.end:].split("\n", 1)[0]
            out.append(b.end + len(line.rstrip()))
    return out


@pytest.mark.parametrize("text", FENCED)
def test_fence_scanner_crosses_where_fenced_blocks_close(text):
    """Fed character by character, the scanner counts a close exactly at the end of each
    closing fence that fenced_blocks finds (the first moment its line reads as one)."""
    scanner = FenceScanner()
    seen = [i + 1 for i, ch in enumerate(text) for _ in range(scanner.feed(ch))]
    assert seen == closing_ends(text)
    whole = FenceScanner()  # the same count however the text is chunked
    assert whole.feed(text) == len(closing_ends(text))


def test_a_fence_with_an_info_string_inside_a_block_is_content():
    """```` ```python ```` inside an open block does not close it (fenced_blocks agrees);
    fed whole it is never counted; fed in pieces its ``` is counted once (the boundary
    fires as soon as a line reads as a closing fence) and the block stays open."""
    text = "```\na\n```python\nb\n```\n"
    assert closing_ends(text) == [len(text) - 1]
    s = FenceScanner()
    assert s.feed("```\na\n```python\nb\n") == 0 and s.opened == "```"
    assert s.feed("```") == 1 and s.feed("\n") == 0 and s.opened is None
    s = FenceScanner()
    assert [s.feed(p) for p in ("```\na\n", "```", "python\n", "b\n", "```")] == [0, 1, 0, 0, 1]


def tracked(tok, text: str, tools=LIVE) -> list[tuple[str, str]]:
    """(boundary, the output up to the crossing token) for each crossing of the tracker."""
    from jumpahead.policies.tracker import OutputTracker

    tracker = OutputTracker(tok, OutputParser.for_tokenizer(tok, tools))
    ids = tok.encode(text, add_special_tokens=False)
    out = []
    for i, t in enumerate(ids):
        for c in tracker.add(t):
            out.append((c.boundary, tok.decode(ids[:i + 1])))
    return out


def test_block_closed_is_crossed_at_the_closing_fence_only(tok):
    call = hermes("write", {"path": "a.md", "content": "```\nnot a block\n```\n"})
    text = ("<think>\nA block in reasoning:\n```\nr\n```\n</think>\n\n"
            "I write a.py with:\n```python\nprint(1)\n```\nand note\n```\nx\n" + call + "\nDone:\n```\ny\n```\nend")
    crossed = tracked(tok, text)
    kinds = [b for b, _ in crossed]
    assert "block_closed" in BOUNDARIES
    # once after the visible block's closing fence; none in the reasoning, none for the
    # block the call interrupted (the call ends the visible run: the text after it
    # starts afresh), once after the block stated after the call
    assert kinds == ["reasoning_closed", "block_closed", "tool_call_opened", "tool_name", "argument_key",
                     "argument_key", "block_closed"], crossed
    first = crossed[1][1]
    assert first.endswith("print(1)\n```") and first.count("```") == 4
    assert crossed[-1][1].endswith("Done:\n```\ny\n```")


# --- the policy ---------------------------------------------------------------------------------


def test_write_is_proposed_whole_at_the_block_close(tok):
    p = early(tok)
    ev = event(tok, STATED)
    iv = p.on_boundary(ev)
    assert iv is not None and iv.kind == "jump" and not iv.verified and iv.label.startswith("early write ")
    # the template's newline between text and call, then the family's writing of the call
    assert iv.text == "\n" + hermes("write", {"path": "src/hello.py", "content": HARD})
    [call] = calls_of(tok, STATED, iv.text)
    assert call.name == "write" and args_of(call) == {"path": "src/hello.py", "content": HARD}
    assert iv.source_in == "output" and STATED[iv.source[0]:iv.source[1]] == HARD
    assert p.decisions[-1]["jumped"] and p.decisions[-1]["boundary"] == "block_closed"
    # the newline already written: the rest of the layout only
    iv2 = early(tok).on_boundary(event(tok, STATED + "\n"))
    assert iv2.text == iv.text[1:]
    # inside a call: no boundary hook of this policy acts (the online jump's place)
    assert early(tok).on_boundary(BoundaryEvent("tool_name", STATED, [], "", STATED, ev.context_text,
                                                call_text='\n{"name": "write"')) is None


def test_write_at_reasoning_closed(tok):
    output = f"<think>\n{STATED}\nThen I check it.\n</think>"
    iv = early(tok).on_boundary(event(tok, output, boundary="reasoning_closed"))
    assert iv is not None and iv.text == "\n\n" + hermes("write", {"path": "src/hello.py", "content": HARD})
    assert [(c.name, args_of(c)) for c in calls_of(tok, output, iv.text)] == [
        ("write", {"path": "src/hello.py", "content": HARD})]


def test_verify_option():
    assert parse_spec("early-jump").build().verify is False
    assert parse_spec("early-jump:verify=1").build().verify is True
    with pytest.raises(PolicyError, match="verify"):
        parse_spec("early-jump:verify=maybe").build()


def test_verified_proposal(tok):
    iv = early(tok, verify="1").on_boundary(event(tok, STATED))
    assert iv is not None and iv.verified and iv.kind == "jump"


def test_edit_from_a_settled_old_new_pair(tok):
    old_block = 'In app.py I replace\n```\n    return "hi " + name\n```'
    whole = old_block + '\nwith\n```\n    return "Hello, " + name + "!"\n```'
    tools = [WRITE, EDIT, BASH]
    p = early(tok, tools)
    # the old half closed: a write of app.py would be wrong, so nothing yet
    assert p.on_boundary(event(tok, old_block, messages=read_result_messages(), tools=tools)) is None
    ev = event(tok, whole, messages=read_result_messages(), tools=tools)
    iv = p.on_boundary(ev)
    assert iv is not None and iv.label.startswith("early edit path=app.py old from context")
    assert [(c.name, args_of(c)) for c in calls_of(tok, whole, iv.text, tools)] == [
        ("edit", {"file_path": "app.py", "old_string": '    return "hi " + name',
                  "new_string": '    return "Hello, " + name + "!"'})]
    assert iv.source_in == "context" and "hi " in ev.context_text[iv.source[0]:iv.source[1]]
    # an old text the file does not hold: no edit
    wrong = whole.replace('"hi "', '"bye "')
    assert early(tok, tools).on_boundary(event(tok, wrong, messages=read_result_messages(), tools=tools)) is None


@pytest.mark.parametrize("text,command", [
    ("I run the tests:\n```bash\npytest -q tests/test_a.py\n```", "pytest -q tests/test_a.py"),
    ("Now I run:\n```\nls -la\n```", "ls -la"),
    ("The same command twice:\n```sh\nmake\n```\nagain:\n```sh\nmake\n```", "make"),
])
def test_shell_command_from_a_fenced_block(tok, text, command):
    iv = early(tok).on_boundary(event(tok, text))
    assert iv is not None and iv.label.startswith("early bash command from output block")
    assert [(c.name, args_of(c)) for c in calls_of(tok, text, iv.text)] == [("bash", {"command": command})]


TWO = STATED + "\nOr rather, src/hello.py should be:\n```python\nprint('other')\n```"


@pytest.mark.parametrize("output,boundary,tools,why", [
    (TWO, "block_closed", LIVE, "two different blocks for the path"),
    ("Here is some code:\n```python\nprint('hi')\n```", "block_closed", LIVE, "no path in the lead"),
    ("<think>\nI will create src/hello.py with:\n```python\nprint('hi')\n</think>", "reasoning_closed", LIVE,
     "a block never closed"),
    ("I will create src/hello.py with:\n```python\nprint('hi')", "block_closed", LIVE, "a block never closed"),
    (STATED, "block_closed", LIVE[:1] + [BASH], "no write tool offered"),
    (STATED, "block_closed", [WRITE, EDITOR], "two tools could write it"),
    (STATED + "\nThen I go on writing.", "block_closed", LIVE, "the model went on past the block"),
    ("Run this:\n```python\nprint(1)\n```", "block_closed", LIVE, "code, not a command"),
    ("I run:\n```\nmake a\n```\nor:\n```\nmake b\n```", "block_closed", LIVE, "two different commands"),
    (STATED, "tool_call_opened", LIVE, "not a reasoning boundary"),
])
def test_ambiguity_gives_no_proposal(tok, output, boundary, tools, why):
    assert early(tok, tools).on_boundary(event(tok, output, boundary=boundary, tools=tools)) is None, why


def test_the_block_is_for_the_last_file_its_lead_names(tok):
    output = "I will create src/other.py, it uses lib/util.py:\n```python\nprint('hi')\n```"
    iv = early(tok).on_boundary(event(tok, output))
    assert args_of(calls_of(tok, output, iv.text)[0]) == {"path": "lib/util.py", "content": "print('hi')\n"}


def test_the_request_limits_what_may_be_proposed(tok):
    assert early(tok, choice=ToolChoice("none")).on_boundary(event(tok, STATED)) is None
    assert early(tok, choice=ToolChoice("function", "bash")).on_boundary(event(tok, STATED)) is None
    assert early(tok, choice=ToolChoice("function", "write")).on_boundary(event(tok, STATED)) is not None
    strict = Tool("write", "w", {"type": "object", "properties": {"path": {"type": "string"}, "content": {
        "type": "string"}, "mode": {"type": "string"}}, "required": ["path", "content", "mode"]})
    assert early(tok, [strict]).on_boundary(event(tok, STATED, tools=[strict])) is None  # a required argument unknown
    assert early(tok).on_boundary(event(tok, STATED, budget=20)) is None  # the call would be cut
    # a call open already, and a second call where the request allows one
    opened = BoundaryEvent("block_closed", STATED, [], "", STATED, "", call_text='\n{"na')
    assert early(tok).on_boundary(opened) is None
    done = STATED + "\n" + hermes("write", {"path": "src/hello.py", "content": HARD}) + "\nNow b.py:\n```\nb\n```"
    second = BoundaryEvent("block_closed", done, [], "", "", "", calls_done=1, budget=4096)
    assert early(tok).on_boundary(second) is not None
    assert early(tok, parallel=False).on_boundary(second) is None


def test_registry_and_arms():
    from jumpahead.live.arms import parse_live_arms
    from jumpahead.traces.arms import parse_arms

    assert type(parse_spec("early-jump").build()) is EarlyJump
    arms = parse_arms("ordinary,early-jump,early-jump:verify=1")
    assert [(a.name, a.policy_specs, a.methods) for a in arms] == [
        ("ordinary", [], ["none"]), ("early-jump", ["early-jump"], ["none"]),
        ("early-jump:verify=1", ["early-jump:verify=1"], ["none"])]
    live = parse_live_arms("ordinary,early-jump,early-jump:verify=1")
    assert [a.serve_args() for a in live[1:]] == [["--methods", "none", "--drafter", "none", "--policy", "early-jump"],
                                                  ["--methods", "none", "--drafter", "none", "--policy", "early-jump:verify=1"]]
    assert not any(a.oracle for a in live)


# --- other tool-call families -------------------------------------------------------------------

FAMILY_STATED = ("I will create hello.py with this content:\n```python\n"
                 'x = "a\\"b"\n\tpath = "C:\\\\tmp"\nprint("héllo wörld 你好 🙂")\nend()\n```')
FAMILY_CONTENT = FAMILY_STATED.split("```python\n", 1)[1][:-3]


def template_text(tok, family: str, content: str, call: tuple[str, dict]) -> str | None:
    """The family's chat template's rendering of an assistant message with `content`
    and `call`, from the content on, without its end of turn (None: the template drops
    the content)."""
    tools = [t.as_openai() for t in family_tools()]
    message = {"role": "assistant", "content": content, "tool_calls": [
        {"id": "call_000000001", "type": "function", "function": {"name": call[0], "arguments": call[1]}}]}
    full = tok.apply_chat_template([{"role": "user", "content": "Create hello.py"}, message], tools=tools,
                                   tokenize=False)
    i = full.find(content)
    if i < 0:
        return None
    text = full[i:].rstrip()
    end = END_OF_TURN[family]
    return text[:-len(end)] if end and text.endswith(end) else text


@pytest.mark.parametrize("family", ALL)
def test_the_call_is_written_in_the_family_format(tokenizers, family):
    """Where the template writes text before a call, the proposal after the block is
    the template's own text (the whitespace between text and call included) and the
    server's parser reads the call back; harmony (text and call in different messages)
    and Llama 3 (no text before a call) get no proposal."""
    tok, fam = tokenizers[family], TABLE[family]
    tools = family_tools()
    context = context_of(tok, [Message("user", "Create hello.py")], tools)
    p = early(tok, tools)
    iv = p.on_boundary(BoundaryEvent("block_closed", FAMILY_STATED, [], "", FAMILY_STATED, context, budget=4096))
    call = ("write", {"path": "hello.py", "content": FAMILY_CONTENT})
    rendered = template_text(tok, family, FAMILY_STATED, call)
    if family in ("harmony", "llama3_json"):
        assert iv is None, (family, iv)
        return
    assert iv is not None, family
    assert iv.text.endswith(fam.write([call])) and not iv.text[:-len(fam.write([call]))].strip()
    assert rendered is not None and unescaped(FAMILY_STATED + iv.text) == unescaped(rendered), (family, iv.text)
    assert server_parse(tok, FAMILY_STATED + iv.text) == [as_parsed(family, call)]


def test_block_closed_in_an_xml_family(tokenizers):
    """Qwen3-Coder's calls carry raw values: a fenced block inside a call's content
    crosses no block_closed; the stated block before it does, at its closing fence."""
    tok = tokenizers["qwen3_coder"]
    call = TABLE["qwen3_coder"].write([("write", {"path": "a.md", "content": "```\ninner\n```\n"})])
    text = FAMILY_STATED + "\n" + call + "\nDone."
    crossed = tracked(tok, text, family_tools())
    assert [out for b, out in crossed if b == "block_closed"] == [FAMILY_STATED]
    assert "tool_call_opened" in [b for b, _ in crossed]


# --- end to end on the real model ---------------------------------------------------------------

E2E_CONTENT = 'x = "a\\"b"\nprint("héllo \\\\ wörld")\n'
E2E_PREFIX = f"I write hello.py with:\n```python\n{E2E_CONTENT}```"
E2E_CALL = "\n" + hermes("write", {"path": "hello.py", "content": E2E_CONTENT})


def newline_bias(tok) -> dict[int, float]:
    """The row samples once after the forced (asserted) text, before the policy is asked:
    biased, that token is the template's newline, and the early jump supplies the rest."""
    [nl] = tok.encode("\n", add_special_tokens=False)
    return {int(nl): 100.0}


def run_turn(eng, policies: list[str], after: int, *, eos: bool = False, session: str = "early"):
    """The forced statement, the model's own newline, then `after` more output tokens
    (EOS allowed where `eos`)."""
    from jumpahead.core.exchange import Exchange
    from jumpahead.core.turn_runner import complete_turn, prepare_turn
    from jumpahead.engine.types import SamplingParams
    from jumpahead.policies.runtime import PolicyHooks

    tok = eng.tokenizer
    n_prefix = len(tok.encode(E2E_PREFIX, add_special_tokens=False))
    bias = newline_bias(tok) if eos else {**no_eos(tok), **newline_bias(tok)}
    turn = Turn(messages=[Message("user", "Create hello.py")], tools=LIVE, max_tokens=n_prefix + 1 + after,
                sampling=SamplingParams(logit_bias=bias))
    exchange = Exchange("chat", session_id=session)
    prepared = prepare_turn(eng, turn, exchange=exchange,
                            hooks=[PolicyHooks(policies, tok, eng.context_length), PrefixHook(tok, E2E_PREFIX)])
    out = asyncio.run(complete_turn(eng, prepared))
    return prepared, out, exchange, n_prefix


def test_early_jump_end_to_end_through_the_engine(jump_engine):
    """The forced text states the block; the model writes the newline after its closing
    fence; then the whole call comes as asserted `jump` tokens and the row samples after it."""
    tok = jump_engine.tokenizer
    expected = tok.encode(E2E_CALL[1:], add_special_tokens=False)
    prepared, out, exchange, n_prefix = run_turn(jump_engine, ["early-jump"], len(expected) + 6)
    kinds, tokens = prepared.output_kinds, prepared.output_tokens
    assert kinds[:n_prefix] == ["scripted"] * n_prefix
    assert kinds[n_prefix] == "sampled" and tok.decode([tokens[n_prefix]]) == "\n"
    start = n_prefix + 1
    assert kinds[start:start + len(expected)] == ["jump"] * len(expected)
    assert list(tokens[start:start + len(expected)]) == expected  # exactly the constructed tokens, all asserted
    assert kinds[start + len(expected):] == ["sampled"] * 6  # generation goes on
    assert tok.decode(list(tokens[:start + len(expected)])) == E2E_PREFIX + E2E_CALL
    assert out.content == E2E_PREFIX or out.content.startswith(E2E_PREFIX)
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("write", {"path": "hello.py", "content": E2E_CONTENT})]
    [record] = exchange.notes["interventions"]
    assert (record["policy"], record["boundary"], record["kind"], record["verified"]) == (
        "early-jump", "block_closed", "jump", False)
    assert record["tokens"] == record["emitted"] == len(expected) and record["at"] == start
    assert record["label"].startswith("early write path=hello.py") and record["decide_ms"] < 50
    assert exchange.notes["policies"]["supplied_tokens"] == len(expected)


def test_with_the_online_jump_the_call_is_supplied_once(jump_engine):
    """`jump+early-jump`: the early proposal supplies the call; its own tokens cross no
    boundary, so the online jump never supplies it again (D, P, H counted once)."""
    tok = jump_engine.tokenizer
    expected = tok.encode(E2E_CALL[1:], add_special_tokens=False)
    prepared, out, exchange, n_prefix = run_turn(jump_engine, ["jump", "early-jump"], len(expected) + 2)
    assert [(r["policy"], r["tokens"]) for r in exchange.notes["interventions"]] == [("early-jump", len(expected))]
    assert prepared.output_kinds.count("jump") == len(expected) == exchange.notes["policies"]["supplied_tokens"]


def test_verified_early_jump_is_ordinary_greedy_decoding(jump_engine):
    """verify=1: the model checks the proposed call token by token; greedy output is
    exactly the output without the policy, and the proposal's accepted tokens are its
    common prefix with that output."""
    tok = jump_engine.tokenizer
    proposed = tok.encode(E2E_CALL[1:], add_special_tokens=False)
    after = len(proposed) + 8  # room for the whole call (a call that cannot fit is not proposed)
    plain, _, _, n_prefix = run_turn(jump_engine, [], after, eos=True, session="plain")
    checked, _, exchange, _ = run_turn(jump_engine, ["early-jump:verify=1"], after, eos=True, session="checked")
    assert list(checked.output_tokens) == list(plain.output_tokens)
    start = n_prefix + 1
    [record] = exchange.notes["interventions"]
    assert record["verified"] is True and record["kind"] == "jump" and record["at"] == start
    rest = list(plain.output_tokens[start:])
    agree = next((i for i, (a, b) in enumerate(zip(proposed, rest)) if a != b), min(len(proposed), len(rest)))
    assert record["emitted"] == agree
    assert checked.output_kinds[start:start + agree] == ["jump"] * agree
    assert checked.output_kinds.count("jump") == agree


def test_early_jump_through_the_http_server_and_the_openai_sdk(jump_engine):
    from openai import OpenAI

    from jumpahead.policies.runtime import PolicyHooks
    from tests.serving import serve

    eng, tok = jump_engine, jump_engine.tokenizer
    n_call = len(tok.encode(E2E_CALL[1:], add_special_tokens=False))
    n_prefix = len(tok.encode(E2E_PREFIX, add_special_tokens=False))
    hooks = [PolicyHooks([], tok, eng.context_length), PrefixHook(tok, E2E_PREFIX)]
    with serve(eng, hooks=hooks) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        answer = client.chat.completions.create(
            model="local", messages=[{"role": "user", "content": "Create hello.py"}],
            max_tokens=n_prefix + 1 + n_call + 4, temperature=0, tools=[t.as_openai() for t in LIVE],
            logit_bias={str(k): v for k, v in newline_bias(tok).items()},
            extra_body={"jumpahead": {"policies": ["early-jump"]}})
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason in ("tool_calls", "length"), (message, answer.usage)
    assert (message.content or "").startswith(E2E_PREFIX) and "<tool_call>" not in (message.content or "")
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("write", {"path": "hello.py", "content": E2E_CONTENT})]
    fill = answer.usage.model_extra["fill"]
    assert fill["tokens"]["jump"] == n_call
    [item] = answer.usage.model_extra["report"]["policies"]["interventions"]  # beside fill: usage.report
    assert item["policy"] == "early-jump" and item["label"].startswith("early write path=hello.py")


def test_early_jump_arm_in_forced_replay(tiny_model):
    """`replay --arms ordinary,early-jump,early-jump:verify=1` on a recorded turn that
    states the block and calls write: the early jump supplies the call as the record has
    it (identical output), priced once as a `jump` run with D > 0, P and H. (Forced
    output does not depend on the weights: conftest.py's tiny llama, the default tokenizer.)"""
    from jumpahead.traces.arms import parse_arms
    from jumpahead.traces.replay import ReplayOptions, replay
    from jumpahead.traces.session import Session

    stated = f"I write hello.py with:\n```\n{E2E_CONTENT}```"
    session = Session("early", "jumpahead", messages=[
        Message("system", "You are a coding agent."), Message("user", "Create hello.py"),
        Message("assistant", stated, tool_calls=[ToolCall("write", json.dumps(
            {"path": "hello.py", "content": E2E_CONTENT}), id="c1")]),
        Message("tool", "wrote hello.py", tool_call_id="c1"),
    ], tools=[t.as_openai() for t in LIVE])
    names = ["early-jump", "early-jump:verify=1"]
    doc = replay([session], ReplayOptions(parse_arms(names), turns=1, max_context=2048, max_output_tokens=200),
                 tiny_model)
    assert doc["warnings"] == []
    [t] = doc["sessions"][0]["turns"]
    tok = tiny_model[1]
    n_call = len(tok.encode(E2E_CALL, add_special_tokens=False))
    for name in names:
        arm = t["arms"][name]
        assert arm["identical"] is True and arm["diverged"] is False, name
        jumps = [i for i in arm["interventions"] if i["kind"] == "jump"]
        assert jumps and all(j["D_s"] > 0 and "P_s" in j and "H_s" in j for j in jumps), (name, jumps)
        assert sum(j["tokens"] for j in jumps) == arm["tokens_by_kind"]["jump"], name  # each token priced once
        [note] = [p for p in arm["policy_interventions"] if p.get("tokens")]
        assert note["policy"] == "early-jump" and note["label"].startswith("early write path=hello.py")
        assert note["at"] == jumps[0]["at"] and note["tokens"] == n_call
    # asserted: the whole call in one run; verified: the call checked in slices of the
    # round's width, each followed by the row's own (agreeing) token, all accepted
    [whole] = [i for i in t["arms"]["early-jump"]["interventions"] if i["kind"] == "jump"]
    assert whole["tokens"] == n_call
    checked = t["arms"]["early-jump:verify=1"]
    runs = [i for i in checked["interventions"] if i["kind"] == "jump"]
    assert runs[-1]["at"] + runs[-1]["tokens"] - runs[0]["at"] == n_call
    assert checked["verified"]["accepted"] == checked["tokens_by_kind"]["jump"] == n_call - (len(runs) - 1)
