"""Run a Turn on the engine: render the prompt, stream tokens, parse them into events.

Every wire protocol goes through here, so the three protocols share one path from
Turn to OutputEvents.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from jumpahead.engine.interface import Engine
from jumpahead.engine.strict.tool_formats import detect_family
from jumpahead.engine.types import EngineError, GenerationRequest

from .errors import invalid_request
from .exchange import Exchange
from .logprobs import ContentLogprobs, TokenText
from .output_parser import OutputParser
from .prompt import continues_final_message, prompt_opens_reasoning, render_prompt
from .turn import OutputEvent, ToolCallArgs, ToolCallStart, Turn, TurnEnd, TurnFinish, TurnOutput, Usage
from .turn_lengths import recent_turn_lengths

log = logging.getLogger(__name__)
_TAIL = 32  # output tokens kept to tell which stop string ended a turn


@dataclass
class PreparedTurn:
    """A Turn ready to run: the engine request and the parser for its output."""

    turn: Turn
    request: GenerationRequest
    parser: OutputParser
    # Set by a hook that took the row's output (take_output, core/exchange.py): script
    # mode's ScriptedProposer (the turn's continuation) and which script turn (0-based).
    scripted: Any = None
    script_turn: int | None = None
    exchange: Exchange | None = None  # the HTTP exchange (session, protocol, headers)
    hooks: list[Any] = field(default_factory=list)  # app.state.hooks (core/exchange.py)
    # What the row emitted, token by token: ids, provenance kinds, copy sources (filled
    # by stream_turn; the recorder and replay read it).
    output_tokens: list[int] = field(default_factory=list)
    output_kinds: list[str] = field(default_factory=list)
    output_sources: list[Any] = field(default_factory=list)
    timings: Any = None  # the engine's Timings of the row (last chunk)
    # (perf_counter, tokens, proposal tokens its round carried) per chunk
    chunk_times: list[tuple[float, int, int]] = field(default_factory=list)
    # A continued assistant prefix that opened a tool call: its start and argument
    # deltas, sent first so a streamed call is whole (the prefix's text is not resent).
    prefix_events: list[OutputEvent] = field(default_factory=list)
    in_reasoning: bool = False  # the prompt opens a reasoning block: the output starts inside it
    cached_tokens: int = 0  # prompt tokens the engine took from the prefix cache (known from the first chunk)
    # Asked for logprobs: attributes them to content (made while preparing, off the event
    # loop: the first use builds the tokenizer's byte table).
    content_logprobs: ContentLogprobs | None = None


def validate_request(engine: Engine, request: GenerationRequest) -> None:
    """The engine's check of a request, as the client's error (400; context overflow coded)."""
    try:
        engine.validate(request)
    except EngineError as exc:
        raise invalid_request(str(exc), code="context_length_exceeded" if "context" in str(exc) else None) from exc


def prepare_turn(engine: Engine, turn: Turn, exchange: Exchange | None = None,
                 hooks: list[Any] | None = None) -> PreparedTurn:
    """Render and validate. Raises APIError(400) for a Turn the model cannot run.

    `hooks` (core/exchange.py) may rewrite the Turn before rendering, take the row's
    whole output (script mode) and add proposers to the row.
    """
    hooks = list(hooks or [])
    client_turn = turn
    if exchange is None and hooks:  # hooks keep per-exchange state: give them one (replay, scripts)
        exchange = Exchange(protocol="internal")
    if exchange is not None:
        exchange.original_turn = turn
    for hook in hooks:
        turn = hook.before_render(exchange, turn)
    if exchange is not None:
        exchange.turn = turn
    prepared = _prepare(engine, turn)
    prepared.request.turn = turn  # the Turn after policies: what an upstream engine sends on
    prepared.request.session_id = exchange.session_id if exchange is not None else ""
    prepared.exchange = exchange
    prepared.hooks = hooks
    # The first hook that takes the output sets the row's prompt and proposers and
    # validates them itself (script mode consumes its turn only for a valid request).
    taken = any(_takes_output(hook, engine, exchange, prepared) for hook in hooks)
    if not taken:
        tools = turn.tools if turn.tools_enabled else None
        prepared.request.grammar, prepared.request.tools = strict_fill_fields(engine.tokenizer, turn, tools,
                                                                              prepared.in_reasoning)
        validate_request(engine, prepared.request)
    prepared.content_logprobs = _content_logprobs(engine, prepared.request)
    # The model's recent answers in this session, as the client resent them: the
    # throughput objective forecasts who finishes last from them (engine/schedule/forecast.py).
    prepared.request.recent_lengths = recent_turn_lengths(engine.tokenizer, client_turn)
    extra = [p for hook in hooks for p in hook.row_proposers(exchange, prepared)]
    if extra:  # a taken output's own proposer stays first: it is the row's continuation
        prepared.request.proposers = [*prepared.request.proposers, *extra] if taken \
            else [*extra, *prepared.request.proposers]
    return prepared


def _takes_output(hook: Any, engine: Engine, exchange: Exchange | None, prepared: PreparedTurn) -> bool:
    take = getattr(hook, "take_output", None)  # optional: hooks written before it lack it
    return bool(take is not None and take(engine, exchange, prepared))


def _prepare(engine: Engine, turn: Turn) -> PreparedTurn:
    tokenizer = engine.tokenizer
    prompt = render_prompt(tokenizer, turn)
    max_tokens = turn.max_tokens if turn.max_tokens is not None else engine.context_length
    request = GenerationRequest(prompt=prompt, sampling=turn.sampling, max_tokens=max_tokens, stop=list(turn.stop),
                                methods=list(turn.options.methods), logprobs=turn.logprobs)
    tools = turn.tools if turn.tools_enabled else None
    in_reasoning = prompt_opens_reasoning(tokenizer, prompt)
    # parallel_tool_calls false: at most one call (under tool_choice required/named the
    # grammar already allows one; under auto the parser ends the turn after the first)
    max_calls = 1 if tools and turn.parallel_tool_calls is False else None
    parser = OutputParser.for_tokenizer(tokenizer, tools, in_reasoning=in_reasoning, max_calls=max_calls)
    prefix_events: list[OutputEvent] = []
    if continues_final_message(turn):
        # The output continues the last assistant message: parse it as if generated
        # (a tool call it opens completes in the output), but do not send its text again.
        prefix_events = [e for e in parser.feed(turn.messages[-1].content or "")
                         if isinstance(e, (ToolCallStart, ToolCallArgs))]
    return PreparedTurn(turn, request, parser, prefix_events=prefix_events, in_reasoning=in_reasoning)


def strict_fill_fields(tokenizer: Any, turn: Turn, tools: list | None, in_reasoning: bool) -> tuple[dict | None, list[dict] | None]:
    """GenerationRequest.grammar and .tools for strict fill (engine/strict/fill.py).

    tool_choice required / a named function constrains the answer to tool calls in the
    format of the template's family (engine/strict/tool_formats/): one call, one or more
    with `parallel_tool_calls: true` (not for a named function), exactly
    `jumpahead.tool_calls` where given. A JSON response format constrains it to JSON.
    Neither applies when the answer continues an assistant prefix or starts inside
    reasoning (the grammar would cover the wrong text).
    """
    tool_dicts = [tool.as_openai() for tool in tools] if tools else None
    if continues_final_message(turn) or in_reasoning:
        return None, tool_dicts
    grammar = None
    mode = turn.tool_choice.mode
    family = detect_family(tokenizer) if tool_dicts and mode in ("required", "function") else None
    if family is not None:
        grammar = {"type": "tool_calls", "family": family.name, "tools": tool_dicts,
                   # one call unless the client asks for more: a weak model allowed "one or
                   # more" keeps adding calls (OpenAI's default is true; agents use auto)
                   "parallel": turn.parallel_tool_calls is True}
        if mode == "function" and turn.tool_choice.name:
            grammar["name"] = turn.tool_choice.name
        if turn.options.tool_calls is not None:
            grammar["count"] = turn.options.tool_calls
    elif turn.response_format is not None:
        grammar = turn.response_format.grammar()
    return grammar, tool_dicts


async def prepare_turn_async(engine: Engine, turn: Turn, exchange: Exchange | None = None,
                             hooks: list[Any] | None = None) -> PreparedTurn:
    """`prepare_turn` off the event loop (templates and tokenizing 100 KB take time);
    a small turn inline, where the hand-off to a thread costs more than the work."""
    if _turn_chars(turn) <= INLINE_PREPARE_CHARS:
        return prepare_turn(engine, turn, exchange, hooks)
    return await asyncio.to_thread(prepare_turn, engine, turn, exchange, hooks)


INLINE_PREPARE_CHARS = 8192  # rendering and tokenizing this much takes well under a millisecond


def _turn_chars(turn: Turn) -> int:
    """About how much text the turn renders (messages and tool schemas), cheaply."""
    total = 0
    for m in turn.messages:
        total += len(m.content or "") + len(m.reasoning or "")
        total += sum(len(c.arguments) + len(c.name) for c in m.tool_calls)
        if total > INLINE_PREPARE_CHARS:
            return total
    for t in turn.tools:
        total += len(t.description) + (len(repr(t.parameters)) if t.parameters else 0)
    return total


def _finish_reason(engine_reason: str | None, tool_calls: int) -> TurnFinish:
    if engine_reason == "stop" and tool_calls:
        return "tool_calls"
    if engine_reason in ("stop", "length", "cancelled"):
        return engine_reason  # type: ignore[return-value]
    return "error"


def _stop_sequence(engine: Engine, stops: list[str], tail: list[int]) -> str | None:
    """The stop string that ended a turn whose row finished with "stop" (None: EOS)."""
    if not stops:
        return None
    eos = set(getattr(engine.tokenizer, "eos_token_ids", ()) or ())
    if tail and tail[-1] in eos:
        return None
    try:
        text = engine.tokenizer.decode(tail)
    except Exception:  # a tokenizer that cannot decode a partial sequence
        return stops[0]
    found = [(text.rfind(s) + len(s), s) for s in stops if s in text]
    return max(found)[1] if found else stops[0]


async def stream_turn(engine: Engine, prepared: PreparedTurn, stats: Counter[str] | None = None) -> AsyncIterator[OutputEvent]:
    """The Turn's output as events; the last one is always a TurnEnd.

    Closing this generator early (client gone) cancels the engine row. The hooks hear of
    every turn, an unfinished one too: its output so far, finish reason "cancelled"
    (the client went away) or "error" (our bug), so a trace keeps what the agent's user
    interrupted.
    """
    collected = TurnOutput()  # what the hooks see at the end
    ended = False
    try:
        async with contextlib.aclosing(_turn_events(engine, prepared, stats, collected)) as events:
            async for event in events:
                ended = ended or isinstance(event, TurnEnd)
                yield event
    except BaseException as exc:
        if not ended and prepared.hooks:
            _after_unfinished_turn(prepared, collected, exc)
        raise


def _after_unfinished_turn(prepared: PreparedTurn, collected: TurnOutput, exc: BaseException) -> None:
    gone = isinstance(exc, (GeneratorExit, asyncio.CancelledError))
    try:  # what the parser still holds (text, a call cut off) belongs to the output so far
        for event in prepared.parser.finish():
            collected.add(event)
    except Exception:  # a parser the failure left in a bad state: keep what was collected
        pass
    usage = _usage_so_far(prepared)
    message = "the client went away before the turn ended" if gone else f"{type(exc).__name__}: {exc}"
    collected.add(TurnEnd("cancelled" if gone else "error", usage, message))
    _after_turn(prepared, collected)


def _usage_so_far(prepared: PreparedTurn) -> Usage:
    """Usage of a turn that ended before the engine's last chunk (which carries it)."""
    return Usage(len(prepared.request.prompt), len(prepared.output_tokens), prepared.cached_tokens)


async def _turn_events(engine: Engine, prepared: PreparedTurn, stats: Counter[str] | None,
                       collected: TurnOutput) -> AsyncIterator[OutputEvent]:
    parser = prepared.parser
    usage = Usage(prompt_tokens=len(prepared.request.prompt))
    reason: str | None = None
    error: str | None = None
    tail: list[int] = []
    cut = False  # ended by the parser (max_calls), not by the engine
    aligner = prepared.content_logprobs or _content_logprobs(engine, prepared.request)
    for event in prepared.prefix_events:
        collected.add(event)
        yield event
    try:
        async with contextlib.aclosing(engine.stream(prepared.request)) as chunks:
            async for chunk in chunks:
                if chunk.tokens:
                    tail = (tail + list(chunk.tokens))[-_TAIL:]
                    prepared.output_tokens.extend(chunk.tokens)
                    prepared.output_kinds.extend(chunk.kinds)
                    prepared.output_sources.extend(getattr(chunk, "sources", None) or [None] * len(chunk.tokens))
                    prepared.chunk_times.append((time.perf_counter(), len(chunk.tokens),
                                                 int(getattr(chunk, "proposed", 0) or 0)))
                if chunk.timings is not None:
                    prepared.timings = chunk.timings
                if chunk.cached_tokens:
                    prepared.cached_tokens = int(chunk.cached_tokens)
                if chunk.text or aligner is not None:
                    before = parser.state
                    events = parser.feed(chunk.text) if chunk.text else []
                    if aligner is not None:
                        aligner.chunk(chunk.tokens, getattr(chunk, "logprobs", None), before, parser.state, events)
                    for event in events:
                        collected.add(event)
                        yield event
                if chunk.finish_reason is not None:
                    reason, error = chunk.finish_reason, chunk.error
                    usage = Usage(chunk.prompt_tokens or usage.prompt_tokens, chunk.completion_tokens,
                                  int(getattr(chunk, "cached_tokens", 0) or 0), chunk.fill)
                elif parser.done:
                    # The one call allowed is complete: end the turn here. Leaving the
                    # stream cancels the row; the prefix cache keeps what it consumed.
                    reason, cut = "stop", True
                    usage = _usage_so_far(prepared)
                    break
    except EngineError as exc:
        reason, error = "error", str(exc)
    final = parser.finish()
    if aligner is not None:
        aligner.attach(final)
    for event in final:
        collected.add(event)
        yield event
    finish = _finish_reason(reason, len(parser.tool_calls))
    if finish == "error" and error is None:
        error = "generation ended without a finish reason"
    stop_sequence = _stop_sequence(engine, prepared.request.stop, tail) if reason == "stop" and not cut else None
    if stats is not None:
        stats[f"finish_{finish}"] += 1
        stats["tool_calls"] += len(parser.tool_calls)
        stats["tool_calls_malformed"] += len(parser.malformed)
        stats["tool_calls_with_issues"] += sum(1 for c in parser.tool_calls if c.issues)
        stats["completion_tokens"] += usage.completion_tokens
        stats["prompt_tokens"] += usage.prompt_tokens
        if prepared.scripted is not None:
            stats["script_turns"] += 1
            stats["script_stray_tokens"] += prepared.scripted.strays
    end = TurnEnd(finish, usage, error, stop_sequence)
    if prepared.hooks:
        collected.add(end)
        _after_turn(prepared, collected)
    yield end


def _content_logprobs(engine: Engine, request: GenerationRequest) -> ContentLogprobs | None:
    """The aligner of content logprobs for a request that asked for them."""
    if request.logprobs is None:
        return None
    end_ids = set(getattr(engine.tokenizer, "eos_token_ids", ()) or ()) | set(request.stop_token_ids)
    return ContentLogprobs(TokenText(engine), end_ids)


def _after_turn(prepared: PreparedTurn, out: TurnOutput) -> None:
    """Tell the hooks (policies, recorder) how the turn ended; never fails the turn."""
    for hook in prepared.hooks:
        try:
            hook.after_turn(prepared.exchange, prepared, out)
        except Exception:
            log.exception("after_turn hook %s failed", type(hook).__name__)


async def complete_turn(engine: Engine, prepared: PreparedTurn, stats: Counter[str] | None = None) -> TurnOutput:
    """Run the Turn to the end and collect its output."""
    out = TurnOutput(logprobs=None if prepared.request.logprobs is None else [])
    async with contextlib.aclosing(stream_turn(engine, prepared, stats)) as events:
        async for event in events:
            out.add(event)
    return out

