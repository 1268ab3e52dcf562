"""Logical jump-ahead policies (policies/jump.py): construction with the real default
tokenizer and the proxy's real output parser, then end to end on the real model through
the policy runtime (prepare_turn with PolicyHooks) and the real HTTP server + OpenAI SDK."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
from jumpahead.policies.api import BoundaryEvent, RequestContext, SessionState
from jumpahead.policies.call_text import CallFormat, parse_partial
from jumpahead.policies.jump import Jump, MistakenJump, OracleJump
from jumpahead.policies.registry import PolicyError, parse_spec
from jumpahead.core.output_parser import OutputParser
from jumpahead.core.prompt import render_prompt
from jumpahead.core.options import RequestOptions
from jumpahead.core.turn import Message, Tool, ToolCall, Turn

WRITE = Tool("write", "Write a file", {"type": "object", "properties": {"path": {"type": "string"},
             "content": {"type": "string"}}, "required": ["path", "content"]})
EDIT = Tool("edit", "Replace text in a file", {"type": "object", "properties": {
    "file_path": {"type": "string"}, "old_string": {"type": "string"}, "new_string": {"type": "string"}},
    "required": ["file_path", "old_string", "new_string"]})
BASH = Tool("bash", "Run a command", {"type": "object", "properties": {"command": {"type": "string"},
            "timeout": {"type": "integer"}}, "required": ["command"]})
EDITOR = Tool("str_replace_editor", "Editor", {"type": "object", "properties": {
    "command": {"type": "string"}, "path": {"type": "string"}, "file_text": {"type": "string"}},
    "required": ["command", "path"]})
TOOLS = [WRITE, EDIT, BASH, EDITOR]
# quotes, backslashes, tabs, newlines, non-ASCII, an emoji, and the end marker itself
HARD = 'x = "a\\"b"\n\tpath = "C:\\\\tmp"\nprint("héllo wörld 你好 🙂")\ns = "</tool_call>"\n'


@pytest.fixture(scope="module")
def tok(loaded_model):
    return loaded_model[1]


def context_of(tok, messages: list[Message], tools=TOOLS) -> str:
    return tok.decode(render_prompt(tok, Turn(messages=messages, tools=tools)))


def make_event(tok, call_text: str, *, reasoning: str = "", content: str = "", context: str | None = None,
               boundary: str = "argument_key", messages: list[Message] | None = None) -> BoundaryEvent:
    head = f"<think>\n{reasoning}\n</think>\n\n" if reasoning else ""
    output = head + content + ("\n" if content else "") + "<tool_call>" + call_text
    if context is None:
        context = context_of(tok, messages or [Message("user", "Please do the task.")])
    return BoundaryEvent(boundary, output, [], reasoning, content, context, tool_name=None, call_text=call_text)


def policy(cls, tok, tools=TOOLS, oracle: str | None = None, **options):
    p = cls(**options)
    turn = Turn(messages=[Message("user", "x")], tools=tools, options=RequestOptions(oracle_output=oracle))
    p.on_request(RequestContext(turn=turn, session=SessionState("s"), tokenizer=tok, context_length=8192))
    return p


def parsed(tok, event: BoundaryEvent, text: str, tools=TOOLS) -> list[ToolCall]:
    """The calls the proxy's real parser reads from the output plus the jump."""
    parser = OutputParser.for_tokenizer(tok, tools)
    parser.feed(event.output_text + text)
    parser.finish()
    assert not parser.malformed, parser.malformed
    return parser.tool_calls


def args_of(call: ToolCall) -> dict:
    assert not call.issues, call.issues
    return json.loads(call.arguments)


REASONING = f"I will create src/hello.py with this content:\n```python\n{HARD}```\nThen I run it."
PREFIX = '\n{"name": "write", "arguments": {"path": "src/hello.py"'


@pytest.mark.parametrize("rest", [
    "", ",", ", ", ', "', ', "cont', ', "content"', ', "content":', ', "content": ', ', "content": "',
    ', "content": "x = \\"a', ', "content": "x = \\"a\\\\\\"b\\"\\n\\tpa',
])
def test_write_from_a_stated_block_parses_to_exactly_the_block(tok, rest):
    """Wherever the model stands in the call (after the path, inside the next key, inside
    the content already), the jump finishes it so the real parser reads exactly the block."""
    event = make_event(tok, PREFIX + rest, reasoning=REASONING)
    iv = policy(Jump, tok).on_boundary(event)
    assert iv is not None and iv.kind == "jump" and not iv.verified
    assert iv.text.endswith('}}\n</tool_call>') and "</tool_call>" not in iv.text[:-len("</tool_call>")]
    calls = parsed(tok, event, iv.text)
    assert len(calls) == 1 and calls[0].name == "write"
    assert args_of(calls[0]) == {"path": "src/hello.py", "content": HARD}
    assert iv.source_in == "output" and event.output_text[iv.source[0]:iv.source[1]] == HARD
    assert tok.decode(tok.encode(iv.text, add_special_tokens=False)) == iv.text


def test_compact_separators_are_kept(tok):
    event = make_event(tok, '\n{"name":"write","arguments":{"path":"src/hello.py"', reasoning=REASONING)
    iv = policy(Jump, tok).on_boundary(event)
    assert iv.text.startswith(',"content":"') and iv.text.endswith('"}}\n</tool_call>')
    assert args_of(parsed(tok, event, iv.text)[0]) == {"path": "src/hello.py", "content": HARD}


def test_jump_waits_for_the_destination(tok):
    p = policy(Jump, tok)
    for call_text in ('\n{"name": "write"', '\n{"name": "write", "arguments": {"path": "src/hel',
                      '\n{"name": "write", "arguments": {"path"'):
        assert p.on_boundary(make_event(tok, call_text, reasoning=REASONING, boundary="tool_name")) is None


@pytest.mark.parametrize("reasoning,why", [
    (REASONING + "\nOr rather, src/hello.py should be:\n```python\nprint('other')\n```\n", "two different blocks"),
    ("I will create src/hello.py with:\n```python\nprint('hi')\n", "fence never closed"),
    ("Here is some code:\n```python\nprint('hi')\n```\n", "no path near the block"),
    ("I will create src/other.py with:\n```python\nprint('hi')\n```\n", "block for another file"),
    ("I will create src/hello.py, it uses lib/util.py:\n```python\nprint('hi')\n```\n", "last file named is another"),
    ('I will create src/hello.py with content: "print(\\"hi\\")"', "one-char quote with a backslash"),
    ('I will create src/hello.py with content: """print("hi")', "quote never closed"),
])
def test_ambiguity_declines(tok, reasoning, why):
    event = make_event(tok, PREFIX + ', "content": "', reasoning=reasoning)
    assert policy(Jump, tok).on_boundary(event) is None, why


def test_same_block_twice_and_quoted_block(tok):
    twice = REASONING + "\nTo repeat, src/hello.py:\n```python\n" + HARD + "```\n"
    event = make_event(tok, PREFIX, reasoning=twice)
    iv = policy(Jump, tok).on_boundary(event)
    assert args_of(parsed(tok, event, iv.text)[0])["content"] == HARD
    assert iv.source[0] > len("<think>\n" + REASONING)  # the latest statement
    quoted = 'I will create src/hello.py with content: """\nprint("hi")\n"""'
    event = make_event(tok, PREFIX, reasoning=quoted)
    iv = policy(Jump, tok).on_boundary(event)
    assert args_of(parsed(tok, event, iv.text)[0])["content"] == 'print("hi")\n'


def test_a_block_in_the_context_and_the_output_one_wins(tok):
    user = Message("user", "Create src/hello.py with this content:\n```python\nprint('from user')\n```")
    event = make_event(tok, PREFIX, messages=[user])
    iv = policy(Jump, tok).on_boundary(event)
    assert iv.source_in == "context" and event.context_text[iv.source[0]:iv.source[1]] == "print('from user')\n"
    assert args_of(parsed(tok, event, iv.text)[0])["content"] == "print('from user')\n"
    event = make_event(tok, PREFIX, messages=[user], reasoning=REASONING)
    iv = policy(Jump, tok).on_boundary(event)
    assert iv.source_in == "output" and args_of(parsed(tok, event, iv.text)[0])["content"] == HARD


def test_str_replace_editor_create(tok):
    event = make_event(tok, '\n{"name": "str_replace_editor", "arguments": {"command": "create", "path": "src/hello.py"',
                       reasoning=REASONING)
    iv = policy(Jump, tok).on_boundary(event)
    assert args_of(parsed(tok, event, iv.text)[0]) == {"command": "create", "path": "src/hello.py", "file_text": HARD}


FILE = 'def greet(name):\n    return "hi " + name\n\n\ndef main():\n    print(greet("wörld"))\n'


def read_result_messages() -> list[Message]:
    numbered = "".join(f"{i:6d}→{line}\n" for i, line in enumerate(FILE.splitlines(), 1))  # Claude Code's Read
    return [Message("user", "Make greet polite."),
            Message("assistant", "", tool_calls=[ToolCall("read", '{"file_path": "app.py"}', id="c1")]),
            Message("tool", numbered, tool_call_id="c1")]


def test_edit_old_from_the_read_result_new_from_reasoning(tok):
    reasoning = ('In app.py I replace\n```\n    return "hi " + name\n```\nwith\n```\n'
                 '    return "Hello, " + name + "!"\n```\n')
    event = make_event(tok, '\n{"name": "edit", "arguments": {"file_path": "app.py"', reasoning=reasoning,
                       messages=read_result_messages())
    iv = policy(Jump, tok).on_boundary(event)
    assert args_of(parsed(tok, event, iv.text)[0]) == {
        "file_path": "app.py", "old_string": '    return "hi " + name', "new_string": '    return "Hello, " + name + "!"'}
    assert iv.source_in == "context" and "hi " in event.context_text[iv.source[0]:iv.source[1]]
    inline = 'In app.py replace `print(greet("wörld"))` with `print(greet("you"))`.'
    event = make_event(tok, '\n{"name": "edit", "arguments": {"file_path": "app.py"', reasoning=inline,
                       messages=read_result_messages())
    iv = policy(Jump, tok).on_boundary(event)
    assert args_of(parsed(tok, event, iv.text)[0])["new_string"] == 'print(greet("you"))'
    # an old block the file does not hold: no jump
    event = make_event(tok, '\n{"name": "edit", "arguments": {"file_path": "app.py"',
                       reasoning="In app.py I replace\n```\nnot in the file\n```\nwith\n```\nnew\n```\n",
                       messages=read_result_messages())
    assert policy(Jump, tok).on_boundary(event) is None


def bash_history(*commands: str) -> list[Message]:
    msgs = [Message("user", "Run the tests.")]
    for i, command in enumerate(commands):
        msgs.append(Message("assistant", "", tool_calls=[
            ToolCall("bash", json.dumps({"command": command, "timeout": 60}), id=f"c{i}")]))
        msgs.append(Message("tool", "1 failed", tool_call_id=f"c{i}"))
    return msgs


def test_repeated_call_copies_the_earlier_one(tok):
    event = make_event(tok, '\n{"name": "bash", "arguments": {"command": "pytest -q', messages=bash_history(
        'pytest -q tests/test_a.py -k "x and not y"'))
    iv = policy(Jump, tok).on_boundary(event)
    assert args_of(parsed(tok, event, iv.text)[0]) == {"command": 'pytest -q tests/test_a.py -k "x and not y"',
                                                      "timeout": 60}
    assert iv.source_in == "context" and "pytest" in event.context_text[iv.source[0]:iv.source[1]]
    # two earlier calls that both fit: ambiguous
    event = make_event(tok, '\n{"name": "bash", "arguments": {"command": "pytest -q', messages=bash_history(
        "pytest -q tests/test_a.py", "pytest -q tests/test_b.py"))
    assert policy(Jump, tok).on_boundary(event) is None
    # a prefix too short to aim, and a tool the request does not offer
    event = make_event(tok, '\n{"name": "bash", "arguments": {"command": "py', messages=bash_history("pytest -q"))
    assert policy(Jump, tok).on_boundary(event) is None
    event = make_event(tok, '\n{"name": "shell", "arguments": {"command": "pytest -q', messages=bash_history("pytest -q"))
    assert policy(Jump, tok).on_boundary(event) is None


def test_partial_call_parser_stages():
    fmt = CallFormat()
    assert parse_partial('\n{"name": "wri', fmt) is None
    assert parse_partial('\n{"name": "write"', fmt).stage == "outer"
    assert parse_partial('\n{"name": "write", "arguments": {', fmt).stage == "open"
    c = parse_partial('\n{"name": "w", "arguments": {"a": 12, "b": "x\\u00e9', fmt)
    assert (c.stage, c.key, c.partial, c.args) == ("string", "b", "xé", {"a": 12})
    assert parse_partial('\n{"name": "w", "arguments": {"a": 12', fmt) is None  # a number may grow
    assert parse_partial('\n{"name": "w", "arguments": {"a": "x\\', fmt) is None  # inside an escape
    assert parse_partial('\n{"name": "w", "parameters": {', fmt) is None  # another layout


# --- oracle ---------------------------------------------------------------------------------


def oracle_setup(tok, content: str, reasoning: str, call_rest: str = "", context: str | None = None):
    call = json.dumps({"name": "write", "arguments": {"path": "src/hello.py", "content": content}}, ensure_ascii=False)
    head = f"<think>\n{reasoning}\n</think>\n\n"
    recorded = f"{head}<tool_call>\n{call}\n</tool_call>"
    call_text = '\n{"name": "write"' + call_rest
    event = make_event(tok, call_text, reasoning=reasoning, boundary="tool_name", context=context)
    assert recorded.startswith(event.output_text)
    p = policy(OracleJump, tok, oracle=recorded)
    return p, event, recorded


def test_oracle_supplies_a_fully_sourced_call(tok):
    content = HARD.replace("</tool_call>", "done")  # a recorded call cannot hold its end marker
    p, event, recorded = oracle_setup(tok, content, REASONING.replace(HARD, content))
    iv = p.on_boundary(event)
    assert event.output_text + iv.text == recorded
    assert args_of(parsed(tok, event, iv.text)[0]) == {"path": "src/hello.py", "content": content}
    assert "stopped" not in iv.label and iv.source_in == "output"
    assert event.output_text[iv.source[0]:iv.source[1]] == content


def test_oracle_never_supplies_content_absent_before_the_jump(tok):
    novel = "def brand_new_function(argument_one):\n    return argument_one * 4242\n"
    p, event, recorded = oracle_setup(tok, novel, "I will create src/hello.py now.")
    iv = p.on_boundary(event)
    # structure, the key and the path (named in the reasoning) come; no content character
    assert iv is not None and iv.text == ', "arguments": {"path": "src/hello.py", "content": "'
    half = "def brand_new_function(argument_one):\n"
    p, event, recorded = oracle_setup(tok, novel, f"I will create src/hello.py starting with\n{half}")
    iv = p.on_boundary(event)
    value = json.loads('"' + iv.text.split('"content": "', 1)[1] + '"')
    assert value == half and "stopped at unsourced content" in iv.label
    for where, hay in (("context", event.context_text), ("output", event.output_text)):
        if iv.source_in == where:
            assert hay[iv.source[0]:iv.source[1]] in half
    # the model left the recording: nothing
    event.output_text = event.output_text.replace("starting with", "beginning with")
    assert p.on_boundary(event) is None


def test_oracle_without_a_recording_does_nothing(tok):
    p = policy(OracleJump, tok)
    assert p.on_boundary(make_event(tok, PREFIX, reasoning=REASONING)) is None


# --- mistaken jumps -------------------------------------------------------------------------

CONTEXT_FILES = [Message("user", "Files: lib/a.py, lib/b.py, docs/readme.md\n```python\nimport os\nprint(os.getcwd())\n```"
                                 "\n<tool_response>\nother file text\nwith two lines\n</tool_response>")]


def many_events(tok, n: int):
    context = context_of(tok, CONTEXT_FILES)
    for i in range(n):
        content = f"value_{i} = {i * 7}\nprint(value_{i}, 'n°{i}')\n"
        reasoning = f"I will create src/m{i}.py with:\n```python\n{content}```\n"
        call = f'\n{{"name": "write", "arguments": {{"path": "src/m{i}.py"'
        yield make_event(tok, call, reasoning=reasoning, context=context), content


def test_mistaken_jump_perturbs_about_rate_deterministically(tok):
    rate, n = 0.3, 200
    runs = []
    for seed in ("7", "7", "8"):
        p = policy(MistakenJump, tok, rate=str(rate), seed=seed)
        base = policy(Jump, tok)
        texts, perturbed, kinds = [], 0, set()
        for event, content in many_events(tok, n):
            iv = p.on_boundary(event)
            good = base.on_boundary(event)
            assert iv is not None and good is not None
            calls = parsed(tok, event, iv.text)  # every jump, perturbed or not, parses as one call
            assert len(calls) == 1 and calls[0].name == "write"
            args = args_of(calls[0])
            if iv.label.startswith("mistaken "):
                perturbed += 1
                kind = iv.label.split()[1]
                kinds.add(kind)
                assert iv.text != good.text and args["content"] != content
                if kind == "truncated":
                    assert content.startswith(args["content"]) and len(args["content"]) < len(content)
            else:
                assert iv.text == good.text and args["content"] == content
            texts.append(iv.text)
        assert p.counts["jumps"] == n and p.counts["perturbed"] == perturbed
        assert abs(perturbed / n - rate) < 0.08, perturbed
        assert kinds == {"truncated", "wrong_file"}  # online jumps come after the path: it is the model's
        runs.append(texts)
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_mistaken_oracle_jump_can_send_a_wrong_path(tok):
    reasoning = "I will create src/hello.py (see also lib/other.py) with:\n```python\nprint('hi')\n```"
    kinds = set()
    context = context_of(tok, CONTEXT_FILES)
    for seed in range(40):
        p, event, recorded = oracle_setup(tok, "print('hi')\n", reasoning, context=context)
        m = policy(MistakenJump, tok, oracle=recorded, rate="1", seed=str(seed),
                   base="oracle")
        iv = m.on_boundary(event)
        args = args_of(parsed(tok, event, iv.text)[0])
        kind = iv.label.split()[1]
        kinds.add(kind)
        if kind == "wrong_path":
            assert args["path"] != "src/hello.py" and args["content"] == "print('hi')\n"
    assert kinds == {"wrong_path", "truncated", "wrong_file"}


def test_builtin_names_resolve():
    assert type(parse_spec("jump").build()) is Jump
    assert type(parse_spec("oracle-jump:min_chars=8").build()).__name__ == "OracleJump"
    m = parse_spec("mistaken-jump:rate=0.25,seed=3,base=oracle").build()
    assert (type(m), m.rate, m.seed, type(m.base)) == (MistakenJump, 0.25, "3", OracleJump)


def test_bad_options_are_clear_errors():
    for spec, word in (("mistaken-jump:rate=2", "between 0 and 1"), ("mistaken-jump:rate=x", "number"),
                       ("mistaken-jump:base=psychic", "base"), ("oracle-jump:min_chars=few", "min_chars")):
        with pytest.raises(PolicyError, match=word):
            parse_spec(spec).build()


def test_decide_time_on_a_large_context(tok):
    """H: a boundary decision on a ~120 KB prompt (tool results, earlier calls) stays cheap."""
    big = [Message("user", "Go.")]
    for i in range(60):
        body = "".join(f"{n:6d}→line {n} of file {i}: value = {n * i}\n" for n in range(1, 60))
        big += [Message("assistant", "", tool_calls=[ToolCall("read", json.dumps({"file_path": f"f{i}.py"}), id=f"r{i}")]),
                Message("tool", body, tool_call_id=f"r{i}")]
    context = context_of(tok, big)
    assert len(context) > 100_000
    p = policy(Jump, tok)
    times = []
    for _ in range(5):
        event = make_event(tok, PREFIX, reasoning=REASONING, context=context)
        t0 = time.perf_counter()
        iv = p.on_boundary(event)
        times.append(time.perf_counter() - t0)
        assert iv is not None
    # the first decision indexes the prompt; the later ones reuse it
    assert times[0] < 0.5 and max(times[1:]) < 0.02, times


# --- end to end on the real model --------------------------------------------------------------

E2E_CONTENT = 'x = "a\\"b"\nprint("héllo \\\\ wörld")\n'
E2E_REASONING = f"I will create hello.py with this content:\n```python\n{E2E_CONTENT}```"
# The forced start of the answer: reasoning holding the content, then a write call up to
# the path. The model writes the next token itself (` "`, opening the next key), then the
# jump supplies the rest of the call.
E2E_PREFIX = f'<think>\n{E2E_REASONING}\n</think>\n\n<tool_call>\n{{"name": "write", "arguments": {{"path": "hello.py",'
E2E_TAIL = 'content": ' + json.dumps(E2E_CONTENT, ensure_ascii=False) + "}}\n</tool_call>"


class PrefixProposer:
    """Forces the first output tokens (asserted, like script mode), then proposes nothing."""

    name = "scripted"

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def propose(self, view, max_len):
        n = len(view.tokens) - view.prompt_len
        return None if n >= len(self.tokens) else _proposal(self.tokens[n:])

    def feedback(self, proposal, accepted) -> None:
        pass


def _proposal(tokens):
    from jumpahead.engine.methods.proposal import Proposal

    return Proposal(list(tokens), "scripted")


class PrefixHook:
    """A proxy hook (core/exchange.py) adding the PrefixProposer to each row."""

    def __init__(self, tokenizer, text: str) -> None:
        self.tokens = tokenizer.encode(text, add_special_tokens=False)

    def before_render(self, exchange, turn):
        return turn

    def row_proposers(self, exchange, prepared):
        return [PrefixProposer(self.tokens)]

    def after_turn(self, exchange, prepared, out) -> None:
        return None


@pytest.fixture(scope="module")
def jump_engine(loaded_model):
    from jumpahead.engine.engine import Engine, EngineConfig

    model, tokenizer, info = loaded_model
    # No prefix cache: the fresh greedy run below must not reuse the jumped row's KV.
    eng = Engine(model, tokenizer, info, EngineConfig(max_batch=4, max_asserted=1024, prefix_cache=False))
    yield eng
    eng.close()


def e2e_budget(tok, after: int) -> int:
    """Output tokens for the prefix, the model's one token, the jump, and `after` more."""
    return len(tok.encode(E2E_PREFIX, add_special_tokens=False)) + 1 + len(tok.encode(E2E_TAIL)) + after


def no_eos(tok) -> dict[int, float]:
    return {int(t): -100.0 for t in tok.eos_token_ids}  # keep generating after the call: more to compare


def test_jump_end_to_end_through_the_engine(jump_engine):
    from jumpahead.engine.types import GenerationRequest, SamplingParams
    from jumpahead.policies.runtime import PolicyHooks
    from jumpahead.core.exchange import Exchange
    from jumpahead.core.turn_runner import complete_turn, prepare_turn

    eng, tok = jump_engine, jump_engine.tokenizer
    turn = Turn(messages=[Message("user", "Create hello.py")], tools=[WRITE], max_tokens=e2e_budget(tok, 8),
                sampling=SamplingParams(logit_bias=no_eos(tok)))
    exchange = Exchange("chat", session_id="jump-e2e")
    prepared = prepare_turn(eng, turn, exchange=exchange,
                            hooks=[PolicyHooks(["jump"], tok, eng.context_length), PrefixHook(tok, E2E_PREFIX)])
    out = asyncio.run(complete_turn(eng, prepared))

    kinds, tokens = prepared.output_kinds, prepared.output_tokens
    n_prefix = len(tok.encode(E2E_PREFIX, add_special_tokens=False))
    assert kinds[:n_prefix] == ["scripted"] * n_prefix
    assert kinds[n_prefix] == "sampled" and tok.decode([tokens[n_prefix]]) == ' "'
    jumped = [i for i, k in enumerate(kinds) if k == "jump"]
    expected = tok.encode(E2E_TAIL, add_special_tokens=False)
    assert jumped == list(range(n_prefix + 1, n_prefix + 1 + len(expected)))
    assert [tokens[i] for i in jumped] == expected  # exactly the constructed tokens, all asserted
    end = jumped[-1] + 1
    assert kinds[end:] == ["sampled"] * 8  # generation goes on
    # the client's view: one well-formed call with exactly the stated content
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [
        ("write", {"path": "hello.py", "content": E2E_CONTENT})]
    [record] = exchange.notes["interventions"]
    assert (record["policy"], record["kind"], record["tokens"], record["emitted"]) == ("jump", "jump", len(expected),
                                                                                       len(expected))
    assert record["source_in"] == "output" and record["decide_ms"] < 50
    assert exchange.notes["policies"]["supplied_tokens"] == len(expected)
    # the state after the jump is a forward over the same tokens: greedy decoding from a
    # fresh prompt = prompt + output so far continues exactly as the jumped row did
    fresh = GenerationRequest(prompt=list(prepared.request.prompt) + list(tokens[:end]),
                              sampling=SamplingParams(logit_bias=no_eos(tok)), max_tokens=len(tokens) - end,
                              methods=["none"])
    again = [t for c in eng.generate_sync(fresh) for t in c.tokens]
    assert again == list(tokens[end:])


def test_jump_through_the_http_server_and_the_openai_sdk(jump_engine):
    from openai import OpenAI

    from jumpahead.policies.runtime import PolicyHooks
    from tests.serving import serve

    eng, tok = jump_engine, jump_engine.tokenizer
    hooks = [PolicyHooks([], tok, eng.context_length), PrefixHook(tok, E2E_PREFIX)]
    with serve(eng, hooks=hooks) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="x")
        answer = client.chat.completions.create(
            model="local", messages=[{"role": "user", "content": "Create hello.py"}], max_tokens=e2e_budget(tok, 4),
            temperature=0,  # greedy: the one sampled token before the boundary must not vary run to run
            tools=[WRITE.as_openai()], extra_body={"jumpahead": {"policies": ["jump"]}})
    message = answer.choices[0].message
    # The call is whole either way; after it the 135M model may write a few tokens of its
    # own instead of EOS within the 4-token allowance (greedy, it writes "```\n</" here),
    # so the turn can end on the budget.
    assert answer.choices[0].finish_reason in ("tool_calls", "length"), (message, answer.usage)
    assert "<tool_call>" not in (message.content or "") and "write" not in (message.content or "")
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("write", {"path": "hello.py", "content": E2E_CONTENT})]
    fill = answer.usage.model_extra["fill"]
    assert fill["tokens"]["jump"] == len(tok.encode(E2E_TAIL, add_special_tokens=False))
    assert answer.usage.model_extra["report"]["policies"]["interventions"][0]["label"].startswith("write path=hello.py content from output block")
