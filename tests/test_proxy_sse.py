"""SSE helpers: named-event framing and the heartbeat that fills long silences."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from jumpahead.proxy import sse


def test_event_frame():
    assert sse.event("ping", {"type": "ping"}) == b'event: ping\ndata: {"type":"ping"}\n\n'


def test_heartbeat_fills_silences_and_never_loses_an_item():
    closed = []

    async def slow() -> AsyncIterator[int]:
        try:
            for i in range(3):
                await asyncio.sleep(0.12 if i == 1 else 0)
                yield i
        finally:
            closed.append(True)

    async def collect() -> list:
        return [x async for x in sse.with_heartbeat(slow(), 0.05, lambda: b"beat")]

    out = asyncio.run(collect())
    assert [x for x in out if x != b"beat"] == [0, 1, 2]
    assert out.count(b"beat") >= 1 and out.index(b"beat") > out.index(0) and closed == [True]


def test_heartbeat_close_cancels_the_pending_read():
    cancelled = []

    async def forever() -> AsyncIterator[int]:
        try:
            yield 0
            await asyncio.sleep(60)
            yield 1
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def run() -> None:
        beats = sse.with_heartbeat(forever(), 0.01, lambda: b"beat")
        assert await beats.__anext__() == 0
        assert await beats.__anext__() == b"beat"
        await beats.aclose()

    asyncio.run(run())
    assert cancelled == [True]
