"""Server-sent events: framing and the streaming response."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import orjson
from starlette.responses import StreamingResponse

T = TypeVar("T")

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"

SSE_HEADERS = {
    "Cache-Control": "no-cache",
    "Connection": "keep-alive",
    "X-Accel-Buffering": "no",
}


def data(obj: Any) -> bytes:
    """One `data:` event carrying JSON (OpenAI chat streams)."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def event(name: str, obj: Any) -> bytes:
    """One named event (`event:` line plus JSON data; Anthropic and Responses streams)."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def response(body: AsyncIterator[bytes], headers: dict[str, str] | None = None) -> StreamingResponse:
    return StreamingResponse(
        body, status_code=200, media_type="text/event-stream", headers={**SSE_HEADERS, **(headers or {})}
    )


async def with_heartbeat(
    source: AsyncIterator[T], interval: float, beat: Callable[[], bytes]
) -> AsyncIterator[T | bytes]:
    """`source`'s items, with `beat()` yielded whenever none came for `interval` seconds.

    Long prefills keep a stream silent for minutes; a heartbeat tells the client (and
    any proxy between) that the server is alive. The source is read in a task of its
    own, so a heartbeat never cancels a pending read.
    """
    iterator = source.__aiter__()
    pending: asyncio.Future[T] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield beat()
                continue
            task, pending = pending, None
            try:
                item = task.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
