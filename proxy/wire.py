"""What an HTTP wire protocol is: the interface proxy/server.py drives.

One generic handler (proxy/server.py `generation_handler`) serves every generation
protocol: read the JSON body, `wire.parse` it into a Turn, run the turn pipeline
(prepare_turn -> the engine -> OutputEvents), and hand the result back to the protocol:
`wire.body(out)` for a plain answer, `wire.stream(prepared)` for SSE. The three wire
protocols are `ChatProtocol` (proxy/openai_chat.py), `MessagesProtocol`
(proxy/anthropic_messages.py) and `ResponsesProtocol` (proxy/openai_responses.py).

A protocol object serves one request (it keeps what the request's parse found, such
as the Responses context); a route holds its factory, `ProtocolFactory`, called with the
request's `WireContext`. A new protocol is a module with a `WireProtocol` and one route line.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from jumpahead.engine.interface import Engine

    from .response_store import ResponseStore
    from jumpahead.core.turn_runner import PreparedTurn
    from .signing import Signer
    from jumpahead.core.turn import OutputEvent, Turn, TurnOutput


@dataclass
class WireContext:
    """What the server hands a wire protocol for one request."""

    engine: "Engine"
    stats: Counter[str]  # the server's counters (/metrics `server`)
    signer: "Signer"  # signs reasoning handed out (proxy/signing.py)
    responses: "ResponseStore"  # stored Responses (previous_response_id)


@runtime_checkable
class WireStream(Protocol):
    """One streamed answer in a protocol's SSE framing (bytes frames)."""

    # A ping frame for long silences (None: the protocol sends none).
    heartbeat: Callable[[], bytes] | None

    def start(self) -> Iterable[bytes]:
        """The frames before the first event."""
        ...

    def encode(self, event: "OutputEvent") -> Iterable[bytes]:
        """The frames of one OutputEvent."""
        ...

    def fail(self, message: str) -> Iterable[bytes]:
        """The frames that end the stream after a fault mid-stream (the protocol's
        terminal events follow from `end`)."""
        ...

    def end(self) -> Iterable[bytes]:
        """The last frames (after the events, also after a fault; not when the client
        went away); what the answer leaves behind (a stored response) is kept here."""
        ...


@runtime_checkable
class WireProtocol(Protocol):
    """One generation protocol for one request: body -> Turn, answer -> body or stream."""

    protocol: str  # the Exchange's protocol ("chat", "messages", "responses")

    async def parse(self, body: Any) -> "Turn":
        """The request's Turn; an APIError (4xx) for a bad body."""
        ...

    def body(self, out: "TurnOutput", model: str) -> dict[str, Any]:
        """The JSON answer of a finished (not failed) turn."""
        ...

    def stream(self, prepared: "PreparedTurn", model: str) -> WireStream:
        """The SSE encoder of a streamed turn."""
        ...


ProtocolFactory = Callable[[WireContext], WireProtocol]
