"""Policy arms under forced replay (issue 11): stickiness of context rewrites, the tail
window after an agent's own compaction, and the policy arms on a real public session.

- `sticky=false` makes a sticky rewriter decide afresh on every request: where the
  compact account of a step depends on later messages, its rewritten prefix changes
  from turn n to n+1 (a cache miss); with `sticky=true` it is kept byte for byte.
- The replay window of a session that the agent compacted itself (Claude Code) keeps
  the newest messages of the turn's own context.
- Slow: the policy arms (compaction, masking, with and without stickiness; oracle and
  mistaken jumps) through forced replay on the real default model (the Replayer runs
  them through PolicyHooks exactly as `serve --policy`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from jumpahead.core.options import RequestOptions
from jumpahead.policies.api import RequestContext, SessionState
from jumpahead.policies.compaction import Compaction
from jumpahead.policies.registry import PolicyError, parse_spec
from jumpahead.core.prompt import render_prompt
from jumpahead.core.turn import Message, ToolCall, Turn

from .policy_sessions import SESSIONS, common_prefix, default_tokenizer, load_public

FILLER = ("The repository layout is conventional and the module reads cleanly from top to bottom. "
          "Each section opens with a short comment and a handful of small helpers. ") * 6
LATE = "The helper parse_config_value looks odd."  # kept in the account only once a later message names it


def step_messages(turns: int) -> list[Message]:
    """A session of tool steps. The first step's visible text ends in LATE; the third
    step (present from turns=3 on) names parse_config_value, so the first step's
    account, decided afresh, changes between turn 2 and turn 3."""
    messages = [Message("system", "You are a coding agent."), Message("user", "Tidy the config module.")]
    texts = [FILLER + LATE, "Reading the tests next.", "Now rename parse_config_value in one place."]
    for k in range(turns):
        messages.append(Message("assistant", texts[k], tool_calls=[ToolCall("read_file", f'{{"path": "f{k}.py"}}', f"c{k}")]))
        messages.append(Message("tool", "ok", tool_call_id=f"c{k}"))
    return messages


def rewritten(policy_options: dict[str, str], tokenizer: Any) -> list[tuple[Turn, list[dict[str, Any]]]]:
    """Turns 2 and 3 of step_messages through one Compaction per request (as the
    runtime builds them) sharing one SessionState."""
    state = SessionState("sticky-test")
    out = []
    for n in (2, 3):
        turn = Turn(messages=step_messages(n))
        ctx = RequestContext(turn=turn, session=state, tokenizer=tokenizer, context_length=8192)
        result = Compaction(**policy_options).on_request(ctx)
        out.append((turn if result is None else result, list(ctx.notes)))
    return out


@pytest.mark.parametrize("sticky", ["true", "false"])
def test_sticky_option_keeps_or_loses_the_rewritten_prefix(sticky: str) -> None:
    tokenizer = default_tokenizer()
    options = {"clear_at_least": "16", "min_tokens": "32", "sticky": sticky}
    (first, notes1), (second, notes2) = rewritten(options, tokenizer)
    assert [n.get("decision") for n in notes1] == ["rewritten"]
    old = step_messages(2)[2]
    assert first.messages[2] != old and "[compacted step]" in first.messages[2].content
    assert "parse_config_value" not in first.messages[2].content  # no later message names it yet
    a, b = render_prompt(tokenizer, first), render_prompt(tokenizer, second)
    head = render_prompt(tokenizer, dataclasses.replace(first, messages=first.messages[:3]))
    if sticky == "true":
        assert second.messages[2] == first.messages[2]  # replayed from the memo
        assert notes2[0]["replayed"] == 1
        assert common_prefix(a, b) >= len(a) - 2  # turn n's whole prompt (its generation prompt may merge)
    else:
        assert notes2[0]["sticky"] is False and notes2[0]["replayed"] == 0
        assert [n.get("decision") for n in notes2] == ["rewritten"]
        # decided afresh: the account now keeps LATE, so message 2's bytes changed
        assert LATE in second.messages[2].content and second.messages[2] != first.messages[2]
        assert common_prefix(a, b) < len(head)  # the prefix cache misses inside message 2


def test_sticky_option_is_checked() -> None:
    assert parse_spec("compaction:sticky=false").build().sticky is False
    assert parse_spec("masking").build().sticky is True
    assert parse_spec("thinking-clearing:sticky=0").build().sticky is False
    with pytest.raises(PolicyError, match="sticky"):
        parse_spec("masking:sticky=perhaps").build()


def test_window_after_an_agents_own_compaction() -> None:
    """Claude Code compacted this session itself: a turn's context is the summary plus
    what followed, so window anchors (session indices) map through context_indices."""
    from jumpahead.traces.window import Window, fit

    session = load_public(SESSIONS[1])
    tokenizer = default_tokenizer()
    last = session.assistant_indices()[-1]
    assert len(session.context_indices(last)) < last  # the compaction is there
    window = Window(2048)
    turn, prompt, dropped = fit(session, last, window, tokenizer)
    full = session.turn(last).messages
    assert dropped is not None and 0 < len(turn.messages) < len(full)
    assert turn.messages == full[len(full) - len(turn.messages):]  # the newest messages of its own context
    assert len(prompt) <= 2048 and prompt == render_prompt(tokenizer, turn)


def test_show_reasoning_template_variant() -> None:
    """`replay --show-reasoning`: a copy of the tokenizer whose template writes earlier
    reasoning into the prompt; the served tokenizer is left as it is."""
    from jumpahead.traces.templates import TemplateError, showing_reasoning

    tokenizer = default_tokenizer()
    template = tokenizer._tokenizer.chat_template
    session = load_public(SESSIONS[0])  # mini-swe-agent: every step has reasoning
    index = session.assistant_indices()[3]
    turn = session.turn(index)
    reasoning = next(m.reasoning for m in turn.messages if m.role == "assistant" and m.reasoning)
    shown = showing_reasoning(tokenizer)
    plain_text = tokenizer.decode(render_prompt(tokenizer, turn))
    shown_text = tokenizer.decode(render_prompt(shown, turn))
    assert reasoning.strip()[:80] not in plain_text
    assert f"<think>\n{reasoning.strip()[:80]}" in shown_text.replace("<think>\n\n", "<think>\n")
    assert tokenizer._tokenizer.chat_template == template  # the original is untouched
    assert shown.encode("x y z") == tokenizer.encode("x y z") and shown.eos_token_id == tokenizer.eos_token_id

    class Other:
        chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"

    with pytest.raises(TemplateError, match="embedded default"):
        showing_reasoning(Other())


def test_oracle_jump_supplies_the_records_own_tokens() -> None:
    """An oracle jump that stops inside a value (the rest is not sourced) ends at a token
    boundary of the recording and hands over the recording's own token ids: re-encoding
    the cut text would spell it with other tokens, and forced replay would diverge (seen
    on the public pi session)."""
    import json

    from jumpahead.policies.api import BoundaryEvent
    from jumpahead.policies.jump import OracleJump
    from jumpahead.core.turn import Tool

    tokenizer = default_tokenizer()
    bash = Tool("bash", "Run a command", {"type": "object", "properties": {"command": {"type": "string"}},
                                          "required": ["command"]})
    known = "cd /repo && python -m pytest tests/test_fields.py"
    call = json.dumps({"name": "bash", "arguments": {"command": known + "x -q -k zqvnovelname"}})
    recorded = f"<tool_call>\n{call}\n</tool_call>"
    turn = Turn(messages=[Message("user", f"Run `{known}` please.")], tools=[bash],
                options=RequestOptions(oracle_output=recorded))
    policy = OracleJump()
    policy.on_request(RequestContext(turn=turn, session=SessionState("s"), tokenizer=tokenizer, context_length=8192))
    ids = tokenizer.encode(recorded, add_special_tokens=False)
    n = next(k for k in range(len(ids)) if '"bash"' in tokenizer.decode(ids[:k]))  # just after the tool name
    out = tokenizer.decode(ids[:n])
    context = tokenizer.decode(render_prompt(tokenizer, turn))
    event = BoundaryEvent("tool_name", out, ids[:n], "", "", context, tool_name="bash",
                          call_text=out[len("<tool_call>"):])
    iv = policy.on_tool_name(event)
    assert iv is not None and iv.tokens, "the known command prefix is sourced"
    assert list(iv.tokens) == ids[n:n + len(iv.tokens)]  # the recording's own tokens
    assert recorded.startswith(out + iv.text) and known in out + iv.text
    assert "zqvnovelname" not in iv.text  # never past the sourced content
    # the same jump point without the output's token ids falls back to the text
    plain = policy.on_tool_name(dataclasses.replace(event, output_tokens=[]))
    assert plain is not None and plain.tokens is None and plain.text.startswith(iv.text)


@pytest.mark.slow
@pytest.mark.timeout(2400)  # ~3 min on a quiet machine; a busy shared one takes several times that
def test_policy_arms_in_forced_replay(loaded_model) -> None:
    """The policy arms through forced replay on the last two turns of the public
    mini-swe-agent session (under the template that shows earlier reasoning, where
    reasoning compaction has something to remove; the served template drops it)."""
    from jumpahead.traces.arms import parse_arms
    from jumpahead.traces.replay import ReplayOptions, replay
    from jumpahead.traces.templates import showing_reasoning

    session = load_public(SESSIONS[0])
    model, tokenizer, info = loaded_model
    names = ["compaction:clear_at_least=128", "compaction:clear_at_least=128,sticky=false", "oracle-jump",
             "mistaken-jump:rate=1,seed=1,base=oracle"]
    arms = parse_arms(names)
    doc = replay([session], ReplayOptions(arms, turns=2, max_context=2048, max_output_tokens=200),
                 (model, showing_reasoning(tokenizer), info))
    assert doc["warnings"] == []
    (report,) = doc["sessions"]
    turns = report["turns"]
    assert len(turns) == 2 and turns[0]["index"] < turns[1]["index"]
    sticky, loose, oracle, mistaken = names
    for t in turns:
        ordinary = t["arms"]["ordinary"]
        assert ordinary["prompt_tokens"] == t["prompt_tokens"]  # no policy: the planned prompt
        for name in ("ordinary", sticky, loose, oracle):  # rewrites and oracle jumps keep the record
            arm = t["arms"][name]
            assert arm["identical"] is True and arm["diverged"] is False, (name, t["index"])
            assert sum(arm["tokens_by_kind"].values()) == t["output_tokens"]
    # compaction shrinks the prompt on some turn (and never grows it)
    assert all(t["arms"][sticky]["prompt_tokens"] <= t["prompt_tokens"] for t in turns)
    assert any(t["arms"][sticky]["prompt_tokens"] < t["prompt_tokens"] for t in turns)
    # the oracle supplies correct tokens: D > 0, the output is the record
    supplied = [i for t in turns for i in t["arms"][oracle]["interventions"] if i["kind"] == "jump"]
    assert supplied and all(i["tokens"] > 0 and i["D_s"] > 0 and not i.get("wrong") for i in supplied)
    assert sum(i["tokens"] for i in supplied) == sum(t["arms"][oracle]["tokens_by_kind"].get("jump", 0) for t in turns)
    # every mistaken jump is perturbed where a perturbation applies (rate=1): the turn
    # diverges inside the jump and pays R; an unperturbed one keeps the record
    perturbed_turns = 0
    for t in turns:
        arm = t["arms"][mistaken]
        jumps = [i for i in arm["interventions"] if i["kind"] == "jump"]
        labels = [p.get("label", "") for p in arm.get("policy_interventions", []) if p.get("policy") == "mistaken-jump"]
        perturbed = [x for x in labels if x.startswith("mistaken ") and not x.startswith("mistaken none")]
        if not perturbed:
            assert arm["identical"] is True, (t["index"], labels)
            continue
        perturbed_turns += 1
        assert jumps and any(k in perturbed[0] for k in ("wrong_path", "truncated", "wrong_file"))
        assert arm["diverged"] is True and arm["identical"] is False
        wrong = [i for i in jumps if i.get("wrong")]
        assert len(wrong) == 1 and wrong[0]["at"] <= arm["diverged_at"] < wrong[0]["at"] + wrong[0]["tokens"]
        assert arm["rest_s"] > 0 and arm["model_s"] == pytest.approx(arm["measured_model_s"] + arm["rest_s"], abs=1e-5)
        assert "R_s" not in arm  # forced replay cannot observe recovery
    assert perturbed_turns >= 1
    # session totals: prompt tokens after policies and the cache hit rate
    totals = report["totals"]
    for name, total in totals.items():
        assert total["prompt_tokens"] == sum(t["arms"][name]["prompt_tokens"] for t in turns)
        assert total["cache_hit_rate"] == pytest.approx(total["cached_tokens"] / total["prompt_tokens"], abs=1e-4)
    assert totals[sticky]["prompt_tokens"] < totals["ordinary"]["prompt_tokens"]
    assert totals[sticky]["cache_hit_rate"] >= totals[loose]["cache_hit_rate"]
