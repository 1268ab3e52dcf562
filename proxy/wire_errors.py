"""Errors in the path's protocol shape: answered by the routes (server.py) and by ASGI
middleware, before a route runs."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.types import Scope, Send

from jumpahead.core.errors import APIError

ANTHROPIC_PATHS = ("/v1/messages", "/messages")


def error_body_for(exc: APIError, path: str) -> dict[str, Any]:
    """The error's body: Anthropic's shape on its paths, OpenAI's everywhere else."""
    return exc.anthropic_body() if path.startswith(ANTHROPIC_PATHS) else exc.body()


def error_payload(exc: APIError, path: str) -> bytes:
    """error_body_for as JSON bytes."""
    return orjson.dumps(error_body_for(exc, path))


async def send_error(scope: Scope, send: Send, exc: APIError, headers: list[tuple[bytes, bytes]] = ()) -> None:
    payload = error_payload(exc, scope.get("path", ""))
    await send({"type": "http.response.start", "status": exc.status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
        (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": payload})
