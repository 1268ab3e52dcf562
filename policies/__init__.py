"""Intervention policies: what to propose, what to rewrite, when to jump.

What a policy author needs is here (docs/design.md, Policies; the hooks are described
in policies/api.py):

    from jumpahead.policies import Policy, Intervention, RequestContext

- the hooks' data: `Policy`, `RequestContext`, `SessionState`, `BoundaryEvent`,
  `Boundary`/`BOUNDARIES`, `Intervention`, `TurnResult` (policies/api.py);
- for `proposers(ctx)`: `Proposer` (the protocol a row's proposer follows), `Proposal`,
  `RowView` (engine/methods/proposal.py);
- for `on_request(ctx)` rewrites: the request's context, `Turn`, `Message`, `ToolCall`,
  `Tool` (core/turn.py; imported when first asked for, so importing this package
  pulls in no core module).
"""

from __future__ import annotations

from typing import Any

from jumpahead.engine.methods.proposal import Proposal, Proposer, RowView

from .api import (
    BOUNDARIES,
    Boundary,
    BoundaryEvent,
    Intervention,
    Policy,
    RequestContext,
    SessionState,
    TurnResult,
)

_CONTEXT = ("Message", "Tool", "ToolCall", "Turn")  # from core/turn.py, on first use

__all__ = ["BOUNDARIES", "Boundary", "BoundaryEvent", "Intervention", "Message", "Policy", "Proposal",
           "Proposer", "RequestContext", "RowView", "SessionState", "Tool", "ToolCall", "Turn", "TurnResult"]


def __getattr__(name: str) -> Any:
    if name in _CONTEXT:
        from jumpahead.core import turn

        value = getattr(turn, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
