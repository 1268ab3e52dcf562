"""Server-sent events: framing and the streaming response."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.responses import StreamingResponse

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
