"""Responses compaction: `POST /v1/responses/compact` and `context_management` on /v1/responses.

Both compact the request's context with the compaction policy, run on demand
(policies/on_demand.py), and hand the client a compaction item sealing the compacted
messages (proxy/compaction_item.py):

- `/v1/responses/compact` takes a /v1/responses body and answers OpenAI's
  `response.compaction` object: the conversation's user messages, then the item;
- `context_management: [{"type": "compaction", "compact_threshold": N}]` compacts a
  /v1/responses request whose rendered prompt exceeds N tokens before it runs, and puts
  the item first in the response's output (the stream's too).

A request that sends the item back gets the same messages, so its prompt starts with
the tokens the compacting request rendered and the prefix cache keeps hitting. The
compaction policy lives in policies/, above the proxy: it is imported when first used.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from typing import Any

from jumpahead.engine.interface import Engine

from .compaction_item import compaction_item, default_threshold
from jumpahead.core.errors import invalid_request
from .openai_responses import ResponsesContext, parse_responses_request
from jumpahead.core.prompt import render_prompt
from .response_store import ResponseStore
from .signing import Signer
from jumpahead.core.turn import Message, Turn


def _options(turn: Turn) -> dict[str, str]:
    """The compaction policy's options from the request's `jumpahead.compaction` object."""
    return dict(turn.options.compaction or {})


def _offset(turn: Turn, ctx: ResponsesContext) -> int:
    """Messages of the Turn before the conversation (the request's instructions)."""
    return len(turn.messages) - len(ctx.history)


def _compact(engine: Engine, turn: Turn, ctx: ResponsesContext, tokens_before: int | None = None) -> Any:
    """Run the compaction policy on `turn` (blocking: rendering, maybe model summaries)."""
    from jumpahead.policies.on_demand import compact_turn

    options = _options(turn)
    generate = None
    if options.get("mode") == "model" and callable(getattr(engine, "generate_sync", None)):
        from jumpahead.policies.runtime import engine_generator

        generate = engine_generator(engine)
    try:
        return compact_turn(turn, engine.tokenizer, engine.context_length, keep=_offset(turn, ctx) + ctx.compacted,
                            options=options, generate=generate, tokens_before=tokens_before)
    except ValueError as exc:
        raise invalid_request(f"jumpahead.compaction: {exc}", param="jumpahead.compaction") from None


def _user_item(message: Message) -> dict[str, Any]:
    return {"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "completed", "role": "user",
            "content": [{"type": "input_text", "text": message.content or ""}]}


def _report(result: Any) -> dict[str, Any]:
    note = next((n for n in result.notes if n.get("decision")), {})
    return {"tokens_before": result.tokens_before, "tokens_after": result.tokens_after,
            "segments": note.get("segments", 0), "decision": note.get("decision", "nothing to compact"),
            **({"fallback": note["fallback"]} if note.get("fallback") else {})}


async def compact_response(engine: Engine, body: Any, store: ResponseStore, signer: Signer) -> dict[str, Any]:
    """The `response.compaction` object for a /v1/responses/compact body."""
    turn, ctx = parse_responses_request(body, store, signer)
    result = await asyncio.to_thread(_compact, engine, turn, ctx)
    history = result.turn.messages[_offset(turn, ctx):]
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": [*(_user_item(m) for m in history if m.role == "user"), compaction_item(history, signer)],
        "usage": {"input_tokens": result.tokens_before, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": result.tokens_before},
        "jumpahead": {"compaction": _report(result)},
    }


async def apply_context_management(engine: Engine, turn: Turn, ctx: ResponsesContext) -> Turn:
    """`turn` compacted when its prompt exceeds the request's compact_threshold (the
    compaction item then leads ctx's output and the stored history is the compacted one)."""
    if ctx.compact_threshold is None:
        return turn
    threshold = ctx.compact_threshold or default_threshold(engine.context_length)

    def work() -> Turn:
        tokens = len(render_prompt(engine.tokenizer, turn))
        if tokens <= threshold:
            return turn
        result = _compact(engine, turn, ctx, tokens_before=tokens)
        if not result.changed:
            return turn
        offset = _offset(turn, ctx)
        ctx.history = list(result.turn.messages[offset:])
        ctx.compacted = len(ctx.history)
        ctx.lead_items = [compaction_item(ctx.history, ctx.signer)]
        extra = dict(result.turn.extra)
        extra["compaction"] = _report(result)  # traces show what was done
        return replace(result.turn, extra=extra)

    return await asyncio.to_thread(work)
