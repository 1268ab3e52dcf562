"""A request-body size limit (an ASGI middleware): 413 in the protocol's error shape.

Checked before the route runs: a `Content-Length` over the limit is refused without
reading, and a chunked (or lying) body is counted while it streams in and refused
as soon as it passes the limit, so no oversized body is ever held in memory. A body
that fits is handed to the route as one message; later `receive` calls (disconnect
watching) go to the server as usual.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jumpahead.core.errors import APIError
from .wire_errors import send_error

DEFAULT_MAX_BODY_BYTES = 32 << 20  # Claude Code sends ~100-400 KB; long sessions a few MB


def too_large(limit: int, size: int | None = None) -> APIError:
    got = f" ({size} bytes)" if size is not None else ""
    return APIError(f"the request body is too large{got}: this server accepts at most {limit} bytes "
                    "(serve --max-body-bytes)", status=413, code="request_too_large")


class BodyLimitMiddleware:
    """Refuses bodies over `limit` bytes with 413 (see the module doc)."""

    def __init__(self, app: ASGIApp, limit: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await send_error(scope, send, too_large(self.limit, declared))
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left while sending
                await self.app(scope, _replay([message], receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await send_error(scope, send, too_large(self.limit))
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], receive), send)


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", []):
        if key.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server (h11/httptools) refuses a malformed length itself
    return None


def _replay(first: list[Message], receive: Receive) -> Receive:
    pending = list(first)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


# Real bodies nest ~12 levels (tool schemas). orjson reads up to 1024 levels but writes
# at most 254, and the server re-serializes parts of a body (tool-call arguments given
# as objects, trace records), so a deeper body is refused when it is read, not later
# as a 500.
MAX_JSON_DEPTH = 128


def too_deep(value: object, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `value` (parsed JSON) nests objects/arrays more than `limit` levels."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False
