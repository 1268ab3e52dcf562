"""The upstream replicas: which one serves a session, which are healthy, their load.

Each agent session goes to one replica, so that replica's prefix cache holds the
session's history: a turn that lands elsewhere pays a cold prefill of all of it.
Sessions map onto a consistent-hash ring (`VNODES` points per replica), so adding or
removing a replica moves only the sessions of the arc it takes or frees. A replica that
fails (connection refused, failed health check) is skipped, its sessions walk on to the
next replica of the ring, and it takes them back once a health check passes again.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

VNODES = 64  # ring points per replica: even spread of sessions across few replicas
ROUTINGS = ("affinity", "round-robin")


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@dataclass
class Replica:
    """One upstream base URL (ending in /v1) and what happened on it."""

    url: str
    healthy: bool = True
    in_flight: int = 0
    requests: int = 0
    errors: int = 0
    failovers: int = 0  # requests of sessions homed elsewhere (their replica was down)
    failed_checks: int = 0  # consecutive failed health checks
    sessions: set[str] = field(default_factory=set)
    last_error: str | None = None
    last_error_at: float | None = None
    ttfb_s: float = 0.0  # summed time to the first upstream byte
    ttfb_n: int = 0

    def report(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "healthy": self.healthy,
            "in_flight": self.in_flight,
            "requests": self.requests,
            "errors": self.errors,
            "failovers": self.failovers,
            "sessions": len(self.sessions),
            "ttfb_ms_mean": round(self.ttfb_s / self.ttfb_n * 1000, 3) if self.ttfb_n else None,
            "ttfb_count": self.ttfb_n,  # responses timed (the upstream's status line and headers)
            "ttfb_s_sum": round(self.ttfb_s, 6),
            "last_error": self.last_error,
            "last_error_age_s": None if self.last_error_at is None else round(time.time() - self.last_error_at, 1),
        }


class ReplicaSet:
    """Routing over the replicas: `order(session)` lists them in the order to try."""

    def __init__(self, urls: list[str], routing: str = "affinity") -> None:
        if not urls:
            raise ValueError("no upstream URL")
        if routing not in ROUTINGS:
            raise ValueError(f"unknown routing {routing!r} (known: {', '.join(ROUTINGS)})")
        self.replicas = [Replica(u) for u in urls]
        self.routing = routing
        self._ring: list[tuple[int, int]] = sorted(
            (_point(f"{r.url}#{v}"), i) for i, r in enumerate(self.replicas) for v in range(VNODES))
        self._keys = [p for p, _ in self._ring]
        self._next = itertools.count()
        self._lock = threading.Lock()

    def home(self, session: str) -> int:
        """The replica a session belongs to when all are healthy (index)."""
        at = bisect.bisect(self._keys, _point(session)) % len(self._ring)
        return self._ring[at][1]

    def order(self, session: str) -> list[Replica]:
        """Replicas to try for a request of `session`: healthy ones first, in ring order
        from the session's point (affinity) or rotating (round-robin); unhealthy ones
        last (tried only when nothing else is left)."""
        n = len(self.replicas)
        if self.routing == "round-robin":
            start = next(self._next) % n
            seq = [(start + k) % n for k in range(n)]
        else:
            at = bisect.bisect(self._keys, _point(session)) % len(self._ring)
            seq, seen = [], set()
            for k in range(len(self._ring)):
                i = self._ring[(at + k) % len(self._ring)][1]
                if i not in seen:
                    seen.add(i)
                    seq.append(i)
                    if len(seq) == n:
                        break
        healthy = [self.replicas[i] for i in seq if self.replicas[i].healthy]
        return healthy + [self.replicas[i] for i in seq if not self.replicas[i].healthy]

    def begin(self, replica: Replica, session: str) -> None:
        failover = self.routing == "affinity" and bool(session) and self.replicas[self.home(session)] is not replica
        with self._lock:
            replica.in_flight += 1
            replica.requests += 1
            replica.failovers += int(failover)
            if session:
                replica.sessions.add(session)

    def end(self, replica: Replica) -> None:
        with self._lock:
            replica.in_flight -= 1

    def failed(self, replica: Replica, message: str, down: bool) -> None:
        """An error on `replica`; `down`: it cannot be reached (skip it until a health check passes)."""
        with self._lock:
            replica.errors += 1
            replica.last_error = message[:500]
            replica.last_error_at = time.time()
            if down:
                replica.healthy = False

    def first_byte(self, replica: Replica, seconds: float) -> None:
        with self._lock:
            replica.ttfb_s += seconds
            replica.ttfb_n += 1

    def mark(self, replica: Replica, healthy: bool, message: str | None = None, *, checks: int = 1) -> None:
        """A health verdict; down only after `checks` failures in a row (one slow
        answer on a loaded machine does not move a replica's sessions)."""
        with self._lock:
            replica.failed_checks = 0 if healthy else replica.failed_checks + 1
            replica.healthy = healthy or (replica.healthy and replica.failed_checks < checks)
            if not healthy and message:
                replica.last_error = message[:500]
                replica.last_error_at = time.time()

    def report(self) -> dict[str, Any]:
        with self._lock:
            return {"routing": self.routing, "replicas": [r.report() for r in self.replicas]}
