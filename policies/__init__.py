"""Intervention policies: what to propose, what to rewrite, when to jump.

What a policy author needs is here: `from jumpahead.policies import Policy, Intervention`
(docs/design.md, Policies; the hooks are described in policies/api.py).
"""

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

__all__ = ["BOUNDARIES", "Boundary", "BoundaryEvent", "Intervention", "Policy", "RequestContext",
           "SessionState", "TurnResult"]
