"""Streaming clients for the load, disconnect and crash benches: the three protocols
over real HTTP, each stream checked for its terminal event.

`stream_request` is a well-behaved client (httpx): it reads the whole SSE stream and
says whether it ended properly (`data: [DONE]` after a finish chunk, `message_stop`,
`response.completed` / `response.incomplete`), when the first output token came and
how many tokens the usage reported. `vanish` is a client that goes away: a raw socket
that sends the request and aborts the connection after a delay or after k streamed
token events, as a killed agent or a closed laptop does.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

PROTOCOLS = ("chat", "messages", "responses")
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}
# What marks a streamed output token in each protocol's raw SSE bytes.
TOKEN_MARKS = {"chat": b'"delta":{"content":', "messages": b'"type":"content_block_delta"',
               "responses": b"event: response.output_text.delta"}
TERMINAL = {"chat": "[DONE]", "messages": "message_stop", "responses": "response.completed"}

_WORDS = ("file", "line", "test", "error", "value", "module", "function", "return", "change", "build",
          "server", "client", "request", "token", "cache", "model", "path", "read", "write", "patch",
          "check", "list", "table", "index", "branch", "commit", "config", "output", "input", "result")


def filler(rng: random.Random, words: int) -> str:
    """`words` plain words (about one token each for a BPE vocabulary)."""
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def request_body(protocol: str, system: str, user: str, max_tokens: int, stream: bool = True,
                 temperature: float = 0.0) -> dict[str, Any]:
    """The same turn in the protocol's request shape."""
    if protocol == "chat":
        body: dict[str, Any] = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                                "max_tokens": max_tokens}
        if stream:
            body["stream_options"] = {"include_usage": True}
    elif protocol == "messages":
        body = {"system": system, "messages": [{"role": "user", "content": user}], "max_tokens": max_tokens}
    elif protocol == "responses":
        body = {"instructions": system, "input": user, "max_output_tokens": max_tokens}
    else:
        raise ValueError(f"unknown protocol {protocol!r} (known: {', '.join(PROTOCOLS)})")
    body.update(model="local", stream=stream, temperature=temperature)
    return body


@dataclass
class StreamResult:
    protocol: str
    status: int | None = None
    terminated: bool = False  # the protocol's terminal event arrived
    error: str | None = None  # HTTP error, transport error, error event, or a malformed stream
    ttft_s: float | None = None  # first output token event (None: the answer was empty)
    total_s: float = 0.0
    output_tokens: int | None = None  # from the stream's usage
    text: str = ""
    events: int = 0

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.terminated and self.error is None


@dataclass
class _Sse:
    """Reads SSE lines into (event name, data) pairs."""

    name: str | None = None
    data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> tuple[str | None, str] | None:
        if line == "":
            if not self.data:
                self.name = None
                return None
            out = (self.name, "\n".join(self.data))
            self.name, self.data = None, []
            return out
        if line.startswith(":"):
            return None
        key, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if key == "event":
            self.name = value
        elif key == "data":
            self.data.append(value)
        return None


def _apply(protocol: str, name: str | None, data: str, result: StreamResult, t0: float) -> None:
    """Update `result` with one SSE event."""
    result.events += 1
    if protocol == "chat":
        if data == "[DONE]":
            if result.output_tokens is None and result.error is None:
                result.error = "[DONE] without a finish chunk carrying usage"
            result.terminated = True
            return
        obj = orjson.loads(data)
        if "error" in obj:
            result.error = f"error event: {obj['error']}"
            return
        if obj.get("usage"):
            result.output_tokens = int(obj["usage"].get("completion_tokens", 0))
        for choice in obj.get("choices") or []:
            text = (choice.get("delta") or {}).get("content")
            if text:
                result.text += text
                result.ttft_s = result.ttft_s or time.perf_counter() - t0
        return
    obj = orjson.loads(data)
    kind = name or obj.get("type")
    if protocol == "messages":
        if kind == "content_block_delta":
            delta = obj.get("delta") or {}
            result.text += delta.get("text", "")
            result.ttft_s = result.ttft_s or time.perf_counter() - t0
        elif kind == "message_delta":
            result.output_tokens = int((obj.get("usage") or {}).get("output_tokens", 0))
        elif kind == "error":
            result.error = f"error event: {obj.get('error')}"
        elif kind == "message_stop":
            result.terminated = True
        return
    if kind == "response.output_text.delta":
        result.text += obj.get("delta", "")
        result.ttft_s = result.ttft_s or time.perf_counter() - t0
    elif kind in ("response.completed", "response.incomplete"):
        result.output_tokens = int(((obj.get("response") or {}).get("usage") or {}).get("output_tokens", 0))
        result.terminated = True
    elif kind in ("response.failed", "error"):
        result.error = f"{kind}: {orjson.dumps(obj)[:300].decode(errors='replace')}"


async def stream_request(client: httpx.AsyncClient, base_url: str, protocol: str, body: dict[str, Any],
                         headers: dict[str, str] | None = None, timeout: float = 600.0) -> StreamResult:
    """POST one streaming request and read it to its end."""
    result = StreamResult(protocol)
    t0 = time.perf_counter()
    parser = _Sse()
    try:
        async with client.stream("POST", base_url + PATHS[protocol], json=body, headers=headers,
                                 timeout=httpx.Timeout(timeout, connect=30.0)) as response:
            result.status = response.status_code
            if response.status_code != 200:
                raw = await response.aread()
                result.error = f"HTTP {response.status_code}: {raw[:300].decode(errors='replace')}"
                return result
            async for line in response.aiter_lines():
                event = parser.feed(line)
                if event is not None:
                    if result.terminated:
                        result.error = result.error or f"event after the terminal one: {event[0]}"
                    _apply(protocol, event[0], event[1], result, t0)
            tail = parser.feed("")
            if tail is not None:
                _apply(protocol, tail[0], tail[1], result, t0)
    except (httpx.HTTPError, orjson.JSONDecodeError, ValueError, TypeError) as exc:
        result.error = result.error or f"{type(exc).__name__}: {exc}"
    finally:
        result.total_s = time.perf_counter() - t0
    if result.error is None and not result.terminated:
        result.error = f"stream ended without {TERMINAL[protocol]}"
    return result


@dataclass
class Vanished:
    """What a client that went away had seen."""

    protocol: str
    tokens_seen: int  # streamed token events before it left (0: it left before the first token)
    seconds: float
    finished_first: bool  # the stream ended before the client could leave (not a disconnect)


async def vanish(base_url: str, protocol: str, body: dict[str, Any], after_s: float | None = None,
                 after_tokens: int | None = None, timeout: float = 600.0) -> Vanished:
    """Send the request on a raw connection, then abort it: after `after_s` seconds
    (if no token came yet) or after `after_tokens` token events, whichever is set."""
    url = urlsplit(base_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port or 80)
    payload = orjson.dumps(body)
    writer.write(f"POST {PATHS[protocol]} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    t0 = time.perf_counter()
    mark, seen, raw, finished = TOKEN_MARKS[protocol], 0, b"", False
    deadline = t0 + (after_s if after_s is not None else timeout)
    try:
        await writer.drain()
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            try:
                data = await asyncio.wait_for(reader.read(65536), timeout=left)
            except asyncio.TimeoutError:
                break
            if not data:
                finished = True
                break
            raw = raw[-64:] + data
            seen += data.count(mark)  # (a mark split across reads is missed: fine for a cut point)
            if after_s is not None and seen:
                break  # a token came first: this one leaves mid-stream
            if after_tokens is not None and seen >= after_tokens:
                break
            if b"[DONE]" in raw or b"event: message_stop" in raw or b"event: response.completed" in raw:
                finished = True
                break
    finally:
        writer.transport.abort()  # gone: no FIN handshake, no reading the rest
    return Vanished(protocol, seen, time.perf_counter() - t0, finished)


def percentiles(values: list[float], points: tuple[int, ...] = (50, 90, 99)) -> dict[str, float | None]:
    """Nearest-rank percentiles (and max), rounded to ms; None for an empty list."""
    if not values:
        return {**{f"p{p}": None for p in points}, "max": None, "n": 0}
    s = sorted(values)
    out: dict[str, Any] = {f"p{p}": round(s[min(len(s) - 1, max(0, -(-p * len(s) // 100) - 1))], 3) for p in points}
    out["max"] = round(s[-1], 3)
    out["n"] = len(s)
    return out
