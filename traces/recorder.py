"""The trace recorder: one JSONL file per agent session (`jumpahead serve --trace-dir`).

A hook (core/exchange.py) that writes, at the end of every answered turn, one line
with what the client sent (secrets redacted), the context the model saw (after
policies), the answer with each output token's provenance, timings, usage and the
policies' interventions. Each line goes to the file in one `write()` of the complete
line on an O_APPEND descriptor, so a server killed at any moment loses at most the
turn in flight and leaves at most one partial last line (traces/trace_file.py skips
it). Script-mode turns take the same path and are recorded the same way.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson

from jumpahead.engine.interface import Engine
from jumpahead.core.exchange import BaseHooks, Exchange
from jumpahead.core.prompt import continues_final_message
from jumpahead.core.turn import TurnOutput

from .delta import encode
from .file_names import safe_file_stem
from .trace_file import FORMAT, VERSION, read_trace
from .turn_json import call_to_json, turn_to_json

log = logging.getLogger(__name__)

REDACTED = "<redacted>"
_SECRET_HEADER_PARTS = ("auth", "key", "cookie", "token", "secret", "password")
# Body keys whose string values are credentials. Matched on the whole key, so
# `max_tokens` or `prompt_cache_key` are kept.
_SECRET_BODY_KEYS = {"api_key", "apikey", "api-key", "x-api-key", "authorization", "password", "secret",
                     "client_secret", "access_token", "refresh_token", "id_token", "session_token", "auth_token",
                     "bearer_token", "cookie", "credentials"}


class TraceError(OSError):
    """A session whose trace file cannot be written (refused path, disk error)."""


def redact_headers(headers: dict[str, str]) -> dict[str, str]:
    """The headers with credential values replaced; names stay (they tell the client apart)."""
    return {k: (REDACTED if any(p in k.lower() for p in _SECRET_HEADER_PARTS) else v) for k, v in headers.items()}


def redact_body(value: Any) -> Any:
    """A copy of a request body with credential fields replaced, at any depth."""
    if isinstance(value, dict):
        return {k: (REDACTED if isinstance(k, str) and k.lower() in _SECRET_BODY_KEYS and v not in (None, "")
                    else redact_body(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_body(v) for v in value]
    return value


def provenance_runs(tokens: list[int], kinds: list[str], sources: list[int | None], decode: Any = None) -> list[dict]:
    """Consecutive output tokens of one kind, grouped. A copied run (echo, ngram, jump
    with a source) is split where its source is not contiguous, so that
    `(prompt + output)[source[0]:source[1]] == tokens` for every run with a source."""
    runs: list[dict] = []
    prev: int | None = None
    for i, tok in enumerate(tokens):
        kind = kinds[i] if i < len(kinds) else "sampled"
        src = sources[i] if i < len(sources) else None
        cur = runs[-1] if runs else None
        same = cur is not None and cur["kind"] == kind and (
            (src is None and cur["source"] is None) or (src is not None and prev is not None and src == prev + 1))
        if same:
            cur["tokens"].append(int(tok))
            if src is not None:
                cur["source"][1] = src + 1
        else:
            runs.append({"kind": kind, "tokens": [int(tok)], "source": None if src is None else [src, src + 1]})
        prev = src
    for run in runs:
        run["text"] = _decode(decode, run["tokens"])
    return runs


def _decode(decode: Any, ids: list[int]) -> str:
    if decode is None:
        return ""
    try:
        return decode(ids)
    except Exception:  # a tokenizer that cannot decode a partial sequence: the ids still tell
        return ""


def _wire_id(protocol: str, call: Any) -> str:
    """The call id as the client saw it (and as its tool results will refer to it)."""
    if protocol == "messages":
        from jumpahead.proxy.anthropic_messages import tool_use_id

        return tool_use_id(call)
    return call.id


def _json_default(obj: Any) -> Any:
    """Policies' notes may hold anything; a trace line must still be written."""
    for attr in ("as_dict", "to_dict"):
        if callable(getattr(obj, attr, None)):
            return getattr(obj, attr)()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return repr(obj)


def dumps_line(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record, default=_json_default,
                        option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TraceRecorder(BaseHooks):
    """Hooks that record every finished turn into DIR/<safe session id>.jsonl.

    `tokenizer` decodes the provenance runs' text; `model` and `server` go into each
    file's header. Writing happens in `after_turn` (on the event loop, at the end of a
    turn): one orjson encode and one write, a few milliseconds even for long contexts.
    """

    def __init__(self, directory: str | Path, *, tokenizer: Any = None, model: str | None = None,
                 server: dict[str, Any] | None = None, max_open: int = 64, delta: bool = True) -> None:
        self.directory = Path(directory).resolve()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.tokenizer = tokenizer
        self.model = model
        self.server = dict(server or {})
        self.max_open = max_open
        self._fds: OrderedDict[str, int] = OrderedDict()  # session -> O_APPEND fd (LRU)
        self._next: dict[str, int] = {}  # session -> next turn index in its file
        # Each turn line stores what it adds to the session's previous one (traces/delta.py);
        # that previous turn, whole, per session (LRU, as many as open files).
        self.delta = delta
        self._last: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.turns_recorded = 0
        self.errors = 0

    @classmethod
    def for_engine(cls, directory: str | Path, engine: Engine, server: dict[str, Any] | None = None) -> TraceRecorder:
        model = engine.info.name or engine.info.path
        return cls(directory, tokenizer=getattr(engine, "tokenizer", None), model=None if model is None else str(model),
                   server=server)

    # --- paths and files ---------------------------------------------------------------

    def path_for(self, session: str) -> Path:
        """The session's file; the id never reaches the file system unchecked."""
        path = self.directory / f"{safe_file_stem(session or 'unknown')}.jsonl"
        if path.resolve().parent != self.directory:  # e.g. a symlink planted in DIR
            raise TraceError(f"trace file for session {session!r} would leave {self.directory}")
        return path

    def _open(self, session: str) -> int:
        fd = self._fds.get(session)
        if fd is not None:
            self._fds.move_to_end(session)
            return fd
        path = self.path_for(session)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags, 0o644)
        try:
            if session not in self._next:
                existing = os.fstat(fd).st_size
                header = {"type": "session", "format": FORMAT, "version": VERSION, "session": session,
                          "created": _iso(time.time()), "model": self.model, "server": self.server}
                if existing:
                    # A restarted server continues the session's file: keep counting turns.
                    _, turns, _ = read_trace(path)
                    self._next[session] = 1 + max((int(t.get("index", -1)) for t in turns), default=-1)
                    header["resumed"] = True
                    with path.open("rb") as fh:  # (fd is write-only)
                        fh.seek(existing - 1)
                        if fh.read(1) != b"\n":
                            _write(fd, b"\n")  # end a half-written last line, or our header joins it
                else:
                    self._next[session] = 0
                _write(fd, dumps_line(header))
        except BaseException:
            os.close(fd)
            raise
        self._fds[session] = fd
        while len(self._fds) > self.max_open:
            _, old = self._fds.popitem(last=False)
            os.close(old)
        return fd

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()

    # --- the hook --------------------------------------------------------------------

    def after_turn(self, exchange: Exchange, prepared: Any, out: TurnOutput) -> None:
        if exchange is None:
            return
        session = exchange.session_id or "unknown"
        with self._lock:
            try:
                fd = self._open(session)
                index = self._next[session]
                record = self.turn_record(exchange, prepared, out, index)
                line = encode(record, self._last.get(session), dumps_line) if self.delta else record
                self._last.pop(session, None)  # (a failed write must not become a later line's base)
                _write(fd, dumps_line(line))
                self._last[session] = record  # (popped above: now the newest)
                while len(self._last) > self.max_open:
                    self._last.popitem(last=False)
                self._next[session] = index + 1
                self.turns_recorded += 1
            except OSError as exc:
                self.errors += 1
                log.error("trace for session %r not written: %s", session, exc)

    def turn_record(self, exchange: Exchange, prepared: Any, out: TurnOutput, index: int) -> dict[str, Any]:
        now = time.time()
        turn = exchange.turn if exchange.turn is not None else prepared.turn
        record: dict[str, Any] = {
            "type": "turn",
            "index": index,
            "protocol": exchange.protocol,
            "session": exchange.session_id,
            "started": _iso(exchange.started),
            "request": {"headers": redact_headers(exchange.headers), "body": redact_body(exchange.body)},
            "context": turn_to_json(turn),
        }
        original = exchange.original_turn
        if original is not None and original is not turn:
            client = turn_to_json(original)
            if client != record["context"]:  # policies rewrote it: keep what the client sent too
                record["request_context"] = client
        if continues_final_message(turn):
            record["continues"] = True  # the answer continues the context's last assistant message
        record["prompt_tokens"] = len(prepared.request.prompt)
        if prepared.request.methods:
            record["methods"] = list(prepared.request.methods)
        if getattr(prepared, "script_turn", None) is not None:
            record["script_turn"] = prepared.script_turn
        decode = getattr(self.tokenizer, "decode", None)
        record["response"] = {
            "reasoning": out.reasoning,
            "content": out.content,
            "tool_calls": [{**call_to_json(c), "id": _wire_id(exchange.protocol, c), "issues": list(c.issues)}
                           for c in out.tool_calls],
            "finish_reason": out.finish_reason,
            "stop_sequence": out.stop_sequence,
            "error": out.error,
            "runs": provenance_runs(prepared.output_tokens, prepared.output_kinds, prepared.output_sources, decode),
        }
        record["timings"] = self._timings(exchange, prepared, now)
        usage = out.usage
        record["usage"] = {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                           "total_tokens": usage.total_tokens, "cached_tokens": usage.cached_tokens,
                           "fill": usage.fill}
        report = usage.report.to_json()
        if report is not None:  # as the client got it (usage.report)
            record["usage"]["report"] = report
        notes = dict(exchange.notes)
        record["interventions"] = notes.pop("interventions", [])
        if notes:
            record["notes"] = notes
        return record

    @staticmethod
    def _timings(exchange: Exchange, prepared: Any, now: float) -> dict[str, Any]:
        t = prepared.timings
        # chunk_times are perf_counter stamps; the exchange started on the wall clock
        start = time.perf_counter() - (now - exchange.started)
        rounds = []
        for stamp, n, proposed in prepared.chunk_times:
            rounds.append([round((stamp - start) * 1000, 3), n, proposed])
            start = stamp
        return {
            "queue_s": round(getattr(t, "queued_s", 0.0), 6),
            "prefill_s": round(getattr(t, "prefill_s", 0.0), 6),
            "decode_s": round(getattr(t, "decode_s", 0.0), 6),
            "total_s": round(now - exchange.started, 6),
            "rounds": getattr(t, "rounds", 0),
            # per chunk: [ms since the previous chunk (first: since the request), tokens,
            # proposal tokens its round carried (accepted or not)]
            "round_ms": rounds,
        }

    # --- /health ---------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return {"traces": {"dir": str(self.directory), "sessions": len(self._next),
                           "turns": self.turns_recorded, "errors": self.errors}}


def _write(fd: int, data: bytes) -> None:
    """One write() of the whole line (a regular file takes it whole; loop only on the
    rare short write, e.g. a full disk that frees up)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
