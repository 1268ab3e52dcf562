"""Tail windows: replay a session longer than the model's context over its newest part.

A turn whose history does not fit under `max_context` prompt tokens is replayed over
the system message plus the newest messages. The window is re-anchored only in steps:
when the history outgrows it, the oldest messages are dropped in one chunk, down to
`1 - STEP` of the limit, so the following turns keep the same first messages, their
prompts extend each other and the prefix cache keeps hitting; a window that moved
every turn would cost a cold prefill every turn. A window never starts with a tool
result (its call would be missing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jumpahead.core.prompt import render_prompt

from .session import Session

STEP = 0.5  # a re-anchored window starts this share of max_context below the limit
SYSTEM_SHARE = 0.5  # a system message longer than this share of the limit is cut


@dataclass
class Window:
    """The tail window of one session (kept across its replayed turns)."""

    max_context: int
    anchor: int | None = None  # first kept message after the system one (None: whole history)
    reanchors: int = 0
    system_cut: int | None = None  # the system message cut to this many tokens, if it was
    _estimates: list[int] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {"max_context": self.max_context, "reanchors": self.reanchors,
                **({"system_cut_to_tokens": self.system_cut} if self.system_cut else {})}


class WindowTooSmall(ValueError):
    """Not even the newest message fits under the limit."""


def _estimate(tokenizer: Any, session: Session) -> list[int]:
    """Rough prompt tokens per message (its texts plus template overhead)."""
    out = []
    for m in session.messages:
        text = (m.content or "") + (m.reasoning or "") + "".join(c.name + c.arguments for c in m.tool_calls)
        out.append(len(tokenizer.encode(text, add_special_tokens=False)) + 8 + 8 * len(m.tool_calls))
    return out


def _has_system(session: Session) -> bool:
    return bool(session.messages) and session.messages[0].role == "system"


def windowed_turn(session: Session, index: int, anchor: int | None, system_cut: int | None, tokenizer: Any) -> Any:
    """Session.turn(index) over messages[anchor:index] (plus the system message)."""
    turn = session.turn(index)
    if anchor is None and system_cut is None:
        return turn
    msgs = turn.messages
    # turn.messages follow session.context_indices (after an agent's compaction the
    # context is the summary plus what followed), so anchors map through them.
    where = session.context_indices(index)
    head = msgs[:1] if _has_system(session) and where[:1] == [0] else []
    if head and system_cut is not None:
        from jumpahead.core.turn import Message

        ids = tokenizer.encode(head[0].content or "", add_special_tokens=False)[:system_cut]
        head = [Message(role="system", content=tokenizer.decode(ids))]
    start = anchor if anchor is not None else (1 if head else 0)
    first = next((k for k, j in enumerate(where) if j >= start and k >= len(head)), len(msgs))
    turn.messages = head + msgs[first:]
    return turn


def fit(session: Session, index: int, window: Window, tokenizer: Any) -> tuple[Any, list[int], dict[str, Any] | None]:
    """The Turn for assistant message `index`, its prompt ids, and what was dropped
    (None when the whole history is replayed). Moves the window when it must."""
    limit = window.max_context
    if not window._estimates:
        window._estimates = _estimate(tokenizer, session)
    est = window._estimates
    where = session.context_indices(index)
    system = 1 if _has_system(session) and where[:1] == [0] else 0
    if window.anchor is None and window.system_cut is None and sum(est[j] for j in where) <= 2 * limit:
        turn = session.turn(index)
        prompt = render_prompt(tokenizer, turn)
        if len(prompt) <= limit:
            return turn, prompt, None
    if system and window.system_cut is None and est[0] > SYSTEM_SHARE * limit:
        window.system_cut = int(SYSTEM_SHARE * limit)
    if window.anchor is not None:
        turn = windowed_turn(session, index, window.anchor, window.system_cut, tokenizer)
        prompt = render_prompt(tokenizer, turn)
        if len(prompt) <= limit:
            return turn, prompt, _dropped(window, system)
    # Re-anchor: the newest messages that fit under (1 - STEP) of the limit.
    target = int((1 - STEP) * limit)
    first = max(window.anchor or system, system)
    candidates = [j for j in where if j >= first and session.messages[j].role != "tool"]
    if not candidates:
        raise WindowTooSmall(f"turn {index}: no message boundary to start a window at")
    base = min(est[0], window.system_cut or est[0]) if system else 0
    # first guess from the estimates, then step forward until the rendering fits
    pick = 0
    for k, j in enumerate(candidates):
        if base + sum(est[m] for m in where if m >= j) <= target:
            pick = k
            break
    else:
        pick = len(candidates) - 1
    # the estimate's pick may start too early (estimates are rough): walk back to an
    # earlier start while that still fits the target, else forward until it does
    while pick > 0 and len(render_prompt(tokenizer, windowed_turn(
            session, index, candidates[pick - 1], window.system_cut, tokenizer))) <= target:
        pick -= 1
    fallback = None
    for j in candidates[pick:]:
        turn = windowed_turn(session, index, j, window.system_cut, tokenizer)
        prompt = render_prompt(tokenizer, turn)
        if len(prompt) <= limit and fallback is None:
            fallback = (j, turn, prompt)
        if len(prompt) <= target:
            fallback = (j, turn, prompt)
            break
    if fallback is not None:
        j, turn, prompt = fallback
        if window.anchor != j:
            window.reanchors += 1
        window.anchor = j
        return turn, prompt, _dropped(window, system)
    raise WindowTooSmall(f"turn {index}: even the newest message does not fit in {limit} prompt tokens")


def _dropped(window: Window, system: int) -> dict[str, Any]:
    start = window.anchor if window.anchor is not None else system
    return {"dropped_messages": [system, start], "kept_from": start,
            **({"system_cut_to_tokens": window.system_cut} if window.system_cut else {})}
