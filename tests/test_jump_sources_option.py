"""`jump`'s options (policies/jump.py `Jump`): `sources=all|output|context` keeps only
plans whose content comes from this turn's output or from the prompt's context
(JumpPlan.content_from, jump_plan.py's module doc); `verify=1` proposes the same plan
for verification (exact: greedy output is ordinary decoding token for token). Also the
live world's `edit_file(path, old, new)` gets edit plans, and the options parse as
replay and live arms. Fixtures and helpers come from tests/test_jump.py."""

from __future__ import annotations

import asyncio

import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
from jumpahead.core.turn import Message, Tool, Turn
from jumpahead.policies.jump import Jump
from jumpahead.policies.registry import PolicyError, parse_spec
from tests.test_jump import (  # noqa: F401  (tok, jump_engine: fixtures)
    FILE,
    HARD,
    PREFIX,
    REASONING,
    PrefixHook,
    args_of,
    bash_history,
    jump_engine,
    make_event,
    parsed,
    policy,
    read_result_messages,
    tok,
)

EDIT_REASONING = ('In app.py I replace\n```\n    return "hi " + name\n```\nwith\n```\n'
                  '    return "Hello, " + name + "!"\n```\n')
USER_BLOCK = Message("user", "Create src/hello.py with this content:\n```python\nprint('from user')\n```")


def cases(tok) -> dict[str, tuple[object, str]]:
    """One event per rule of plan_online: name -> (event, where its content comes from)."""
    return {
        "write from an output block": (make_event(tok, PREFIX, reasoning=REASONING), "output"),
        "edit: old from a tool result, new from the output": (make_event(
            tok, '\n{"name": "edit", "arguments": {"file_path": "app.py"', reasoning=EDIT_REASONING,
            messages=read_result_messages()), "output"),
        "repeat of a call in the prompt": (make_event(
            tok, '\n{"name": "bash", "arguments": {"command": "pytest -q',
            messages=bash_history("pytest -q tests/test_a.py")), "context"),
        "repeat of a call earlier this turn": (make_event(
            tok, '\n{"name": "bash", "arguments": {"command": "pytest -q',
            content='<tool_call>\n{"name": "bash", "arguments": {"command": "pytest -q tests/t.py", "timeout": 5}}\n'
                    '</tool_call>'), "output"),
        "write from a block the user stated": (make_event(tok, PREFIX, messages=[USER_BLOCK]), "context"),
        "shell command from an output block": (make_event(
            tok, '\n{"name": "bash", "arguments": {"command": "pyt',
            reasoning="I run the tests:\n```bash\npytest -q tests/test_x.py\n```\n"), "output"),
    }


def test_every_rule_records_where_its_content_comes_from(tok):
    for name, (event, where) in cases(tok).items():
        plan = policy(Jump, tok).plan(event)
        assert plan is not None and plan.content_from == where, name
    edit = policy(Jump, tok).plan(cases(tok)["edit: old from a tool result, new from the output"][0])
    assert edit.source_in == "context"  # the span the record points at: the old text in the file as read


@pytest.mark.parametrize("sources", ["output", "context"])
def test_sources_keeps_only_its_own_plans(tok, sources):
    for name, (event, where) in cases(tok).items():
        iv = policy(Jump, tok, sources=sources).on_boundary(event)
        full = policy(Jump, tok).on_boundary(event)
        if where == sources:
            assert iv is not None and iv.text == full.text and not iv.verified, name
        else:
            assert iv is None, name
    # a filter, never a fall-back: the output's block wins under `all`, so `context` takes nothing
    both = make_event(tok, PREFIX, messages=[USER_BLOCK], reasoning=REASONING)
    assert policy(Jump, tok).plan(both).content_from == "output"
    assert policy(Jump, tok, sources="context").on_boundary(both) is None


def test_verify_marks_the_same_plan_verified(tok):
    event, _ = cases(tok)["repeat of a call in the prompt"]
    asserted = policy(Jump, tok).on_boundary(event)
    checked = policy(Jump, tok, sources="context", verify="1").on_boundary(event)
    assert checked.verified and not asserted.verified and checked.kind == asserted.kind == "jump"
    assert (checked.text, checked.source, checked.source_in) == (asserted.text, asserted.source, asserted.source_in)


def test_options_parse_and_bad_values_are_errors():
    j = parse_spec("jump").build()
    assert (j.sources, j.verify) == ("all", False)
    j = parse_spec("jump:sources=context,verify=1").build()
    assert (j.sources, j.verify) == ("context", True)
    for spec, word in (("jump:sources=tools", "sources"), ("jump:verify=maybe", "verify"),
                       ("early-jump:verify=2", "verify")):
        with pytest.raises(PolicyError, match=word):
            parse_spec(spec).build()
    with pytest.raises(ValueError, match="jump: sources"):
        Jump(sources="everything")


def test_arms_parse_in_replay_and_live():
    from jumpahead.live.arms import parse_live_arms
    from jumpahead.traces.arms import parse_arms

    names = "ordinary,jump:sources=context,jump:sources=context,verify=1,jump:sources=output"
    arms = parse_arms(names)
    assert [(a.name, a.policy_specs, a.methods) for a in arms[1:]] == [
        ("jump:sources=context", ["jump:sources=context"], ["none"]),
        ("jump:sources=context,verify=1", ["jump:sources=context,verify=1"], ["none"]),
        ("jump:sources=output", ["jump:sources=output"], ["none"])]
    live = parse_live_arms(names)
    assert [a.serve_args() for a in live[1:]] == [
        ["--methods", "none", "--drafter", "none", "--policy", "jump:sources=context"],
        ["--methods", "none", "--drafter", "none", "--policy", "jump:sources=context,verify=1"],
        ["--methods", "none", "--drafter", "none", "--policy", "jump:sources=output"]]


def test_live_world_edit_file_gets_an_edit_plan(tok):
    from jumpahead.live.sandbox import TOOLS as LIVE_TOOLS
    from jumpahead.policies.jump_plan import roles

    tools = [Tool(t["function"]["name"], t["function"]["description"], t["function"]["parameters"])
             for t in LIVE_TOOLS]
    event = make_event(tok, '\n{"name": "edit_file", "arguments": {"path": "app.py"', reasoning=EDIT_REASONING,
                       messages=read_result_messages())
    p = policy(Jump, tok, tools=tools)
    plan = p.plan(event)
    assert plan is not None and plan.roles.kind == "edit" and (plan.roles.old_key, plan.roles.new_key) == ("old", "new")
    iv = p.on_boundary(event)
    assert args_of(parsed(tok, event, iv.text, tools=tools)[0]) == {
        "path": "app.py", "old": '    return "hi " + name', "new": '    return "Hello, " + name + "!"'}
    assert '    return "hi " + name' in FILE
    # bare old/new count only for an edit tool: a tool of another role keeps its role
    other = Tool("note", "Keep a note", {"type": "object", "properties": {
        "path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}}})
    from jumpahead.policies.call_text import parse_partial
    from jumpahead.policies.jump_plan import ToolSpec

    call = parse_partial('\n{"name": "note", "arguments": {"path": "a"', None)
    assert roles("note", ToolSpec.of("note", other.parameters), call).kind != "edit"


# --- end to end on the real model: verify=1 is ordinary greedy decoding -------------------

CONTENT = 'x = "a\\"b"\nprint("héllo \\\\ wörld")\n'
USER = Message("user", f"Create hello.py with this content:\n```python\n{CONTENT}```")
# the forced start of the answer: reasoning without the content, a write call up to its path
FORCED = ('<think>\nI will create hello.py as asked.\n</think>\n\n<tool_call>\n'
          '{"name": "write", "arguments": {"path": "hello.py",')


def run_turn(eng, policies: list[str], after: int, session: str):
    from jumpahead.core.exchange import Exchange
    from jumpahead.core.turn_runner import complete_turn, prepare_turn
    from jumpahead.engine.types import SamplingParams
    from jumpahead.policies.runtime import PolicyHooks
    from tests.test_jump import WRITE

    tok = eng.tokenizer
    n_prefix = len(tok.encode(FORCED, add_special_tokens=False))
    turn = Turn(messages=[USER], tools=[WRITE], max_tokens=n_prefix + after, sampling=SamplingParams())
    exchange = Exchange("chat", session_id=session)
    prepared = prepare_turn(eng, turn, exchange=exchange,
                            hooks=[PolicyHooks(policies, tok, eng.context_length), PrefixHook(tok, FORCED)])
    asyncio.run(complete_turn(eng, prepared))
    return prepared, exchange, n_prefix


def test_verified_context_jump_is_ordinary_greedy_decoding(jump_engine):
    """`jump:sources=context,verify=1`: the content the user stated is proposed at the
    call's next argument; the model checks it token by token, so greedy output is exactly
    the output without the policy, and the accepted tokens (kind `jump`) are the
    proposal's common prefix with that output."""
    tok = jump_engine.tokenizer
    after = len(tok.encode(CONTENT, add_special_tokens=False)) * 2 + 24
    plain, _, n_prefix = run_turn(jump_engine, [], after, "plain")
    checked, exchange, _ = run_turn(jump_engine, ["jump:sources=context,verify=1"], after, "checked")
    assert list(checked.output_tokens) == list(plain.output_tokens)
    records = exchange.notes["interventions"]
    assert records, "the verified jump proposed nothing"
    [record] = records
    assert (record["policy"], record["kind"], record["verified"], record["source_in"]) == (
        "jump", "jump", True, "context")
    at, emitted = record["at"], record["emitted"]
    assert at > n_prefix - 1 and 0 <= emitted <= record["tokens"]
    assert checked.output_kinds[at:at + emitted] == ["jump"] * emitted
    assert checked.output_kinds.count("jump") == emitted
    print("proposed", record["tokens"], "accepted", emitted, "output", tok.decode(list(plain.output_tokens[n_prefix:])))
