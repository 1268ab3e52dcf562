"""Who may drive the server: API key, browser origins, Host names (an ASGI middleware).

A model server on loopback is still reachable by every local user and by every web
page the user's browser opens. This middleware refuses, before any route runs:

- a `Host` that is neither a loopback name nor the bound host (DNS rebinding: a page
  on evil.example whose name was re-pointed at 127.0.0.1 sends `Host: evil.example`);
  when bound to a wildcard address (0.0.0.0, ::) the Host cannot be known and is not
  checked;
- a browser request whose `Origin` (or `Sec-Fetch-Site: cross-site|same-site` without
  one) is not an allowed origin: no page may POST here unless `--allow-origin` names it;
  allowed origins get CORS headers (preflight included) from Starlette's CORSMiddleware;
- with an API key configured, any request except `GET /health`, the dashboard's page
  and scripts (no data; proxy/dashboard.py) and allowed CORS
  preflights without `Authorization: Bearer KEY` or `x-api-key: KEY` (compared in
  constant time). The key is never logged or echoed.

Refusals are 401/403 in the error shape of the protocol the path speaks.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from jumpahead.core.errors import APIError
from .wire_errors import send_error

log = logging.getLogger("jumpahead.access")

ENV_API_KEY = "JUMPAHEAD_API_KEY"
# Liveness probes carry no key; nor does the dashboard's page and its scripts, which hold
# no data (a browser opening a URL cannot send one): their data, /dashboard.json, needs it.
OPEN_PATHS = frozenset({"/health", "/dashboard", "/dashboard/dashboard.js", "/dashboard/dashboard.css",
                        "/dashboard/plotly.min.js"})
LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "127.0.0.1", "::1"})
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


def normalize_origin(url: str) -> str:
    """`scheme://host[:port]` in lower case, default ports dropped; ValueError if not a URL origin."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an origin (expected http://host[:port] or https://host[:port])")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"{url!r} is not an origin: it has more than scheme, host and port")
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    if port is None or (parts.scheme, port) in (("http", 80), ("https", 443)):
        return f"{parts.scheme}://{host}"
    return f"{parts.scheme}://{host}:{port}"


def host_name(header: str) -> str:
    """The name in a Host header, without port or IPv6 brackets, lower case."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    if header.count(":") == 1:
        return header.partition(":")[0]
    return header


def is_loopback(name: str) -> bool:
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class AccessConfig:
    """What the operator allowed. The defaults are the safe local ones."""

    api_key: str | None = None
    allow_origins: tuple[str, ...] = ()  # normalized origins (normalize_origin)
    bind_host: str = "127.0.0.1"
    extra_hosts: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def build(cls, api_key: str | None = None, allow_origins: Iterable[str] = (),
              bind_host: str = "127.0.0.1") -> AccessConfig:
        """A config from CLI values; ValueError names a bad origin or an empty key."""
        if api_key is not None and not api_key.strip():
            raise ValueError("the API key is empty")
        origins = tuple(dict.fromkeys(normalize_origin(o) for o in allow_origins))
        return cls(api_key=api_key, allow_origins=origins, bind_host=host_name(bind_host))

    @property
    def checks_host(self) -> bool:
        return self.bind_host not in WILDCARD_HOSTS

    def host_allowed(self, header: str | None) -> bool:
        if header is None or not self.checks_host:  # no Host: not a browser (they always send one)
            return True
        name = host_name(header)
        return is_loopback(name) or name == self.bind_host or name in self.extra_hosts

    def origin_allowed(self, origin: str) -> bool:
        try:
            return normalize_origin(origin) in self.allow_origins
        except ValueError:  # "null", garbage
            return False

    def key_ok(self, headers: dict[str, str]) -> bool:
        """Whether a Bearer token or x-api-key equals the key (constant-time compare)."""
        if self.api_key is None:
            return True
        expected = self.api_key.encode()
        offered = []
        auth = headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer":
            offered.append(token.strip())
        if "x-api-key" in headers:
            offered.append(headers["x-api-key"].strip())
        ok = False
        for value in offered:  # compare every candidate: timing does not tell which one matched
            ok |= hmac.compare_digest(value.encode("utf-8", "surrogateescape"), expected)
        return ok


def access_config(api_key: str | None, allow_origins: Iterable[str], bind_host: str,
                  environ: dict[str, str] | None = None) -> AccessConfig:
    """`serve`'s AccessConfig: --api-key, else $JUMPAHEAD_API_KEY (a key in the
    environment stays out of `ps`); ValueError names a bad origin or an empty key."""
    env = os.environ if environ is None else environ
    if api_key is None and env.get(ENV_API_KEY):
        api_key = env[ENV_API_KEY]
    return AccessConfig.build(api_key, allow_origins, bind_host)


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


class AccessMiddleware:
    """ASGI middleware enforcing an AccessConfig (see the module doc)."""

    def __init__(self, app: ASGIApp, config: AccessConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        refusal = self.refusal(scope, headers)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        log.info("%s %s refused (%d): %s", scope.get("method"), scope.get("path"), refusal.status, refusal.message)
        extra: list[tuple[bytes, bytes]] = []
        origin = headers.get("origin")
        if origin and self.config.origin_allowed(origin):  # let the allowed web UI read why
            extra += [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
        if refusal.status == 401:
            extra.append((b"www-authenticate", b'Bearer realm="jumpahead"'))
        await send_error(scope, send, refusal, extra)

    def refusal(self, scope: Scope, headers: dict[str, str]) -> APIError | None:
        cfg = self.config
        if not cfg.host_allowed(headers.get("host")):
            return APIError(f"host {host_name(headers['host'])!r} is not allowed: this server answers to loopback "
                            f"names{'' if is_loopback(cfg.bind_host) else ' and ' + cfg.bind_host} only "
                            "(a different Host is how DNS rebinding reaches a local server)",
                            status=403, type="permission_error", code="host_not_allowed")
        origin = headers.get("origin")
        if origin is not None:
            if not cfg.origin_allowed(origin):
                return APIError(f"origin {origin[:200]!r} is not allowed: browser pages may not call this server "
                                "unless it was started with --allow-origin for them",
                                status=403, type="permission_error", code="origin_not_allowed")
        elif headers.get("sec-fetch-site") in ("cross-site", "same-site"):
            return APIError("a cross-site browser request without an Origin is not allowed",
                            status=403, type="permission_error", code="origin_not_allowed")
        if scope.get("path") in OPEN_PATHS and scope.get("method") in ("GET", "HEAD"):
            return None
        if origin is not None and scope.get("method") == "OPTIONS" and "access-control-request-method" in headers:
            return None  # an allowed origin's CORS preflight: browsers send no credentials with it
        if not cfg.key_ok(headers):
            return APIError("missing or invalid API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                            status=401, type="authentication_error", code="invalid_api_key")
        return None


def access_middleware(config: AccessConfig) -> list[Any]:
    """Starlette `Middleware` entries, outermost first: the access checks, then CORS for
    the allowed origins (none configured: no CORS headers at all)."""
    from starlette.middleware import Middleware
    from starlette.middleware.cors import CORSMiddleware

    stack = [Middleware(AccessMiddleware, config=config)]
    if config.allow_origins:
        stack.append(Middleware(CORSMiddleware, allow_origins=list(config.allow_origins),
                                allow_methods=["GET", "POST", "DELETE", "OPTIONS"], allow_headers=["*"],
                                expose_headers=["request-id", "x-request-id"], max_age=600))
    return stack
