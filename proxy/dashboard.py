"""The live dashboard: `/dashboard` (a page) and `/dashboard.json` (what it plots).

What jumpahead saves was visible only after the fact (/metrics, replay reports). The
page polls `/dashboard.json` once a second and draws, with plotly.js, the turns as
they end: prompt / cached / generated tokens, generated tokens by provenance, decode
time against the ordinary estimate, policy interventions, the prefix cache's hit
rate, the engine's queue and the sessions in flight.

The data comes from a hook (core/exchange.py) that create_app appends after the
others (so policies have written their interventions): `row_proposers` marks a turn
in flight once it is valid and about to run, `after_turn` records it. The engine's
queue and prefix-cache counters are read from `engine.health()` / `engine.metrics()`.

Access: the page and its scripts are the same for everyone and carry no data, so they
are served like /health (a browser cannot send a key when it opens a URL); the data,
/dashboard.json, needs the API key like every other endpoint. The page takes the key
from its URL fragment (`/dashboard#key=KEY`, never sent to the server) and sends it as
`Authorization: Bearer`. Host and Origin checks apply to all of it (proxy/access.py).
The plotting library is the plotly.js that the `plotly` package (a dependency, MIT)
ships; nothing is fetched from elsewhere, and the page's CSP allows only this server.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict, deque
from importlib import resources
from pathlib import Path
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from jumpahead.engine.interface import Engine
from jumpahead.engine.methods.registry import token_kinds

from jumpahead.core.exchange import BaseHooks, Exchange
from jumpahead.core.turn import TurnOutput

STATIC = Path(__file__).resolve().parent / "static"
PAGE_PATHS = ("/dashboard", "/dashboard/dashboard.js", "/dashboard/dashboard.css", "/dashboard/plotly.min.js")
KINDS = token_kinds()  # the method registry's (engine/methods/registry.py); the page lists its own
MAX_TURNS = 300  # turns kept (the page plots them); older ones only count in the totals
MAX_SESSIONS = 100
MAX_INTERVENTIONS = 50
SESSION_CHARS = 80  # a client's session id as shown (ids are the client's own strings)
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def _kinds(kinds: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in kinds:
        out[k] = out.get(k, 0) + 1
    return out


def ordinary_estimate(completion_tokens: int, decode_s: float, rounds: int, verified: int = 0,
                      token_s: float = 0.0) -> float:
    """Decode seconds ordinary decoding would have taken: one round per token after the
    first (prefill emits the first), each at the turn's mean round time less what its
    `verified` proposal tokens cost (`token_s` each: the engine's fitted per-token
    cost, engine/schedule/width_policy.py). Never less than the turn took: a turn that
    needed a round per token saved nothing."""
    if rounds <= 0 or decode_s <= 0:
        return decode_s
    plain_s = max(decode_s - verified * token_s, 0.5 * decode_s) / rounds
    return max(decode_s, max(completion_tokens - 1, rounds) * plain_s)


def _intervention(iv: dict[str, Any], session: str, ended: float) -> dict[str, Any]:
    """What the page lists of a policy's intervention (policies/runtime.py's note)."""
    out: dict[str, Any] = {"policy": str(iv.get("policy", "?")), "kind": str(iv.get("kind", "request")),
                           "emitted": int(iv.get("emitted", 0) or 0), "session": session, "ended": ended}
    for key in ("tokens_before", "tokens_after"):  # a context rewrite: the prompt before and after
        if isinstance(iv.get(key), int):
            out[key] = iv[key]
    if isinstance(iv.get("decision"), str):
        out["decision"] = iv["decision"][:40]
    return out


class _InFlight:
    """A turn that runs now; `prepared` is weak so a turn nobody ran does not linger."""

    def __init__(self, exchange: Exchange, prepared: Any) -> None:
        self.session = exchange.session_id[:SESSION_CHARS]
        self.protocol = exchange.protocol
        self.started = exchange.started
        self.prompt_tokens = len(prepared.request.prompt)
        self.prepared = weakref.ref(prepared)

    def as_dict(self, now: float) -> dict[str, Any]:
        prepared = self.prepared()
        kinds = list(prepared.output_kinds) if prepared is not None else []
        return {"session": self.session, "protocol": self.protocol, "elapsed_s": round(now - self.started, 2),
                "prompt_tokens": self.prompt_tokens,
                "cached_tokens": int(getattr(prepared, "cached_tokens", 0) or 0),
                "generated": len(kinds), "by_kind": _kinds(kinds)}


class DashboardFeed(BaseHooks):
    """Per-turn records for the dashboard (bounded), sessions, interventions, totals."""

    def __init__(self, engine: Engine | None = None) -> None:
        # the engine's round-cost fit (None in upstream mode): what a proposal token costs
        self._width_policy = getattr(getattr(engine, "scheduler", None), "width_policy", None)
        self._lock = threading.Lock()  # prepare_turn may run the hooks off the event loop
        self.started = time.time()
        self.seq = 0
        self.in_flight: dict[int, _InFlight] = {}
        # Turns collected without an after_turn (a stream never started): their keys,
        # appended by a finalizer that may run inside any allocation, so it takes no lock.
        self._dropped: deque[int] = deque()
        self.turns: deque[dict[str, Any]] = deque(maxlen=MAX_TURNS)
        self.sessions: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.interventions: deque[dict[str, Any]] = deque(maxlen=MAX_INTERVENTIONS)
        self.totals: dict[str, Any] = {"turns": 0, "prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0,
                                       "by_kind": {}, "decode_s": 0.0, "ordinary_s": 0.0, "rounds_saved": 0, "interventions": 0,
                                       "intervention_tokens": 0, "finish": {}}

    # --- hooks ---------------------------------------------------------------------------
    def row_proposers(self, exchange: Exchange, prepared: Any) -> list:
        if exchange is not None:
            key = id(prepared)
            with self._lock:
                self._purge()
                self.in_flight[key] = _InFlight(exchange, prepared)
            weakref.finalize(prepared, self._dropped.append, key)
        return []

    def _purge(self) -> None:
        """(Under the lock.) Forget in-flight turns whose PreparedTurn is gone."""
        while self._dropped:
            key = self._dropped.popleft()
            flight = self.in_flight.get(key)
            if flight is not None and flight.prepared() is None:
                del self.in_flight[key]

    def after_turn(self, exchange: Exchange, prepared: Any, out: TurnOutput) -> None:
        if exchange is None:
            return
        record = self._record(exchange, prepared, out)
        with self._lock:
            self._purge()
            self.in_flight.pop(id(prepared), None)
            self.seq += 1
            record["seq"] = self.seq
            self.turns.append(record)
            self._add_totals(record)
            self._add_session(record)
            for iv in record.pop("intervention_list"):
                self.interventions.append(iv)

    # --- records -------------------------------------------------------------------------
    def _record(self, exchange: Exchange, prepared: Any, out: TurnOutput) -> dict[str, Any]:
        usage = out.usage
        fill = usage.fill if isinstance(usage.fill, dict) else {}
        by_kind = fill.get("tokens") if isinstance(fill.get("tokens"), dict) else _kinds(prepared.output_kinds)
        timings = prepared.timings
        decode_s = float(getattr(timings, "decode_s", 0.0) or 0.0)
        rounds = int(getattr(timings, "rounds", 0) or 0)
        verified = fill.get("verified") if isinstance(fill.get("verified"), dict) else {}
        ordinary_s = ordinary_estimate(usage.completion_tokens, decode_s, rounds, int(verified.get("proposed", 0) or 0),
                                       self._token_s())
        ended = time.time()
        session = exchange.session_id[:SESSION_CHARS]
        ivs = [_intervention(iv, session, ended) for iv in exchange.notes.get("interventions", [])
               if isinstance(iv, dict)]
        return {"session": session, "protocol": exchange.protocol, "ended": ended,
                "duration_s": round(ended - exchange.started, 3), "prompt_tokens": usage.prompt_tokens,
                "cached_tokens": usage.cached_tokens, "completion_tokens": usage.completion_tokens,
                "by_kind": {str(k): int(v) for k, v in by_kind.items()}, "decode_s": round(decode_s, 4),
                "prefill_s": round(float(getattr(timings, "prefill_s", 0.0) or 0.0), 4), "rounds": rounds,
                "ordinary_s": round(ordinary_s, 4), "saved_s": round(ordinary_s - decode_s, 4),
                "rounds_saved": max(0, usage.completion_tokens - 1 - rounds),
                "finish": out.finish_reason, "tool_calls": len(out.tool_calls), "interventions": len(ivs),
                "intervention_list": ivs}

    def _token_s(self) -> float:
        try:
            return float(self._width_policy.costs()[1]) if self._width_policy is not None else 0.0
        except Exception:  # an estimate: never fail a turn's record for it
            return 0.0

    def _add_totals(self, r: dict[str, Any]) -> None:
        t = self.totals
        t["turns"] += 1
        for key in ("prompt_tokens", "cached_tokens", "completion_tokens", "interventions"):
            t[key] += r[key]
        t["decode_s"] += r["decode_s"]
        t["rounds_saved"] += r["rounds_saved"]
        t["ordinary_s"] += r["ordinary_s"]
        t["intervention_tokens"] += sum(iv["emitted"] for iv in r["intervention_list"])
        for kind, n in r["by_kind"].items():
            t["by_kind"][kind] = t["by_kind"].get(kind, 0) + n
        t["finish"][r["finish"]] = t["finish"].get(r["finish"], 0) + 1

    def _add_session(self, r: dict[str, Any]) -> None:
        s = self.sessions.pop(r["session"], None) or {
            "session": r["session"], "protocol": r["protocol"], "turns": 0, "first_seen": r["ended"],
            "completion_tokens": 0, "supplied_tokens": 0, "saved_s": 0.0, "interventions": 0}
        s["turns"] += 1
        s["last_seen"] = r["ended"]
        s["last_prompt_tokens"] = r["prompt_tokens"]
        s["last_cached_tokens"] = r["cached_tokens"]
        s["completion_tokens"] += r["completion_tokens"]
        s["supplied_tokens"] += r["completion_tokens"] - r["by_kind"].get("sampled", 0)
        s["saved_s"] = round(s["saved_s"] + r["saved_s"], 4)
        s["interventions"] += r["interventions"]
        self.sessions[r["session"]] = s
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)

    def snapshot(self) -> dict[str, Any]:
        """Everything the page shows (the engine's part is added by the route)."""
        now = time.time()
        with self._lock:
            self._purge()
            flights = [f.as_dict(now) for f in list(self.in_flight.values())]
            totals = {**self.totals, "by_kind": dict(self.totals["by_kind"]), "finish": dict(self.totals["finish"])}
            turns = list(self.turns)
            sessions = [dict(s) for s in reversed(self.sessions.values())]
            interventions = list(reversed(self.interventions))
            seq = self.seq
        busy: dict[str, int] = {}
        for f in flights:
            busy[f["session"]] = busy.get(f["session"], 0) + 1
        for s in sessions:
            s["in_flight"] = busy.pop(s["session"], 0)
        sessions = [{"session": name, "protocol": next(f["protocol"] for f in flights if f["session"] == name),
                     "turns": 0, "in_flight": n} for name, n in busy.items()] + sessions
        totals["decode_s"] = round(totals["decode_s"], 4)
        totals["ordinary_s"] = round(totals["ordinary_s"], 4)
        totals["saved_s"] = round(totals["ordinary_s"] - totals["decode_s"], 4)
        return {"now": now, "seq": seq, "since": self.started, "in_flight": flights, "turns": turns,
                "sessions": sessions, "interventions": interventions, "totals": totals}


# --- routes --------------------------------------------------------------------------


def _engine_part(engine: Engine) -> dict[str, Any]:
    """Queue and prefix cache from the engine (upstream mode reports less: None then)."""
    try:
        health = dict(engine.health())
    except Exception:  # the page must answer even when the engine is broken
        health = {}
    try:
        metrics = dict(engine.metrics())
    except Exception:
        metrics = {}
    cache = metrics.get("prefix_cache") if isinstance(metrics.get("prefix_cache"), dict) else None
    keep = ("lookups", "hits", "hit_rate", "prompt_tokens", "cached_tokens", "token_hit_rate", "ssd_hits")
    return {"model": health.get("model"), "status": health.get("status", "ok"),
            "queue": {k: health.get(k) for k in ("rows_running", "rows_waiting", "max_batch")},
            "prefix_cache": {k: cache.get(k) for k in keep} if cache is not None else None,
            "width_policy": metrics.get("width_policy")}


async def dashboard_json(request: Request) -> Response:
    feed: DashboardFeed = request.app.state.dashboard
    report = feed.snapshot()
    report["engine"] = _engine_part(request.app.state.engine)
    policies = None
    for hook in request.app.state.hooks:  # the policy runtime's counters (proxy /metrics' section)
        section = getattr(hook, "metrics", None)
        if callable(section):
            found = section()
            policies = found.get("policies", policies) if isinstance(found, dict) else policies
    report["policies"] = policies
    return Response(orjson.dumps(report), media_type="application/json", headers={"cache-control": "no-store"})


def _static(name: str, media_type: str) -> Any:
    async def serve(request: Request) -> Response:
        headers = {"content-security-policy": CSP, "x-content-type-options": "nosniff", "cache-control": "no-cache"}
        return FileResponse(STATIC / name, media_type=media_type, headers=headers)
    return serve


def plotly_js() -> Path:
    """plotly.min.js as the `plotly` package ships it."""
    return Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))


async def plotly_route(request: Request) -> Response:
    return FileResponse(plotly_js(), media_type="text/javascript",
                        headers={"cache-control": "public, max-age=86400", "x-content-type-options": "nosniff"})


def dashboard_routes() -> list[Route]:
    return [
        Route("/dashboard", _static("dashboard.html", "text/html; charset=utf-8"), methods=["GET"]),
        Route("/dashboard/dashboard.js", _static("dashboard.js", "text/javascript"), methods=["GET"]),
        Route("/dashboard/dashboard.css", _static("dashboard.css", "text/css"), methods=["GET"]),
        Route("/dashboard/plotly.min.js", plotly_route, methods=["GET"]),
        Route("/dashboard.json", dashboard_json, methods=["GET"]),
    ]
