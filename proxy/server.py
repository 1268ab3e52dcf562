"""The HTTP server: routes, shared engine state, error mapping.

`create_app(engine)` builds the Starlette app; `jumpahead serve` runs it with uvicorn.
Three protocols share one path and one handler, `generation_handler`, driven by each
protocol's WireProtocol (proxy/wire.py; body -> Turn -> runner -> OutputEvents ->
body or stream): OpenAI chat completions, Anthropic messages, OpenAI responses. Every answer is JSON
(or SSE for streams); bad input is a 4xx in the protocol's error shape, and no
request can stop the server. With a Script (`serve --script`), each generation
request consumes the script's next turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from jumpahead.engine.interface import Engine

from . import sse
from .access import AccessConfig, access_middleware
from .anthropic_messages import MessagesProtocol, parse_messages_request
from .body_limit import DEFAULT_MAX_BODY_BYTES, MAX_JSON_DEPTH, BodyLimitMiddleware, too_deep
from .dashboard import DashboardFeed, dashboard_routes
from jumpahead.core.errors import APIError, invalid_request, not_found, server_error
from jumpahead.core.exchange import Exchange
from .openai_chat import ChatProtocol
from .openapi import openapi_document
from .openai_responses import ResponsesProtocol
from jumpahead.core.prompt import render_prompt
from .response_store import ResponseStore
from .responses_compact import compact_response
from jumpahead.core.turn_runner import PreparedTurn, complete_turn, prepare_turn_async, stream_turn
from jumpahead.core.script import Script
from .prometheus import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE
from .prometheus import prometheus_text
from .signing import Signer, default_signer
from jumpahead.core.turn import TurnOutput
from .wire import ProtocolFactory, WireContext, WireStream
from .wire_errors import error_body_for

log = logging.getLogger("jumpahead.proxy")
T = TypeVar("T")
HEARTBEAT_S = 15.0  # Anthropic and Responses streams: a ping after this long without an event


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def _error_response(exc: APIError, request: Request | None = None) -> JSONResponse:
    """The error in the shape of the protocol the request's path speaks."""
    path = request.url.path if request is not None else ""
    return JSONResponse(error_body_for(exc, path), status_code=exc.status)


def _engine(request: Request) -> Engine:
    return request.app.state.engine


def _stats(request: Request) -> Counter[str]:
    return request.app.state.stats


def _script(request: Request) -> Script | None:
    return request.app.state.script


def _exchange(request: Request, protocol: str, body: Any, turn: Any) -> Exchange:
    """The exchange record the hooks (policies, recorder) see; headers keep their case."""
    from .session_identity import session_id

    headers = dict(request.headers.items())
    body = body if isinstance(body, dict) else {}
    return Exchange(protocol=protocol, headers=headers, body=body, session_id=session_id(headers, body, turn))


async def _prepare(request: Request, protocol: str, body: Any, turn: Any) -> PreparedTurn:
    hooks = request.app.state.hooks
    exchange = _exchange(request, protocol, body, turn)
    return await prepare_turn_async(_engine(request), turn, exchange, hooks)


def _model_name(engine: Engine) -> str:
    return engine.info.name or "jumpahead"


async def read_json(request: Request) -> Any:
    """The request body as JSON; 400 when it is not JSON."""
    try:
        raw = await request.body()
    except ClientDisconnect:
        raise invalid_request("the client disconnected while sending the body") from None
    if not raw.strip():
        raise invalid_request("the request body is empty; expected a JSON object")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid_request(f"the request body is not valid JSON: {exc}") from None
    if too_deep(value):
        raise invalid_request(f"the request body nests objects and arrays deeper than {MAX_JSON_DEPTH} levels")
    return value


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """Run `work`; cancel it and return None if the client goes away first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this handler was cancelled (shutdown): stop the work too
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


# --- generation: /v1/chat/completions, /v1/messages, /v1/responses ----------------------


def _wire_context(request: Request) -> WireContext:
    state = request.app.state
    return WireContext(engine=state.engine, stats=state.stats, signer=state.signer, responses=state.responses)


def generation_handler(make_protocol: ProtocolFactory, name: str) -> Callable[[Request], Awaitable[Response]]:
    """The route handler of one generation protocol (proxy/wire.py): body -> Turn ->
    the turn pipeline -> the protocol's JSON answer or SSE stream."""

    async def handle(request: Request) -> Response:
        engine = _engine(request)
        wire = make_protocol(_wire_context(request))
        body = await read_json(request)
        turn = await wire.parse(body)
        prepared = await _prepare(request, wire.protocol, body, turn)
        model = turn.model or _model_name(engine)
        if turn.stream:
            return sse.response(_sse(engine, prepared, wire.stream(prepared, model), _stats(request)))
        out = await _complete(request, engine, prepared)
        if out is None:
            return Response(status_code=499)  # nobody reads it
        return JSONResponse(wire.body(out, model))

    handle.__name__ = handle.__qualname__ = name  # the route's name
    return handle


async def _sse(engine: Engine, prepared: PreparedTurn, wire: WireStream, stats: Counter[str]) -> AsyncIterator[bytes]:
    """An SSE body. The protocol's terminal frames always end it, also after a fault
    mid-stream (`wire.fail`, then `wire.end`); `wire.heartbeat` fills long silences."""
    stats["streams_started"] += 1
    try:
        for frame in wire.start():
            yield frame
        async with contextlib.aclosing(stream_turn(engine, prepared, stats)) as events:
            if wire.heartbeat is None:
                async for event in events:
                    for frame in wire.encode(event):
                        yield frame
            else:
                async with contextlib.aclosing(sse.with_heartbeat(events, HEARTBEAT_S, wire.heartbeat)) as beating:
                    async for event in beating:
                        if isinstance(event, bytes):
                            yield event
                            continue
                        for frame in wire.encode(event):
                            yield frame
    except Exception as exc:  # a fault mid-stream: say so, end with the terminal frames
        log.exception("stream failed")
        stats["stream_errors"] += 1
        for frame in wire.fail(f"{type(exc).__name__}: {exc}"):
            yield frame
    except BaseException:  # cancelled: the client went away; the engine row is freed
        stats["client_disconnects"] += 1
        raise
    for frame in wire.end():
        yield frame


async def _complete(request: Request, engine: Engine, prepared: PreparedTurn) -> TurnOutput | None:
    out = await unless_disconnected(request, complete_turn(engine, prepared, _stats(request)))
    if out is None:
        _stats(request)["client_disconnects"] += 1
    elif out.finish_reason in ("error", "cancelled"):
        raise server_error(out.error or f"generation {out.finish_reason}")
    return out


chat_completions = generation_handler(ChatProtocol, "chat_completions")
messages = generation_handler(MessagesProtocol, "messages")
responses = generation_handler(ResponsesProtocol, "responses")


async def count_tokens(request: Request) -> Response:
    engine = _engine(request)
    turn = parse_messages_request(await read_json(request), for_counting=True, signer=request.app.state.signer)
    prompt = await asyncio.to_thread(render_prompt, engine.tokenizer, turn)
    return JSONResponse({"input_tokens": len(prompt)})


async def responses_compact(request: Request) -> Response:
    body = await read_json(request)
    return JSONResponse(await compact_response(_engine(request), body, request.app.state.responses,
                                               request.app.state.signer))


async def get_response(request: Request) -> Response:
    entry = request.app.state.responses.get(request.path_params["response_id"])
    if entry is None:
        raise not_found(f"response {request.path_params['response_id']!r} not found", code="response_not_found")
    return JSONResponse(entry.response)


async def delete_response(request: Request) -> Response:
    rid = request.path_params["response_id"]
    if not request.app.state.responses.delete(rid):
        raise not_found(f"response {rid!r} not found", code="response_not_found")
    return JSONResponse({"id": rid, "object": "response.deleted", "deleted": True})


# --- models, health, metrics ---------------------------------------------------------


def _model_card(engine: Engine, model_id: str | None = None) -> dict[str, Any]:
    card = {
        "id": model_id or _model_name(engine),
        "object": "model",
        "created": int(engine.started_at),
        "owned_by": "jumpahead",
    }
    if engine.context_length:
        card["context_length"] = engine.context_length
    if model_id is None:
        card["root"] = engine.info.path
    return card


async def list_models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(_engine(request))]})


async def get_model(request: Request) -> Response:
    # One model serves every name a client configures.
    return JSONResponse(_model_card(_engine(request), request.path_params["model_id"]))


async def root(request: Request) -> Response:
    """Clients probe the base URL (Claude Code sends HEAD /): say what answers here."""
    return JSONResponse({"name": "jumpahead", "model": _model_name(_engine(request)),
                         "endpoints": ["/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens",
                                       "/v1/responses", "/v1/models", "/health", "/metrics", "/metrics.json",
                                       "/openapi.json", "/dashboard"]})


async def health(request: Request) -> Response:
    engine = _engine(request)
    try:
        report = dict(engine.health())
    except Exception as exc:  # health must answer even when the engine is broken
        report = {"status": f"engine health failed: {exc}"}
    report.setdefault("status", "ok")
    script = _script(request)
    if script is not None:
        report["script"] = script.status()
    for hook in request.app.state.hooks:  # hooks report themselves (the recorder: trace dir, sessions)
        describe = getattr(hook, "health", None)
        if callable(describe):
            report.update(describe())
    status = 200 if report["status"] == "ok" else 503
    return JSONResponse(report, status_code=status)


async def openapi(request: Request) -> Response:
    return JSONResponse(openapi_document())


async def metrics(request: Request) -> Response:
    """Prometheus text format (proxy/prometheus.py); /metrics.json has the same as JSON."""
    report = await _metrics_report(request)
    return Response(prometheus_text(report), media_type=PROMETHEUS_CONTENT_TYPE)


async def metrics_json(request: Request) -> Response:
    return JSONResponse(await _metrics_report(request))


async def _metrics_report(request: Request) -> dict[str, Any]:
    engine = _engine(request)
    report = {"engine": engine.metrics(), "server": dict(_stats(request))}
    if request.query_params.get("gc") == "1" and callable(getattr(engine, "memory", None)):
        # leak checks: count only the rows something still references
        report["engine"]["memory"] = await asyncio.to_thread(engine.memory, True)
    for hook in request.app.state.hooks:  # hooks add their own sections (the policies)
        section = getattr(hook, "metrics", None)
        if callable(section):
            report.update(section())
    return report


# --- errors --------------------------------------------------------------------------


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    _stats(request)[f"http_{exc.status}"] += 1
    if exc.status >= 500:
        log.error("%s %s -> %d: %s", request.method, request.url.path, exc.status, exc.message)
    else:
        log.info("%s %s -> %d: %s", request.method, request.url.path, exc.status, exc.message)
    return _error_response(exc, request)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        err = not_found(f"no route for {request.method} {request.url.path}")
    elif exc.status_code == 405:
        err = APIError(f"method {request.method} is not allowed on {request.url.path}", status=405,
                       code="method_not_allowed")
    else:
        err = APIError(str(exc.detail), status=exc.status_code)
    return await _api_error(request, err)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    _stats(request)["http_500"] += 1
    return _error_response(server_error(f"internal error: {type(exc).__name__}: {exc}"), request)


def create_app(engine: Engine, script: Script | None = None, response_store: ResponseStore | None = None,
               hooks: list[Any] | None = None, access: AccessConfig | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, signer: Signer | None = None) -> Starlette:
    """The app around a loaded engine (shared by all requests).

    `script`: forced-continuation replay; each generation request consumes its next turn
    (the script is the first hook: it takes each row's output).
    `hooks`: watchers of every exchange (core/exchange.py): policies, the trace recorder.
    `access`: API key, allowed origins, bound host (proxy/access.py; default: loopback
    names only, no key, no browser origins); `max_body_bytes`: larger bodies get 413.
    """
    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/responses", responses, methods=["POST"]),
        Route("/v1/responses/compact", responses_compact, methods=["POST"]),
        Route("/responses/compact", responses_compact, methods=["POST"]),
        Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", get_model, methods=["GET"]),
        Route("/", root, methods=["GET", "HEAD"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/metrics.json", metrics_json, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        *dashboard_routes(),  # /dashboard, /dashboard.json (proxy/dashboard.py)
    ]
    middleware = [*access_middleware(access or AccessConfig()),
                  Middleware(BodyLimitMiddleware, limit=max_body_bytes)]
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={APIError: _api_error, HTTPException: _http_error, Exception: _unexpected},
    )
    app.state.engine = engine
    app.state.stats = Counter()
    app.state.script = script
    app.state.dashboard = DashboardFeed(engine)  # last: it reads what the other hooks noted
    app.state.hooks = [*([script] if script is not None else []), *(hooks or []), app.state.dashboard]
    app.state.responses = response_store if response_store is not None else ResponseStore()
    app.state.signer = signer or default_signer()  # signs reasoning handed out (proxy/signing.py)
    return app
