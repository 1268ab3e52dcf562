"""Anthropic `context_management` on the real server (proxy/anthropic_context.py parses the
edits into core/turn.py's typed ones, policies/context_edits.py applies them as sticky rewrites).

Checked: Claude Code's captured request gets `context_management.applied_edits` in the
stream's final message_delta; a thinking-clearing variant of it reports the cleared
turn; `clear_tool_uses_20250919` over a long session clears the same tool uses on two
consecutive turns, the edited prompt of turn 1 is a token prefix of turn 2's (from the
trace files) and turn 2's `cache_read_input_tokens` covers it; the cleared tokens are
in `usage.report` and the traces; a malformed edit is a 400 naming the field; an unknown
edit type is ignored with a log line.
"""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

import httpx
import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
from jumpahead.policies.runtime import PolicyHooks
from jumpahead.proxy.anthropic_messages import parse_messages_request
from jumpahead.core.errors import APIError
from jumpahead.core.prompt import render_prompt
from jumpahead.core.script import Script, ScriptTurn
from jumpahead.core.turn import ClearThinkingEdit, ClearToolUsesEdit
from jumpahead.proxy.anthropic_context import parse_context_management
from jumpahead.proxy.signing import Signer

from .conftest import shared_path
from .policy_sessions import common_prefix
from .serving import script_engine, serve, sse_events

anthropic = pytest.importorskip("anthropic")

BETA = ["context-management-2025-06-27"]
CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"


def claude_code_body() -> dict[str, Any]:
    path = shared_path("fixtures", "clients", "claude-code", "002_POST_v1_messages.json")
    return json.loads(path.read_text())["body"]


@pytest.fixture(scope="module")
def scripted_engine(loaded_model):
    eng = script_engine(loaded_model)
    yield eng
    eng.close()


def scripted_server(engine: Any, signer: Signer | None = None, turns: int = 8):
    """Script mode (Claude Code's prompt is longer than the default model's window: it is
    cut before prefill, as tests/test_server_protocols.py does), with the policy runtime."""
    script = Script([ScriptTurn(text="Done.") for _ in range(turns)], prompt_limit=256)
    hooks = [PolicyHooks([], engine.tokenizer, engine.context_length)]
    return serve(engine, script=script, hooks=hooks, signer=signer)


# --- parsing -------------------------------------------------------------------------------


def test_edits_parse_with_the_api_defaults() -> None:
    edits = parse_context_management({"edits": [{"type": CLEAR_THINKING}, {"type": CLEAR_TOOL_USES}]})
    assert edits == [
        ClearThinkingEdit(keep=1),
        ClearToolUsesEdit(trigger=100000, trigger_unit="input_tokens", keep=3, clear_at_least=0, exclude_tools=(),
                          clear_tool_inputs=False)]
    assert [e.kind for e in edits] == [CLEAR_THINKING, CLEAR_TOOL_USES]
    (edit,) = parse_context_management({"edits": [{
        "type": CLEAR_TOOL_USES, "trigger": {"type": "tool_uses", "value": 5}, "keep": {"type": "tool_uses", "value": 1},
        "clear_at_least": {"type": "input_tokens", "value": 500}, "exclude_tools": ["Grep"],
        "clear_tool_inputs": ["Read"]}]})
    assert edit == ClearToolUsesEdit(trigger=5, trigger_unit="tool_uses", keep=1, clear_at_least=500,
                                     exclude_tools=("Grep",), clear_tool_inputs=("Read",))
    assert parse_context_management({"edits": [{"type": CLEAR_THINKING, "keep": "all"}]})[0].keep == "all"
    assert parse_context_management({"edits": [{"type": CLEAR_THINKING, "keep": {"type": "all"}}]})[0].keep == "all"
    turn = parse_messages_request(claude_code_body())
    assert turn.context_edits == [ClearThinkingEdit(keep="all")]


MALFORMED = [
    ("all", "context_management"),
    ({"edits": {"type": CLEAR_TOOL_USES}}, "context_management.edits"),
    ({"edits": ["clear"]}, "context_management.edits[0]"),
    ({"edits": [{"keep": 3}]}, "context_management.edits[0].type"),
    ({"edits": [{"type": CLEAR_TOOL_USES, "keep": 3}]}, "context_management.edits[0].keep"),
    ({"edits": [{"type": CLEAR_TOOL_USES, "keep": {"type": "tool_uses", "value": -1}}]},
     "context_management.edits[0].keep.value"),
    ({"edits": [{"type": CLEAR_TOOL_USES, "trigger": {"type": "messages", "value": 5}}]},
     "context_management.edits[0].trigger.type"),
    ({"edits": [{"type": CLEAR_TOOL_USES, "trigger": {"type": "input_tokens"}}]},
     "context_management.edits[0].trigger.value"),
    ({"edits": [{"type": CLEAR_TOOL_USES, "clear_at_least": {"type": "input_tokens", "value": "many"}}]},
     "context_management.edits[0].clear_at_least.value"),
    ({"edits": [{"type": CLEAR_TOOL_USES, "exclude_tools": "Bash"}]}, "context_management.edits[0].exclude_tools"),
    ({"edits": [{"type": CLEAR_TOOL_USES, "clear_tool_inputs": "yes"}]},
     "context_management.edits[0].clear_tool_inputs"),
    ({"edits": [{"type": CLEAR_THINKING, "keep": {"type": "thinking_turns"}}]},
     "context_management.edits[0].keep.value"),
    ({"edits": [{"type": CLEAR_THINKING, "keep": 2}]}, "context_management.edits[0].keep"),
    ({"edits": [{"type": CLEAR_TOOL_USES}, {"type": CLEAR_THINKING}]}, "context_management.edits[1].type"),
    ({"edits": [{"type": CLEAR_TOOL_USES}, {"type": CLEAR_TOOL_USES}]}, "context_management.edits[1].type"),
]


@pytest.mark.parametrize("value,param", MALFORMED)
def test_malformed_edits_name_the_field(value: Any, param: str) -> None:
    with pytest.raises(APIError) as info:
        parse_context_management(value)
    assert info.value.status == 400 and info.value.param == param and param in str(info.value)


# --- the real server ---------------------------------------------------------------------


def test_claude_code_request_gets_applied_edits(scripted_engine) -> None:
    """The captured request as sent (streaming, `keep: "all"`): the final message_delta
    says nothing was cleared; the same request asking to keep one thinking turn, with
    two earlier signed thinking turns, reports one cleared turn (non-streaming, SDK)."""
    signer = Signer(b"k" * 32)
    body = claude_code_body()
    with scripted_server(scripted_engine, signer) as url:
        with httpx.Client(timeout=120) as http:
            with http.stream("POST", f"{url}/v1/messages?beta=true", json=body) as response:
                assert response.status_code == 200
                events = sse_events(response)
        (delta,) = [e for name, e in events if name == "message_delta"]
        assert delta["context_management"] == {"applied_edits": []}
        assert delta["usage"]["report"]["context_edits"]["applied_edits"] == []

        variant = copy.deepcopy(body)
        variant["stream"] = False
        variant["max_tokens"] = 64
        variant["context_management"] = {"edits": [{"type": CLEAR_THINKING,
                                                    "keep": {"type": "thinking_turns", "value": 1}}]}
        messages = variant["messages"]
        first_call = next(b for b in messages[2]["content"] if b["type"] == "tool_use")
        thought = "The user wants a file; Write creates it."
        messages[2]["content"].insert(0, {"type": "thinking", "thinking": thought, "signature": signer.sign(thought)})
        again = "The file exists now; read it back to check."
        messages.append({"role": "assistant", "content": [
            {"type": "thinking", "thinking": again, "signature": signer.sign(again)},
            {"type": "tool_use", "id": "toolu_read", "name": "Read", "input": {"file_path": first_call["input"]["file_path"]}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_read", "content": "hello world\n"}]})
        client = anthropic.Anthropic(base_url=url, api_key="x")
        message = client.beta.messages.create(
            model=variant["model"], max_tokens=64, system=variant["system"], messages=messages,
            tools=variant["tools"], metadata=variant["metadata"], context_management=variant["context_management"],
            betas=BETA)
        with client.beta.messages.stream(
                model=variant["model"], max_tokens=64, system=variant["system"], messages=messages,
                tools=variant["tools"], metadata=variant["metadata"], context_management=variant["context_management"],
                betas=BETA) as stream:
            streamed = stream.get_final_message()  # the SDK takes it from the final message_delta
    assert streamed.context_management == message.context_management
    (edit,) = message.context_management.applied_edits
    assert edit.type == CLEAR_THINKING and edit.cleared_thinking_turns == 1 and edit.cleared_input_tokens >= 0
    fill = message.usage.model_extra["report"]["context_edits"]
    assert fill["applied_edits"][0]["messages"] == [3]  # system, user, system, [assistant 1], tool, assistant 2, tool


def long_session(pairs: int, result_lines: int = 8) -> list[dict[str, Any]]:
    """A session of `pairs` tool_use / tool_result pairs (file reads of ~100 tokens each)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Find why the tests fail and fix it."}]
    for k in range(pairs):
        name = "Grep" if k % 5 == 0 else "Read"
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Step {k}."},
            {"type": "tool_use", "id": f"toolu_{k:02d}", "name": name, "input": {"path": f"src/mod{k}.py"}}]})
        lines = "".join(f"    value_{k}_{j} = compute({j}, {k})\n" for j in range(result_lines))
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"toolu_{k:02d}", "content": f"def mod{k}():\n{lines}"}]})
    return messages


def test_clear_tool_uses_is_sticky_and_the_prefix_cache_keeps_hitting(engine, tmp_path) -> None:
    from jumpahead.traces.recorder import TraceRecorder
    from jumpahead.traces.trace_file import read_trace
    from jumpahead.traces.turn_json import turn_from_json

    edits = {"edits": [{"type": CLEAR_TOOL_USES, "trigger": {"type": "input_tokens", "value": 1500},
                        "keep": {"type": "tool_uses", "value": 3},
                        "clear_at_least": {"type": "input_tokens", "value": 400}, "exclude_tools": ["Grep"]}]}
    first = long_session(16)
    # turn 2: the history plus one more step (one more result falls out of `keep`: ~100
    # tokens, under clear_at_least, so turn 1's clears are replayed and nothing is added)
    second = long_session(17)
    hooks = [PolicyHooks([], engine.tokenizer, engine.context_length), TraceRecorder.for_engine(tmp_path, engine)]
    with serve(engine, hooks=hooks) as url:
        client = anthropic.Anthropic(base_url=url, api_key="x")
        plain = [client.beta.messages.count_tokens(model="m", messages=m).input_tokens for m in (first, second)]
        answers = []
        for messages in (first, second):
            answers.append(client.beta.messages.create(
                model="m", max_tokens=2, messages=messages, context_management=edits,
                metadata={"user_id": "context-edits-test"}, betas=BETA))
    (one,), (two,) = (a.context_management.applied_edits for a in answers)
    # 16 results, the last 3 kept, Grep's (k = 0, 5, 10) excluded: k = 1-4, 6-9, 11, 12
    assert one.type == two.type == CLEAR_TOOL_USES
    assert one.cleared_tool_uses == two.cleared_tool_uses == 10
    assert one.cleared_input_tokens == two.cleared_input_tokens > 400
    for answer, unedited in zip(answers, plain):
        usage = answer.usage
        assert usage.input_tokens + usage.cache_read_input_tokens == unedited - one.cleared_input_tokens
        fill = usage.model_extra["report"]["context_edits"]
        assert fill["cleared_input_tokens"] == one.cleared_input_tokens

    (trace,) = tmp_path.glob("*.jsonl")
    _, turns, warnings = read_trace(trace)
    assert not warnings and len(turns) == 2
    contexts = [turn_from_json(t["context"]) for t in turns]
    cleared = [[i for i, m in enumerate(c.messages) if m.content == "[tool result cleared]"] for c in contexts]
    assert cleared[0] == cleared[1] and len(cleared[0]) == 10  # the same tool uses, on both turns
    for t in turns:
        assert t["usage"]["report"]["context_edits"]["applied_edits"][0]["cleared_input_tokens"] == one.cleared_input_tokens
    p1, p2 = (render_prompt(engine.tokenizer, c) for c in contexts)
    assert len(p1) == turns[0]["prompt_tokens"] and len(p2) == turns[1]["prompt_tokens"]
    shared = common_prefix(p1, p2)
    assert shared >= len(p1) - 2  # turn 1's edited prompt is a prefix of turn 2's (byte-identical edits)
    assert answers[1].usage.cache_read_input_tokens >= shared - 2
    print(f"\nclear_tool_uses: {plain[1]} -> {len(p2)} prompt tokens, turn 2 read "
          f"{answers[1].usage.cache_read_input_tokens} from the prefix cache")


def test_malformed_edit_is_a_400_over_http(scripted_engine) -> None:
    with scripted_server(scripted_engine) as url:
        client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
        bad = {"edits": [{"type": CLEAR_TOOL_USES, "keep": {"type": "tool_uses", "value": -1}}]}
        with pytest.raises(anthropic.BadRequestError) as info:
            client.beta.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                                        context_management=bad, betas=BETA)
        assert "context_management.edits[0].keep.value" in str(info.value)
        with pytest.raises(anthropic.BadRequestError) as info:
            client.beta.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}],
                                              context_management={"edits": "clear"}, betas=BETA)
        assert "context_management.edits" in str(info.value)
        with httpx.Client(timeout=60) as http:
            response = http.post(f"{url}/v1/messages", json={"model": "m", "max_tokens": 4, "context_management": 7,
                                                            "messages": [{"role": "user", "content": "hi"}]})
        assert response.status_code == 400 and response.json()["type"] == "error"
        assert "context_management" in response.json()["error"]["message"]


def test_unknown_edit_type_is_ignored_with_a_log_line(scripted_engine, caplog) -> None:
    caplog.set_level(logging.INFO, logger="jumpahead.proxy.anthropic_context")
    edits = {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50000}},
                       {"type": CLEAR_TOOL_USES, "trigger": {"type": "tool_uses", "value": 2},
                        "keep": {"type": "tool_uses", "value": 1}}]}
    with scripted_server(scripted_engine) as url:
        with httpx.Client(timeout=120) as http:
            response = http.post(f"{url}/v1/messages", json={"model": "m", "max_tokens": 8, "messages": long_session(4),
                                                            "context_management": edits})
    assert response.status_code == 200, response.text
    (edit,) = response.json()["context_management"]["applied_edits"]
    assert edit == {"type": CLEAR_TOOL_USES, "cleared_tool_uses": 3, "cleared_input_tokens": edit["cleared_input_tokens"]}
    assert edit["cleared_input_tokens"] > 100  # results 0-2 (the last one is kept)
    assert any("compact_20260112" in r.getMessage() and "ignored" in r.getMessage() for r in caplog.records)


# --- the policies through the runtime (no model: the default tokenizer) ---------------------


def _run(hooks: PolicyHooks, body: dict[str, Any], session: str = "s") -> tuple[Any, Any, dict[str, Any]]:
    from jumpahead.core.exchange import Exchange

    turn = parse_messages_request(body)
    exchange = Exchange("messages", session_id=session)
    out = hooks.before_render(exchange, turn)
    return turn, out, exchange.state["policies"].context_edits


def test_without_clear_at_least_each_turn_clears_one_more_and_keeps_the_earlier_ones() -> None:
    from .policy_sessions import default_tokenizer

    tokenizer = default_tokenizer()
    hooks = PolicyHooks([], tokenizer, 8192)
    edits = {"edits": [{"type": CLEAR_TOOL_USES, "trigger": {"type": "tool_uses", "value": 3},
                        "keep": {"type": "tool_uses", "value": 2}, "clear_tool_inputs": True,
                        "exclude_tools": ["Grep"]}]}
    outs, reports = [], []
    for pairs in (8, 9, 10):
        turn, out, report = _run(hooks, {"model": "m", "max_tokens": 4, "messages": long_session(pairs),
                                         "context_management": edits})
        outs.append(out)
        reports.append(report)
        (applied,) = report["applied_edits"]
        assert applied["cleared_input_tokens"] == len(render_prompt(tokenizer, turn)) - len(render_prompt(tokenizer, out))
    # results older than the last 2, Grep's (k = 0, 5) excluded: 8 pairs -> k = 1-4; then 6, then 7
    assert [r["applied_edits"][0]["cleared_tool_uses"] for r in reports] == [4, 5, 6]
    for prev, cur in zip(outs, outs[1:]):
        for i, m in enumerate(prev.messages[:-4]):
            assert cur.messages[i] == m  # earlier clears (results and inputs) reproduced as they were
    last = outs[-1].messages
    calls = {c.id: c for m in last if m.role == "assistant" for c in m.tool_calls}
    assert calls["toolu_01"].arguments == "{}" and calls["toolu_07"].arguments == "{}"  # inputs cleared with results
    assert calls["toolu_00"].arguments != "{}" and calls["toolu_08"].arguments != "{}"  # excluded; kept


def test_thinking_clearing_counts_the_tokens_a_template_shows() -> None:
    from .policy_sessions import default_tokenizer

    tokenizer = default_tokenizer(show_reasoning=True)
    hooks = PolicyHooks([], tokenizer, 8192)
    messages = long_session(4)
    for k, m in enumerate(messages):
        if m["role"] == "assistant":
            text = f"Reading module {k} next, since the failing test imports it. " * 6
            m["content"].insert(0, {"type": "thinking", "thinking": text, "signature": "unchecked"})
    edits = {"edits": [{"type": CLEAR_THINKING, "keep": {"type": "thinking_turns", "value": 2}}]}
    turn, out, report = _run(hooks, {"model": "m", "max_tokens": 4, "messages": messages,
                                     "context_management": edits})
    (applied,) = report["applied_edits"]
    assert applied["type"] == CLEAR_THINKING and applied["cleared_thinking_turns"] == 2
    assert applied["cleared_input_tokens"] == len(render_prompt(tokenizer, turn)) - len(render_prompt(tokenizer, out)) > 100
    assert [bool(m.reasoning) for m in out.messages if m.role == "assistant"] == [False, False, True, True]
    _, _, again = _run(hooks, {"model": "m", "max_tokens": 4, "messages": messages,
                               "context_management": {"edits": [{"type": CLEAR_THINKING, "keep": "all"}]}})
    assert again["applied_edits"] == []
