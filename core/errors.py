"""Errors the proxy answers with, in OpenAI's or Anthropic's error shape.

Bad input is a 4xx with a message that names the field: clients retry 5xx for
minutes, so a 5xx is only for a real server fault.
"""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """An error with an HTTP status and an OpenAI-style body."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)

    def anthropic_body(self) -> dict[str, Any]:
        return anthropic_error_body(self.message, self.status)


def error_body(
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(message, status=400, param=param, code=code)


def not_found(message: str, code: str = "unknown_url") -> APIError:
    return APIError(message, status=404, code=code)


def server_error(message: str) -> APIError:
    return APIError(message, status=500, type="server_error", code="internal_error")


# Anthropic names error types by HTTP status.
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def anthropic_error_type(status: int) -> str:
    if status in ANTHROPIC_ERROR_TYPES:
        return ANTHROPIC_ERROR_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def anthropic_error_body(message: str, status: int = 400) -> dict[str, Any]:
    """Anthropic's error shape: `{"type": "error", "error": {"type", "message"}}`."""
    return {"type": "error", "error": {"type": anthropic_error_type(status), "message": message}}
