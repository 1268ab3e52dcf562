"""`fit`: prompts over the window shrink, cheapest step first, the same way each turn.

The captured Claude Code request (~20k tokens under the default model's template)
goes through `Fit.on_request` with the real tokenizer, and through the real server
(`jumpahead serve` as a subprocess) on the embedded default model, where fit is on by
default: a 200 answer whose usage says fit was applied; with `--no-fit` or a user
model path the same request gets 400 context_length_exceeded. A long public session
runs turn after turn under an 8k window: every prompt fits, no tool call is split from
its result, and consecutive prompts keep sharing a prefix (the cut is sticky).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from jumpahead.policies.api import RequestContext, SessionState
from jumpahead.policies.fit import STEPS, Fit, reserve_for, shorten_tool
from jumpahead.core.prompt import render_prompt
from jumpahead.core.turn import Message, Tool, Turn

from .policy_sessions import SESSIONS, SHARED, common_prefix, default_tokenizer, load_public, snapshot
from .serving import start_serve

CLAUDE_CODE = SHARED / "fixtures" / "clients" / "claude-code" / "001_POST_v1_messages.json"


def claude_code_body() -> dict[str, Any]:
    if not CLAUDE_CODE.exists():
        pytest.skip(f"{CLAUDE_CODE} is absent: this test reads the captured Claude Code request from ../shared")
    return json.loads(CLAUDE_CODE.read_text())["body"]


def test_claude_code_request_fits_the_default_window() -> None:
    from jumpahead.proxy.anthropic_messages import parse_messages_request

    tokenizer = default_tokenizer()
    turn = parse_messages_request(claude_code_body())
    before = snapshot(turn)
    size = len(render_prompt(tokenizer, turn))
    state = SessionState("cc")
    ctx = RequestContext(turn=turn, session=state, tokenizer=tokenizer, context_length=8192)
    out = Fit().on_request(ctx)
    assert turn == before, "fit mutated its input"
    note = ctx.notes[0]
    limit = 8192 - reserve_for(turn, 8192)
    assert out is not None and note["fitted"] and note["tokens_before"] == size > 8192
    assert len(render_prompt(tokenizer, out)) == note["tokens_after"] <= limit
    # the cheapest steps that suffice: this request has no history to mask or cut
    assert note["steps"] == ["short-tools", "bare-tools"]
    assert out.messages == turn.messages
    for old, new in zip(turn.tools, out.tools):  # names and parameter schemas kept
        assert new.name == old.name and len(new.description) <= 80
        assert (new.parameters or {}).get("properties", {}).keys() == (old.parameters or {}).get("properties", {}).keys()
        assert (new.parameters or {}).get("required") == (old.parameters or {}).get("required")
    # sticky: the same request again gets the same prompt, byte for byte
    again = RequestContext(turn=parse_messages_request(claude_code_body()), session=state, tokenizer=tokenizer,
                           context_length=8192)
    assert Fit().on_request(again) == out
    print(f"\nClaude Code request: {size} -> {note['tokens_after']} prompt tokens (limit {limit}) by {note['steps']}")


def test_a_prompt_that_fits_is_left_alone() -> None:
    tokenizer = default_tokenizer()
    turn = Turn(messages=[Message("user", "hello")], tools=[Tool("f", "A tool. " * 20, {"type": "object"})])
    ctx = RequestContext(turn=turn, session=SessionState("s"), tokenizer=tokenizer, context_length=8192)
    assert Fit().on_request(ctx) is None and ctx.notes == []


def test_shorten_tool_keeps_name_and_schema_shape() -> None:
    tool = Tool("Edit", "Edit a file. Replaces text exactly. " * 10,
                {"$schema": "x", "type": "object", "properties": {"path": {"type": "string", "description": "p" * 300}},
                 "required": ["path"]})
    short = shorten_tool(tool, bare=False)
    assert short.description == "Edit a file." and len(short.parameters["properties"]["path"]["description"]) <= 100
    bare = shorten_tool(tool, bare=True)
    assert bare.parameters == {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    assert tool.parameters["properties"]["path"]["description"] == "p" * 300  # the original is untouched


def test_reserve_is_capped() -> None:
    assert reserve_for(Turn(messages=[], max_tokens=32000), 8192) == 1024
    assert reserve_for(Turn(messages=[], max_tokens=None), 8192) == 1024
    assert reserve_for(Turn(messages=[], max_tokens=3000), 65536) == 3000
    assert reserve_for(Turn(messages=[]), 8192, 500) == 500


@pytest.mark.parametrize("name", SESSIONS[:3])
def test_long_session_fits_turn_after_turn_with_a_sticky_cut(name: str) -> None:
    """24 consecutive turns of a long public session under the 8k window (far over it)."""
    session = load_public(name)
    tokenizer = default_tokenizer()
    turns = [i for i in session.assistant_indices() if len(session.context_indices(i)) > 10][:24]
    state = SessionState(session.id)
    previous: list[int] | None = None
    shared, cuts, fitted, prefilled, total = [], 0, 0, 0, 0
    for i in turns:
        turn = session.turn(i)
        ctx = RequestContext(turn=turn, session=state, tokenizer=tokenizer, context_length=8192)
        out = Fit().on_request(ctx) or turn
        note = ctx.notes[0] if ctx.notes else None
        ids = render_prompt(tokenizer, out)
        if note is None:
            assert len(ids) <= 8192 - reserve_for(turn, 8192)
        else:
            assert note["fitted"], note
            assert len(ids) == note["tokens_after"] <= note["limit"]
            fitted += 1
        # the head (system, first user message) and the pending instruction kept
        first_user = next(m for m in turn.messages if m.role == "user")
        if note is None or "clip-head" not in note["steps"]:
            assert first_user in out.messages
        if note is None or "clip-last" not in note["steps"]:
            assert out.messages[-1] == turn.messages[-1]
        # no tool call without its result, no result without its call
        open_calls: set[str] = set()
        for m in out.messages:
            if m.role == "assistant":
                assert not open_calls, "a tool call lost its result"
                open_calls = {c.id for c in m.tool_calls}
            elif m.role == "tool":
                assert m.tool_call_id in open_calls, "a tool result without its call"
                open_calls.discard(m.tool_call_id)
        if note is not None and "cut-middle" in note["steps"]:
            omitted = next(m for m in out.messages if m.content and "earlier messages omitted" in m.content)
            assert omitted.content.startswith(f"[{note['omitted_messages']} earlier messages omitted")
        if previous is not None:
            common = common_prefix(previous, ids)
            shared.append(common / len(previous))
            cuts += shared[-1] < 0.5
            prefilled += len(ids) - common  # what a prefix cache holding the previous prompt leaves to prefill
            total += len(ids)
        previous = ids
    print(f"\n{name}: {len(turns)} turns, {fitted} shrunk by fit; prompts share "
          f"{sum(shared) / len(shared):.0%} of the previous prompt on average; {cuts} large prefix breaks; "
          f"{prefilled} of {total} prompt tokens left to prefill after the previous prompt ({prefilled / total:.0%})")
    assert fitted > 0
    # sticky: most of each prompt is the previous prompt's prefix (a cut that moved
    # every turn would leave nearly all of it to prefill)
    assert prefilled < 0.5 * total


def test_the_cut_moves_in_whole_blocks_and_a_restart_places_it_again() -> None:
    """A history that only grows (short assistant and user messages, nothing to mask)
    under a 1k limit: each prompt extends the one before except where the cut moves, the
    cut moves at most once per block of growth (a third of the room the head leaves) and
    by a block at a time, and a fresh session (a restarted server, no memo) gives every
    turn the very prompt the running session gave it."""
    tokenizer = default_tokenizer()
    messages = [Message("system", "You are a careful coding agent. Keep answers short. " * 12),
                Message("user", "Fix the failing test in the parser module.")]
    state = SessionState("grow")
    previous: list[int] | None = None
    moves, sizes, omitted = 0, [], []
    for n in range(60):
        messages = [*messages, Message("assistant", f"Step {n}: I looked at parser line {10 * n} and changed it."),
                    Message("user", f"Now run the tests again (round {n}).")]
        turn = Turn(messages=list(messages))
        ctx = RequestContext(turn=turn, session=state, tokenizer=tokenizer, context_length=2048)
        out = Fit().on_request(ctx) or turn
        ids = render_prompt(tokenizer, out)
        limit = 2048 - reserve_for(turn, 2048)
        assert len(ids) <= limit and out.messages[-1] == messages[-1] and out.messages[:2] == messages[:2]
        fresh = RequestContext(turn=Turn(messages=list(messages)), session=SessionState("restarted"),
                               tokenizer=tokenizer, context_length=2048)
        assert render_prompt(tokenizer, Fit().on_request(fresh) or turn) == ids, f"turn {n}: a restart cuts elsewhere"
        note = ctx.notes[0] if ctx.notes else {}
        omitted.append(note.get("omitted_messages", 0))
        if previous is not None and ids[:len(previous)] != previous:
            moves += 1
            assert omitted[-1] > omitted[-2], "the prefix broke without the cut moving"
        previous = ids
        sizes.append(len(render_prompt(tokenizer, turn)))
    head = len(render_prompt(tokenizer, Turn(messages=messages[:2])))
    block = (limit - head) // 3
    assert omitted[-1] > 0 and 1 <= moves <= (sizes[-1] - limit) // block + 2, (moves, omitted)
    steps = [b - a for a, b in zip(omitted, omitted[1:]) if b != a]
    assert min(steps[1:]) >= 6, steps  # a block of these ~25-token messages at least, never one message a turn
    print(f"\n60 growing turns: {moves} cut moves, omitted messages {sorted(set(omitted))}")


def test_steps_are_in_cost_order() -> None:
    assert STEPS == ("mask", "clear-thinking", "short-tools", "bare-tools", "cut-middle", "clip", "clip-head", "clip-last")


# --- the real server on the embedded default model --------------------------------------

def test_fit_is_on_for_the_embedded_model_only(tmp_path: Path) -> None:
    """`jumpahead serve` with no --model runs fit; with --no-fit or a user model path
    it does not, and the Claude Code request gets 400 (the prompt is over the window)."""
    from jumpahead.engine.model.default_model import ensure_default_model

    body = claude_code_body()
    body.update(stream=False, max_tokens=4)
    model_path = str(ensure_default_model(progress=lambda s: None))
    servers = {"default": start_serve([], tmp_path), "no-fit": start_serve(["--no-fit"], tmp_path),
               "user-model": start_serve(["--model", model_path], tmp_path)}
    try:
        urls = {k: server.wait_healthy(240) for k, server in servers.items()}
        policies = {k: httpx.get(f"{u}/health", timeout=10).json().get("policies") for k, u in urls.items()}
        assert policies == {"default": ["fit"], "no-fit": [], "user-model": []}, policies
        for kind in ("no-fit", "user-model"):
            r = httpx.post(f"{urls[kind]}/v1/messages", json=body, timeout=120)
            assert r.status_code == 400, (kind, r.text[:300])
            error = r.json()["error"]  # the Anthropic shape has no code field: the message says it
            assert error["type"] == "invalid_request_error" and "context is 8192 tokens" in error["message"], error
    finally:
        for server in servers.values():
            server.stop(timeout=30)


@pytest.mark.slow  # a ~6k-token prefill on CPU: minutes on a shared 2-core machine
def test_claude_code_request_answered_on_the_default_server(tmp_path: Path) -> None:
    """The captured Claude Code request (~20k tokens) gets a 200 answer from the default
    server through the Anthropic SDK, not streamed and streamed (as Claude Code sends
    it: the stream carries every event through message_stop); its usage says what fit
    did."""
    anthropic = pytest.importorskip("anthropic")
    body = claude_code_body()
    server = start_serve([], tmp_path)
    try:
        url = server.wait_healthy(240)
        client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=1200)
        extra = {k: v for k, v in body.items() if k not in ("model", "messages", "system", "tools", "max_tokens",
                                                             "stream", "metadata")}
        t0 = time.monotonic()
        answer = client.messages.create(model=body["model"], messages=body["messages"], system=body["system"],
                                        tools=body["tools"], max_tokens=4, metadata=body.get("metadata"),
                                        extra_body=extra)
        elapsed = time.monotonic() - t0
        usage = answer.model_dump()["usage"]
        fit = next(i for i in usage["report"]["policies"]["interventions"] if i["policy"] == "fit")
        assert fit["fitted"] and fit["tokens_before"] > 8192 and fit["tokens_after"] <= fit["limit"]
        assert usage["input_tokens"] + usage["cache_read_input_tokens"] == fit["tokens_after"]
        assert answer.role == "assistant" and answer.stop_reason in ("end_turn", "max_tokens", "tool_use"), answer
        print(f"\nClaude Code request on the default server: {fit['tokens_before']} -> {fit['tokens_after']} "
              f"prompt tokens by {fit['steps']}, answered in {elapsed:.1f}s")
        # streamed, as Claude Code sends it (the same session: fit cuts the same way, the
        # prompt comes from the prefix cache)
        assert body.get("stream") is True
        with client.messages.stream(model=body["model"], messages=body["messages"], system=body["system"],
                                    tools=body["tools"], max_tokens=4, metadata=body.get("metadata"),
                                    extra_body=extra) as stream:
            events = [event.type for event in stream]
            streamed = stream.get_final_message()
        assert events[0] == "message_start" and events[-1] == "message_stop", events
        assert "message_delta" in events, events
        assert streamed.role == "assistant" and streamed.stop_reason in ("end_turn", "max_tokens", "tool_use")
        assert streamed.content, streamed
        usage = streamed.model_dump()["usage"]
        assert usage["output_tokens"] >= 1
        assert usage["input_tokens"] + (usage.get("cache_read_input_tokens") or 0) == fit["tokens_after"], usage
    finally:
        server.stop(timeout=30)
