"""UpstreamEngine: the engine interface, served by upstream chat-completions engines.

The server, runner, policies and recorder talk to it as to the in-process Engine
(`tokenizer`, `info`, `context_length`, `validate`, `stream`, `health`, `metrics`,
`close`). The prompt is still rendered locally with the serving tokenizer (policies
count tokens, the recorder keeps prompt ids), but what goes upstream is the Turn after
policies, as messages (`GenerationRequest.turn`, which the runner sets).

Per request: one streamed chat completion on the session's replica (replicas.py), its
deltas turned into model-format text (translate.py) and tokenized locally into
TokenChunks. A policy's asserted intervention (a jump) cuts the upstream stream at the
boundary, is emitted as `jump` tokens, and a continuation request (the answer so far
plus the jump as a final assistant message, `continue_final_message: true`,
`add_generation_prompt: false`) on the same replica lets the upstream prefill it from
its prefix cache and go on. Where the upstream cannot continue, jumps are off.

Errors: an upstream 5xx is a 502 carrying the upstream's message, a 4xx keeps its
status, a connection failure is a 502 naming the URL (after the other replicas were
tried), a timeout a 504; a stream that dies mid-way raises the same errors, which the
server turns into the protocol's error event and terminal event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from jumpahead.engine.methods.proposal import Proposal, RowView
from jumpahead.engine.types import EngineError, GenerationRequest, ServedModel, Timings, TokenChunk

from jumpahead.core.errors import APIError
from jumpahead.core.prompt import prompt_opens_reasoning
from jumpahead.core.script import ScriptedProposer
from jumpahead.core.turn import Turn
from .replicas import Replica, ReplicaSet
from .translate import OutputText, chat_body

log = logging.getLogger("jumpahead.upstream")

CONTINUING_OWNERS = ("jumpahead", "vllm", "sglang")  # /v1/models owned_by of engines that continue a prefix
DEFAULT_CONTEXT = 32768  # when no upstream reports its window
HEALTH_FAILURES = 2  # failed checks in a row before a replica is skipped (a refused request: at once)


@dataclass
class UpstreamConfig:
    urls: list[str]
    api_key: str | None = None
    model: str | None = None  # None: found from /v1/models (or the upstream's default)
    routing: str = "affinity"
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0  # between two bytes of a stream (long prefills)
    health_interval_s: float = 2.0
    continuation: bool | None = None  # None: decided by what /v1/models says the upstream is


def base_url(url: str) -> str:
    """The upstream's OpenAI base (…/v1) from what a user typed."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--upstream {url!r}: expected an http:// or https:// URL")
    for suffix in ("/chat/completions", "/completions"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url if url.endswith("/v1") else url + "/v1"


def _root(base: str) -> str:
    return base[:-3] if base.endswith("/v1") else base


def _upstream_message(raw: bytes) -> str:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace").strip()[:500] or "(empty body)"
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, dict):
            err = err.get("message") or err
        if err is not None:
            return str(err)[:500]
    return str(body)[:500]


def _status_error(url: str, status: int, message: str) -> APIError:
    if status >= 500 or status in (401, 403, 404):  # the upstream's fault or ours, not the client's
        return APIError(f"upstream {url} answered {status}: {message}", status=502, type="server_error",
                        code="upstream_error")
    return APIError(f"upstream {url}: {message}", status=status, code="upstream_rejected")


class UpstreamEngine:
    def __init__(self, config: UpstreamConfig, tokenizer: Any, tokenizer_name: str = "upstream") -> None:
        self.config = config
        self.urls = [base_url(u) for u in config.urls]
        self.replicas = ReplicaSet(self.urls, config.routing)
        self.tokenizer = tokenizer
        self.tokenizer_name = tokenizer_name
        self.model = config.model
        self.continuation = bool(config.continuation)
        self.context_length = DEFAULT_CONTEXT
        self.context_known = False
        self.info = ServedModel(name=config.model or "upstream", path=self.urls[0])
        self.started_at = time.time()
        self.counters: Counter[str] = Counter()
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._health_task: asyncio.Task | None = None

    # --- startup -------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}

    def probe(self) -> list[str]:
        """Ask each replica what it serves (sync, at startup): the model name to send,
        its window, whether it continues a final assistant message. Lines to log."""
        notes: list[str] = []
        owners: list[str] = []
        with httpx.Client(timeout=self.config.connect_timeout_s, headers=self._headers()) as client:
            for replica in self.replicas.replicas:
                try:
                    r = client.get(f"{replica.url}/models")
                except httpx.HTTPError as exc:  # down now: the health checks bring it back
                    self.replicas.mark(replica, False, f"probe failed: {type(exc).__name__}: {exc}")
                    notes.append(f"upstream {replica.url} is not answering ({type(exc).__name__}: {exc}); "
                                 "it is skipped until a health check passes")
                    continue
                try:  # an answer that lists nothing usable (mlx_lm.server may send an empty body)
                    data = r.json().get("data", []) if r.status_code == 200 else []
                except ValueError:
                    data = []
                cards = [c for c in data if isinstance(c, dict)] if isinstance(data, list) else []
                owned = [c for c in cards if c.get("owned_by")]
                owners += [str(c["owned_by"]) for c in owned[:1]]
                if self.model is None and owned:
                    self.model = str(owned[0].get("id"))
                for c in cards:
                    window = c.get("context_length") or c.get("max_model_len")
                    if isinstance(window, int) and window > 0:
                        self.context_length = window if not self.context_known else min(self.context_length, window)
                        self.context_known = True
        self.info.name = self.model or "upstream"
        if self.config.continuation is None:
            self.continuation = bool(owners) and all(o in CONTINUING_OWNERS for o in owners)
            if not self.continuation:
                what = ", ".join(sorted(set(owners))) or "an engine that does not say what it is"
                notes.append(f"jumps are off: the upstream ({what}) is not known to continue a final assistant "
                             "message (continue_final_message); --upstream-continuation on forces them")
        return notes

    # --- the engine interface -------------------------------------------------------------
    def validate(self, req: GenerationRequest) -> None:
        if not req.prompt:
            raise EngineError("the prompt renders to no tokens")
        if req.max_tokens < 1:
            raise EngineError("max_tokens must be at least 1")
        if self.context_known and len(req.prompt) >= self.context_length:
            raise EngineError(f"prompt is {len(req.prompt)} tokens; the upstream's context is "
                              f"{self.context_length} tokens")

    def _http(self) -> httpx.AsyncClient:
        """The one pooled client (made on the serving loop, where it is used)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            c = self.config
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(connect=c.connect_timeout_s, read=c.read_timeout_s, write=30.0,
                                      pool=c.connect_timeout_s),
                limits=httpx.Limits(max_connections=512, max_keepalive_connections=64),
                headers=self._headers())
            self._loop = loop
            self._health_task = loop.create_task(self._health_loop())
        return self._client

    async def _check(self, client: httpx.AsyncClient, replica: Replica) -> None:
        try:
            r = await client.get(f"{_root(replica.url)}/health", timeout=self.config.connect_timeout_s)
            if r.status_code == 404:  # no /health: any answer from /models will do
                r = await client.get(f"{replica.url}/models", timeout=self.config.connect_timeout_s)
            ok = r.status_code == 200
            message = None if ok else f"health check answered {r.status_code}"
        except httpx.HTTPError as exc:
            ok, message = False, f"health check failed: {type(exc).__name__}: {exc}"
        was = replica.healthy
        self.replicas.mark(replica, ok, message, checks=HEALTH_FAILURES)
        if was != replica.healthy:
            log.warning("upstream %s is %s%s", replica.url, "back" if ok else "down", f" ({message})" if message else "")

    async def _health_loop(self) -> None:
        while True:
            client = self._client
            if client is not None:
                await asyncio.gather(*(self._check(client, r) for r in self.replicas.replicas),
                                     return_exceptions=True)
            await asyncio.sleep(self.config.health_interval_s)

    async def _open(self, body: dict[str, Any], session: str, pinned: Replica | None
                    ) -> tuple[Replica, httpx.Response]:
        """A streaming POST on the session's replica, failing over to the next ones
        while a replica cannot be reached (nothing was sent to it yet)."""
        client = self._http()
        order = [pinned] if pinned is not None else self.replicas.order(session)
        tried: list[str] = []
        for replica in order:
            request = client.build_request("POST", f"{replica.url}/chat/completions", content=orjson.dumps(body),
                                           headers={"content-type": "application/json",
                                                    **({"x-session-id": session} if session else {})})
            self.replicas.begin(replica, session)
            t0 = time.perf_counter()
            try:
                response = await client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadError, httpx.RemoteProtocolError) as exc:
                # refused, or a kept-alive connection the replica closed by dying: nothing ran there
                self.replicas.end(replica)
                self.replicas.failed(replica, f"{type(exc).__name__}: {exc}", down=True)
                tried.append(f"{replica.url} ({type(exc).__name__}: {exc or 'connection failed'})")
                continue
            except httpx.TimeoutException as exc:
                self.replicas.end(replica)
                self.replicas.failed(replica, f"{type(exc).__name__}", down=False)
                raise APIError(f"upstream {replica.url} timed out: {type(exc).__name__}", status=504,
                               type="server_error", code="upstream_timeout") from None
            except httpx.HTTPError as exc:
                self.replicas.end(replica)
                self.replicas.failed(replica, f"{type(exc).__name__}: {exc}", down=False)
                raise APIError(f"upstream {replica.url} failed: {type(exc).__name__}: {exc}", status=502,
                               type="server_error", code="upstream_error") from None
            self.replicas.first_byte(replica, time.perf_counter() - t0)
            if response.status_code != 200:
                raw = await response.aread()
                await response.aclose()
                self.replicas.end(replica)
                message = _upstream_message(raw)
                self.replicas.failed(replica, f"{response.status_code}: {message}", down=False)
                raise _status_error(replica.url, response.status_code, message)
            return replica, response
        raise APIError("cannot reach the upstream: " + "; ".join(tried), status=502, type="server_error",
                       code="upstream_unreachable")

    async def stream(self, req: GenerationRequest) -> AsyncIterator[TokenChunk]:
        if not isinstance(req.turn, Turn):
            raise EngineError("upstream mode serves requests that come through the server (no Turn on this request)")
        run = _Run(self, req, req.turn, req.session_id)
        async for chunk in run.chunks():
            yield chunk

    def health(self) -> dict[str, Any]:
        with contextlib.suppress(RuntimeError):
            self._http()  # starts the health checks on the serving loop
        report = self.replicas.report()
        healthy = [r for r in report["replicas"] if r["healthy"]]
        return {
            "status": "ok" if healthy else "no upstream replica is healthy",
            "mode": "upstream",
            "model": self.info.name,
            "tokenizer": self.tokenizer_name,
            "continuation": self.continuation,
            "context_length": self.context_length if self.context_known else None,
            "rows_running": sum(r["in_flight"] for r in report["replicas"]),
            "upstream": report,
            "uptime_s": round(time.time() - self.started_at, 1),
        }

    def metrics(self) -> dict[str, Any]:
        return {"upstream": {**self.replicas.report(), **dict(self.counters), "continuation": self.continuation}}

    def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
        self._client = None


class _Run:
    """One request's upstream exchange(s): the stream, jumps, continuations."""

    def __init__(self, engine: UpstreamEngine, req: GenerationRequest, turn: Turn, session: str) -> None:
        self.e = engine
        self.req = req
        self.turn = turn
        self.session = session
        self.text = OutputText(engine.tokenizer, in_reasoning=prompt_opens_reasoning(engine.tokenizer, req.prompt))
        self.tokens: list[int] = []
        self.kinds: Counter[str] = Counter()
        self.proposers = list(req.proposers) if engine.continuation else []
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.upstream_completion = 0
        self.requests = 0
        self.jumps = 0

    def _chunk(self, text: str, kind: str = "sampled", tokens: list[int] | None = None,
               source: tuple[int, int] | None = None) -> TokenChunk:
        ids = tokens if tokens is not None else [int(t) for t in self.e.tokenizer.encode(text, add_special_tokens=False)]
        self.tokens.extend(ids)
        self.kinds[kind] += len(ids)
        sources = None
        if source is not None:
            sources = [source[0] + i if source[0] + i < source[1] else None for i in range(len(ids))]
        return TokenChunk(ids, [kind] * len(ids), text, sources=sources)  # type: ignore[list-item]

    def _jump(self) -> Proposal | None:
        """Ask the row's proposers (the policies' boundary proposer) after new output;
        an asserted proposal is a jump. Verified ones cannot be checked upstream."""
        view = RowView(tokens=[*self.req.prompt, *self.tokens], prompt_len=len(self.req.prompt),
                       budget=max(0, self.req.max_tokens - len(self.tokens)))
        for proposer in self.proposers:
            p = proposer.propose(view, 1 << 20)
            if p is not None and p.tokens and p.asserted:
                return p
        return None

    async def chunks(self) -> AsyncIterator[TokenChunk]:
        t0 = time.perf_counter()
        first_at: float | None = None
        replica: Replica | None = None
        finish = "stop"
        prefix: str | None = None
        scripted = next((p for p in self.req.proposers if isinstance(p, ScriptedProposer)), None)
        if scripted is not None:  # script mode (replay --live): the recorded turn, no upstream call
            eos = set(getattr(self.e.tokenizer, "eos_token_ids", ()) or ())
            body = [t for t in scripted.tokens if t not in eos]
            scripted.cursor = len(scripted.tokens)
            yield self._chunk(self.e.tokenizer.decode(body), "scripted", body)
            yield self._end("stop", t0, time.perf_counter(), None)
            return
        while True:
            budget = None
            if self.turn.max_tokens is not None:
                budget = self.turn.max_tokens - len(self.tokens)
                if budget < 1:
                    finish = "length"
                    break
            body = chat_body(self.turn, self.e.model, prefix=prefix, max_tokens=budget)
            whole = not self.turn.stream and not self.proposers
            if whole:  # nothing watches the tokens as they come: the upstream's plain answer,
                # which engines send sooner than the same answer as SSE events
                body["stream"] = False
                body.pop("stream_options", None)
            replica, response = await self.e._open(body, self.session, replica)
            self.requests += 1
            jump: Proposal | None = None
            try:
                events = _whole_answer(response, replica.url) if whole else _sse_events(response, replica.url)
                async for kind, data in events:
                    if kind == "usage":
                        self._usage(data)
                        continue
                    if kind == "finish":
                        finish = data
                        continue
                    text = self.text.delta(data)
                    if not text:
                        continue
                    if first_at is None:
                        first_at = time.perf_counter()
                    yield self._chunk(text)
                    if self.proposers:
                        jump = self._jump()
                        if jump is not None:
                            break  # cut the upstream at the boundary
                if jump is None:
                    rest = self.text.finish()
                    if rest:
                        yield self._chunk(rest)
                        if self.proposers:
                            jump = self._jump()
            except httpx.TimeoutException as exc:
                self.e.replicas.failed(replica, type(exc).__name__, down=False)
                raise APIError(f"upstream {replica.url} timed out mid-stream ({type(exc).__name__})", status=504,
                               type="server_error", code="upstream_timeout") from None
            except httpx.HTTPError as exc:  # the replica went away mid-answer: skip it until it is back
                self.e.replicas.failed(replica, f"{type(exc).__name__}: {exc}",
                                       down=isinstance(exc, httpx.TransportError))
                raise APIError(f"upstream {replica.url} failed mid-stream: {type(exc).__name__}: {exc}",
                               status=502, type="server_error", code="upstream_error") from None
            except APIError as exc:
                self.e.replicas.failed(replica, exc.message, down=False)
                raise
            finally:
                await response.aclose()  # cancels the upstream request when it is cut or the client left
                self.e.replicas.end(replica)
            if jump is None:
                break
            text = self.e.tokenizer.decode(jump.tokens)
            self.text.extend(text)
            self.jumps += 1
            self.e.counters["jumps"] += 1
            self.e.counters["continuations"] += 1
            yield self._chunk(text, jump.kind, list(jump.tokens), jump.source)
            follow = self._jump()  # lets the proposer take its own tokens in
            if follow is not None:
                log.debug("a second asserted proposal right after a jump is not applied upstream")
            prefix = self.text.emitted
            finish = "stop"
        self.e.counters["requests"] += 1
        if self.text.mismatches:
            self.e.counters["continued_call_mismatches"] += self.text.mismatches
        yield self._end(finish, t0, first_at, replica)

    def _end(self, finish: str, t0: float, first_at: float | None, replica: Replica | None) -> TokenChunk:
        end = time.perf_counter()
        first = first_at if first_at is not None else end
        fill = {"tokens": dict(self.kinds), "upstream": {
            "replica": replica.url if replica else None, "requests": self.requests, "jumps": self.jumps,
            "completion_tokens": self.upstream_completion}}
        return TokenChunk([], [], "", finish_reason="length" if finish == "length" else "stop",
                          prompt_tokens=self.prompt_tokens or len(self.req.prompt),
                          completion_tokens=len(self.tokens), cached_tokens=self.cached_tokens,
                          timings=Timings(prefill_s=first - t0, decode_s=end - first, rounds=self.requests),
                          fill=fill)

    def _usage(self, usage: dict[str, Any]) -> None:
        if not self.prompt_tokens:  # the first request's prompt: the continuations re-send it
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            self.cached_tokens = int((details.get("cached_tokens") if isinstance(details, dict) else 0) or 0)
        self.upstream_completion += int(usage.get("completion_tokens") or 0)


async def _whole_answer(response: httpx.Response, url: str) -> AsyncIterator[tuple[str, Any]]:
    """The events of a non-streamed chat completion, as _sse_events yields them."""
    raw = await response.aread()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise APIError(f"upstream {url} sent an answer that is not JSON: {raw[:200]!r}", status=502,
                       type="server_error", code="upstream_error") from None
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise APIError(f"upstream {url} sent an answer without choices: {raw[:200]!r}", status=502,
                       type="server_error", code="upstream_error")
    if isinstance(body.get("usage"), dict):
        yield "usage", body["usage"]
    message = choices[0].get("message")
    if isinstance(message, dict):
        calls = message.get("tool_calls")
        if isinstance(calls, list):  # a whole call reads as one delta of its own index
            message = {**message, "tool_calls": [{**c, "index": i} for i, c in enumerate(calls) if isinstance(c, dict)]}
        yield "delta", message
    reason = choices[0].get("finish_reason")
    yield "finish", "length" if reason == "length" else "stop"


async def _sse_events(response: httpx.Response, url: str) -> AsyncIterator[tuple[str, Any]]:
    """("delta", delta) / ("finish", reason) / ("usage", usage) from an upstream stream;
    an error object in the stream raises a 502 with its message. A stream that ends
    without `[DONE]` and without a finish reason died mid-way."""
    finished = done = False
    async for line in response.aiter_lines():
        if done or not line.startswith("data:"):
            continue  # after [DONE]: read to the end, so the connection goes back to the pool
        payload = line[5:].strip()
        if payload == "[DONE]":
            done = True
            continue
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise APIError(f"upstream {url} sent a stream line that is not JSON: {payload[:200]}", status=502,
                           type="server_error", code="upstream_error") from None
        if not isinstance(event, dict):
            continue
        if event.get("error") is not None:
            raise APIError(f"upstream {url} failed mid-stream: {_upstream_message(orjson.dumps(event))}",
                           status=502, type="server_error", code="upstream_error")
        if isinstance(event.get("usage"), dict):
            yield "usage", event["usage"]
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                yield "delta", delta
            reason = choice.get("finish_reason")
            if reason:
                finished = True
                yield "finish", "length" if reason == "length" else "stop"
    if not finished and not done:
        raise APIError(f"upstream {url} closed the stream before the answer ended", status=502,
                       type="server_error", code="upstream_error")

