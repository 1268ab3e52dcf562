"""One request/answer exchange with an agent, and the hooks that watch it.

The server builds an `Exchange` per generation request (protocol, headers, body, the
agent session it belongs to) and hands it to the runner. Hooks registered on the app
(`app.state.hooks`: the policy runtime, the trace recorder, script mode) see it at
these points:

- `before_render(exchange, turn) -> Turn`: rewrite the context (policies.on_request);
- `take_output(engine, exchange, prepared) -> bool` (optional): supply the row's whole
  output before the engine runs, by setting the prepared request's prompt and
  proposers (script mode, core/script.py); the first hook that returns True takes it,
  and the turn then gets no strict fill of its own;
- `row_proposers(exchange, prepared) -> list`: extra engine proposers for the row;
- `after_turn(exchange, prepared, out)`: the finished turn with its provenance.

A hook that raises in `after_turn` is logged and never fails the request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from .turn import Turn, TurnOutput


@dataclass
class Exchange:
    protocol: str  # "chat" | "messages" | "responses"
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    session_id: str = ""
    started: float = field(default_factory=time.time)
    original_turn: Turn | None = None  # the context as the client sent it (before policies)
    turn: Turn | None = None  # the context after policies (what was rendered)
    notes: dict[str, Any] = field(default_factory=dict)  # hooks' reports (interventions, fit, ...)
    # Hooks' private per-exchange state between their calls (the policy runtime's run);
    # not part of any report.
    state: dict[str, Any] = field(default_factory=dict, repr=False)


class TurnHooks(Protocol):
    def before_render(self, exchange: Exchange, turn: Turn) -> Turn: ...

    def row_proposers(self, exchange: Exchange, prepared: Any) -> list: ...

    def after_turn(self, exchange: Exchange, prepared: Any, out: TurnOutput) -> None: ...


class BaseHooks:
    """No-op hooks to subclass."""

    def before_render(self, exchange: Exchange, turn: Turn) -> Turn:
        return turn

    def take_output(self, engine: Any, exchange: Exchange, prepared: Any) -> bool:
        return False

    def row_proposers(self, exchange: Exchange, prepared: Any) -> list:
        return []

    def after_turn(self, exchange: Exchange, prepared: Any, out: TurnOutput) -> None:
        return None
