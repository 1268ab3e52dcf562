"""A per-thread count of nested holds: the switches the engine's forwards read (its fast
paths on, a host path held off, work kept on one thread) are held by whoever runs a
forward on that thread and seen by nothing running on another."""

from __future__ import annotations

import threading


class Held:
    """`with held:` holds it on this thread (nestable); `held.on` says whether it is held."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __enter__(self) -> None:
        self._local.n = getattr(self._local, "n", 0) + 1

    def __exit__(self, *exc: object) -> None:
        self._local.n -= 1

    @property
    def on(self) -> bool:
        return getattr(self._local, "n", 0) > 0
