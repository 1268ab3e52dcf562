"""Compaction on request: the Responses API's /v1/responses/compact and context_management.

Here the agent asks for its context to be compacted now (Codex's /compact, or a prompt
over the threshold it set), so the sticky policy's economics (is the removed text worth
a re-prefill? `clear_at_least`, `horizon`) do not apply: every finished step that the
compaction policy (policies/compaction.py) can shrink is rewritten, with its options
(mode, target, min_tokens, max_chars, summary_tokens). The messages an earlier
compaction item already stands for (`keep`) stay exactly as they are, so their prompt
tokens, and the prefix cache built on them, carry over. Nothing is remembered here:
the client carries the result in the compaction item (proxy/compaction_item.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .api import RequestContext, SessionState
from .compaction import Compaction
from .sticky import render

if TYPE_CHECKING:
    from jumpahead.core.turn import Message, Turn

FORCED = {"clear_at_least": "0", "horizon": str(10**9)}  # any saving is worth it: the agent asked


class OnDemandCompaction(Compaction):
    """The compaction policy without its trigger, leaving the first `keep` messages alone."""

    def __init__(self, keep: int = 0, **options: str) -> None:
        super().__init__(**{**options, **FORCED})
        self.keep = keep

    def candidates(self, messages: list["Message"], protected_from: int) -> list[int]:
        return [i for i in super().candidates(messages, protected_from) if i >= self.keep]


@dataclass
class Compacted:
    turn: "Turn"  # the compacted context (the input Turn itself when nothing could be compacted)
    tokens_before: int
    tokens_after: int
    notes: list[dict[str, Any]] = field(default_factory=list)  # the policy's report

    @property
    def changed(self) -> bool:
        return self.tokens_after != self.tokens_before or any(n.get("decision") == "rewritten" for n in self.notes)


def compact_turn(turn: "Turn", tokenizer: Any, context_length: int, *, keep: int = 0,
                 options: dict[str, str] | None = None, generate: Callable[[str, int], str] | None = None,
                 tokens_before: int | None = None) -> Compacted:
    """Compact `turn` now. Raises ValueError for a bad option (the caller's 400)."""
    policy = OnDemandCompaction(keep, **(options or {}))
    ctx = RequestContext(turn=turn, session=SessionState("compact"), tokenizer=tokenizer,
                         context_length=context_length, generate=generate)
    before = tokens_before if tokens_before is not None else len(render(tokenizer, turn))
    new = policy.on_request(ctx)
    if new is None or new is turn:
        return Compacted(turn, before, before, list(ctx.notes))
    return Compacted(new, before, len(render(tokenizer, new)), list(ctx.notes))
