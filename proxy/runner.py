"""Run a Turn on the engine: render the prompt, stream tokens, parse them into events.

Every protocol adapter goes through here, so the three protocols share one path from
Turn to OutputEvents.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from jumpahead.engine.types import EngineError, GenerationRequest

from .errors import invalid_request
from .output_parser import OutputParser
from .prompt import continues_final_message, prompt_opens_reasoning, render_prompt
from .turn import OutputEvent, Turn, TurnEnd, TurnFinish, TurnOutput, Usage


@dataclass
class PreparedTurn:
    """A Turn ready to run: the engine request and the parser for its output."""

    turn: Turn
    request: GenerationRequest
    parser: OutputParser


def prepare_turn(engine: Any, turn: Turn) -> PreparedTurn:
    """Render and validate. Raises APIError(400) for a Turn the model cannot run."""
    tokenizer = engine.tokenizer
    prompt = render_prompt(tokenizer, turn)
    max_tokens = turn.max_tokens if turn.max_tokens is not None else engine.context_length
    request = GenerationRequest(prompt=prompt, sampling=turn.sampling, max_tokens=max_tokens, stop=list(turn.stop))
    try:
        engine.validate(request)
    except EngineError as exc:
        raise invalid_request(str(exc), code="context_length_exceeded" if "context" in str(exc) else None) from exc
    parser = OutputParser.for_tokenizer(
        tokenizer,
        turn.tools if turn.tools_enabled else None,
        in_reasoning=prompt_opens_reasoning(tokenizer, prompt),
    )
    if continues_final_message(turn):
        # The output continues the last assistant message: parse it as if generated
        # (a tool call it opens completes in the output), but do not send it again.
        parser.feed(turn.messages[-1].content or "")
    return PreparedTurn(turn, request, parser)


async def prepare_turn_async(engine: Any, turn: Turn) -> PreparedTurn:
    """`prepare_turn` off the event loop (templates and tokenizing 100 KB take time)."""
    return await asyncio.to_thread(prepare_turn, engine, turn)


def _finish_reason(engine_reason: str | None, tool_calls: int) -> TurnFinish:
    if engine_reason == "stop" and tool_calls:
        return "tool_calls"
    if engine_reason in ("stop", "length", "cancelled"):
        return engine_reason  # type: ignore[return-value]
    return "error"


async def stream_turn(engine: Any, prepared: PreparedTurn, stats: Counter[str] | None = None) -> AsyncIterator[OutputEvent]:
    """The Turn's output as events; the last one is always a TurnEnd.

    Closing this generator early (client gone) cancels the engine row.
    """
    parser = prepared.parser
    usage = Usage(prompt_tokens=len(prepared.request.prompt))
    reason: str | None = None
    error: str | None = None
    try:
        async with contextlib.aclosing(engine.stream(prepared.request)) as chunks:
            async for chunk in chunks:
                if chunk.text:
                    for event in parser.feed(chunk.text):
                        yield event
                if chunk.finish_reason is not None:
                    reason, error = chunk.finish_reason, chunk.error
                    usage = Usage(chunk.prompt_tokens or usage.prompt_tokens, chunk.completion_tokens)
    except EngineError as exc:
        reason, error = "error", str(exc)
    for event in parser.finish():
        yield event
    finish = _finish_reason(reason, len(parser.tool_calls))
    if finish == "error" and error is None:
        error = "generation ended without a finish reason"
    if stats is not None:
        stats[f"finish_{finish}"] += 1
        stats["tool_calls"] += len(parser.tool_calls)
        stats["tool_calls_malformed"] += len(parser.malformed)
        stats["tool_calls_with_issues"] += sum(1 for c in parser.tool_calls if c.issues)
        stats["completion_tokens"] += usage.completion_tokens
        stats["prompt_tokens"] += usage.prompt_tokens
    yield TurnEnd(finish, usage, error)


async def complete_turn(engine: Any, prepared: PreparedTurn, stats: Counter[str] | None = None) -> TurnOutput:
    """Run the Turn to the end and collect its output."""
    out = TurnOutput()
    async with contextlib.aclosing(stream_turn(engine, prepared, stats)) as events:
        async for event in events:
            out.add(event)
    return out

