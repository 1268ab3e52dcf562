"""The throughput objective's forecast of who finishes last (engine/schedule/forecast.py) and the
session lengths the proxy reads off the history (core/turn_lengths.py).

Real rows of the real engine on the default model: the row forecast to finish last is
the one that verifies its copies in a shared batch, whichever way the forecast points,
and every arm's output equals ordinary decoding token for token.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from jumpahead.bench.echo import CONFIG as ECHO_CONFIG, chat_prompt
from jumpahead.engine.schedule.forecast import from_lengths, note_copy, remaining
from jumpahead.engine.types import GenerationRequest
from jumpahead.core.turn import Message, ToolCall, Turn
from jumpahead.core.turn_lengths import CALL_MARKUP, recent_turn_lengths

# The echo bench's config.yaml less its `echo_queries` and `format` lines: the file
# this test's batches were tuned on.
CONFIG = "".join(line for line in ECHO_CONFIG.splitlines(keepends=True)
                 if not line.lstrip().startswith(("echo_queries:", "format:")))


def test_from_lengths_is_the_conditional_median_remainder() -> None:
    assert from_lengths([100, 300, 50], 0) == 100  # median of the lengths themselves
    assert from_lengths([100, 300, 50], 60) == 140  # turns longer than 60: 40 and 240 to go
    assert from_lengths([100, 300, 50], 120) == 180
    assert from_lengths([100, 300, 50], 400) == 200  # past every recent turn: half again
    assert from_lengths([5], 0) == 5 and from_lengths([5], 1) == 4


def test_remaining_and_copy_tracking_on_real_rows(engine) -> None:
    tok = engine.tokenizer
    prompt = tok.apply_chat_template([
        {"role": "user", "content": "Show config.yaml"},
        {"role": "assistant", "content": "Here it is."},
        {"role": "user", "content": CONFIG},
    ], add_generation_prompt=True)
    plain = engine._make_row(GenerationRequest(prompt=prompt, max_tokens=500), lambda c: None)
    assert remaining(plain) == 500  # no lengths: the budget, as before forecasts
    row = engine._make_row(GenerationRequest(prompt=prompt, max_tokens=500, recent_lengths=[40, 90, 400]), lambda c: None)
    assert remaining(row) == 90
    row.output = [tok.encode("x")[0]] * 100
    assert remaining(row) == 300 and remaining(plain) == 500
    # a copy of the config's first line, accepted: the row is forecast at least the
    # rest of that message (up to its end-of-message token in the prompt)
    row.output = []
    start = next(i for i in range(len(prompt)) if tok.decode(prompt[i:i + 3]).startswith("server"))
    end = next(i for i in range(start, len(prompt)) if prompt[i] in row.stop_ids)
    note_copy(row, start, 6)
    assert row.copy_end == 6 + (end - (start + 6)) + 1
    assert remaining(row) == max(90, row.copy_end)
    note_copy(row, start, 0)  # nothing accepted: the copy is over
    assert row.copy_end is None and remaining(row) == 90


def test_recent_turn_lengths_from_the_history(engine) -> None:
    tok = engine.tokenizer
    call = ToolCall("write", '{"path": "a.txt", "content": "hello world"}')
    turn = Turn(messages=[
        Message("user", "hi"),
        Message("assistant", "Hello! How can I help?"),
        Message("user", "write a file"),
        Message("assistant", None, reasoning="I will write it.", tool_calls=[call]),
        Message("tool", "ok", tool_call_id=call.id),
    ])
    first = len(tok.encode("Hello! How can I help?", add_special_tokens=False)) + 1
    second = len(tok.encode("I will write it." + call.name + call.arguments, add_special_tokens=False)) + CALL_MARKUP + 1
    assert recent_turn_lengths(tok, turn) == [first, second]
    assert recent_turn_lengths(tok, turn, last=1) == [second]
    assert recent_turn_lengths(tok, Turn(messages=[Message("user", "hi")])) == []
    # an assistant prefix the answer continues is not a finished turn
    cont = Turn(messages=[*turn.messages, Message("assistant", "Partial")], continue_final=True)
    assert recent_turn_lengths(tok, cont) == [first, second]


def _batch(engine: Any, requests: list[GenerationRequest]) -> list[dict[str, Any]]:
    async def one(req: GenerationRequest) -> dict[str, Any]:
        tokens: list[int] = []
        fill = None
        async for chunk in engine.stream(req):
            tokens += chunk.tokens
            if chunk.finish_reason is not None:
                fill = chunk.fill
        return {"tokens": tokens, "fill": fill}

    async def go() -> list[dict[str, Any]]:
        return await asyncio.gather(*[one(r) for r in requests])

    return asyncio.run(go())


def test_the_row_forecast_last_verifies_in_a_shared_batch(engine) -> None:
    """Two rows share a batch, nothing waits (throughput objective): only the row the
    batch is forecast to wait on verifies its copies. The copy row verifies when its
    session's turns are long and its neighbour's short, and not the other way round;
    outputs equal ordinary decoding in every arm."""
    if engine.scheduler.config.objective != "throughput":
        pytest.skip("the test engine does not run the throughput objective")
    tok = engine.tokenizer
    copy = chat_prompt(tok, f"Here is config.yaml:\n```yaml\n{CONFIG}```\nSet the port to 9090. Show the whole updated file.")
    plain = chat_prompt(tok, "Write a long essay about the history of the printing press.")

    def run(methods: list[str], copy_lengths: list[int], plain_lengths: list[int]) -> list[dict[str, Any]]:
        # The plain row is submitted first and has the larger budget: the copy row joins
        # it and never decodes alone (a row alone always verifies), and under long
        # plain lengths the plain row's forecast (its budget left) stays above the copy
        # row's whatever either has written.
        plain_row, copy_row = _batch(engine, [
            GenerationRequest(prompt=plain, max_tokens=48, methods=methods, recent_lengths=plain_lengths),
            GenerationRequest(prompt=copy, max_tokens=32, methods=methods, recent_lengths=copy_lengths),
        ])
        return [copy_row, plain_row]

    base = run(["none"], [], [])
    copy_last = run(["echo"], [400, 500], [8, 12])
    plain_last = run(["echo"], [8, 12], [400, 500])
    for arm in (copy_last, plain_last):
        assert [r["tokens"] for r in arm] == [r["tokens"] for r in base]
    verified = [arm[0]["fill"].get("verified", {}).get("proposed", 0) for arm in (copy_last, plain_last)]
    echoed = [arm[0]["fill"]["tokens"].get("echo", 0) for arm in (copy_last, plain_last)]
    assert echoed[0] > 0 and verified[0] > 0, copy_last[0]["fill"]
    assert verified[1] == 0 and echoed[1] == 0, plain_last[0]["fill"]
