"""Errors answered by ASGI middleware, before a route runs, in the path's protocol shape."""

from __future__ import annotations

import orjson
from starlette.types import Scope, Send

from .errors import APIError

ANTHROPIC_PATHS = ("/v1/messages", "/messages")


def error_payload(exc: APIError, path: str) -> bytes:
    """The JSON body: Anthropic's shape on its paths, OpenAI's everywhere else."""
    body = exc.anthropic_body() if path.startswith(ANTHROPIC_PATHS) else exc.body()
    return orjson.dumps(body)


async def send_error(scope: Scope, send: Send, exc: APIError, headers: list[tuple[bytes, bytes]] = ()) -> None:
    payload = error_payload(exc, scope.get("path", ""))
    await send({"type": "http.response.start", "status": exc.status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
        (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": payload})
