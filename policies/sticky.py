"""Sticky message rewrites: decided once per session, reproduced byte for byte after.

Agents resend the whole history every turn. A rewrite (compaction, masking, thinking
clearing) that is decided at turn n must give the same bytes at turn n+1, n+2, ..., or
every turn pays a full prefill (docs/design.md, Policies). `StickyRewrite` keeps each
rewritten message in the session memo, keyed by a stable identity of the original
message, and applies the memo before it looks for new candidates. New rewrites are
considered only after the last edit point already committed, and committed only when
the tokens they remove pay for re-prefilling everything after the first new edit point:

    removed >= clear_at_least  and  removed * horizon >= re-prefilled tokens

(`horizon`: how many later turns the saving is counted over.)

`sticky=false` (an option of every subclass) decides afresh on every request, as a
stateless rewriter would: no memo of earlier rewrites, no frontier; only the cache of
message sizes is kept. It exists to measure what stickiness buys (replay arms
`compaction:sticky=false`): an account that depends on later messages, or a trigger
that fires differently as the history grows, changes an earlier message and the prefix
cache misses from there.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import weakref
from typing import TYPE_CHECKING, Any

import orjson

from .api import Policy, RequestContext

if TYPE_CHECKING:
    from jumpahead.core.turn import Message, Turn

log = logging.getLogger(__name__)


def message_identity(message: "Message") -> str:
    """A stable key for a message as the agent resends it (role, texts, tool calls)."""
    payload = [message.role, message.content or "", message.reasoning or "", message.tool_call_id or "",
               [[c.id, c.name, c.arguments] for c in message.tool_calls]]
    return hashlib.sha256(orjson.dumps(payload)).hexdigest()[:32]


def last_turn_start(messages: list["Message"]) -> int:
    """Index of the newest assistant message: it and everything after it (its tool
    results, the pending user instruction) are never rewritten. 0 where there is no
    assistant message (nothing is rewritten)."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "assistant":
            return i
    return 0


def tool_results(messages: list["Message"]) -> dict[str, "Message"]:
    """Tool result messages by the call id they answer."""
    return {m.tool_call_id: m for m in messages if m.role == "tool" and m.tool_call_id}


def calls_completed(messages: list["Message"], index: int, results: dict[str, "Message"]) -> bool:
    """The assistant message at `index` made tool calls and every one has its result later."""
    message = messages[index]
    if message.role != "assistant" or not message.tool_calls:
        return False
    later = {m.tool_call_id for m in messages[index + 1:] if m.role == "tool"}
    return all(c.id in later and c.id in results for c in message.tool_calls)


def text_tokens(tokenizer: Any, text: str | None) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False)) if text else 0


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def int_option(options: dict[str, Any], name: str, default: int) -> int:
    value = options.get(name, default)
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"option {name}={value!r} is not an integer") from None
    if out < 0:
        raise ValueError(f"option {name}={value!r} must not be negative")
    return out


def bool_option(options: dict[str, Any], name: str, default: bool) -> bool:
    value = options.get(name, default)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"option {name}={value!r} is not a boolean (true or false)")


def with_messages(turn: "Turn", messages: list["Message"]) -> "Turn":
    """A new Turn with these messages (the input Turn is never mutated)."""
    return dataclasses.replace(turn, messages=messages)


class StickyRewrite(Policy):
    """Base of the sticky message rewriters. Subclasses say which messages are
    candidates and how one is rewritten; this class memoises, triggers and reports."""

    name = "sticky"
    default_clear_at_least = 1024
    default_horizon = 8

    def __init__(self, **options: str) -> None:
        super().__init__(**options)
        self.clear_at_least = int_option(self.options, "clear_at_least", self.default_clear_at_least)
        self.horizon = max(1, int_option(self.options, "horizon", self.default_horizon))
        self.sticky = bool_option(self.options, "sticky", True)

    # --- for subclasses -------------------------------------------------------------
    def candidates(self, messages: list["Message"], protected_from: int) -> list[int]:
        """Indices (< protected_from) this policy would rewrite, oldest first."""
        raise NotImplementedError

    def rewrite(self, ctx: RequestContext, messages: list["Message"], index: int) -> "Message | None":
        """The rewritten message (a new object), or None where a rewrite gains nothing."""
        raise NotImplementedError

    def finalize(self, ctx: RequestContext, messages: list["Message"], chosen: dict[int, "Message"]) -> dict[int, "Message"]:
        """Last chance to replace the chosen rewrites once the trigger fired (model summaries)."""
        return chosen

    # --- the machinery --------------------------------------------------------------
    def memo(self, ctx: RequestContext) -> dict[str, Any]:
        memo = ctx.session.memo.setdefault(f"sticky:{self.name}", {"rewrites": {}, "frontier": None, "commits": 0})
        if self.sticky:
            return memo
        # Non-sticky: a throwaway memo per request; message sizes are pure, so shared.
        return {"rewrites": {}, "frontier": None, "commits": 0, "sizes": memo.setdefault("sizes", {})}

    def on_request(self, ctx: RequestContext) -> "Turn | None":
        memo = self.memo(ctx)
        original = ctx.turn.messages
        protected_from = last_turn_start(original)
        messages = list(original)
        identities = [message_identity(m) for m in original]
        replayed = 0
        for i in range(protected_from):
            stored = memo["rewrites"].get(identities[i])
            if stored is not None:
                messages[i] = dataclasses.replace(stored)  # a copy: the memo's object stays pristine
                replayed += 1
        base = with_messages(ctx.turn, messages) if replayed else ctx.turn

        frontier = -1
        if memo["frontier"] is not None:
            frontier = next((i for i in range(protected_from - 1, -1, -1) if identities[i] == memo["frontier"]), -1)
        todo = [i for i in self.candidates(original, protected_from)
                if i > frontier and identities[i] not in memo["rewrites"]]
        chosen: dict[int, "Message"] = {}
        for i in todo:
            new = self.rewrite(ctx, original, i)
            if new is not None:
                chosen[i] = new
        note: dict[str, Any] = {"policy": self.name, "replayed": replayed}
        if not self.sticky:
            note["sticky"] = False
        if not chosen:
            if replayed:
                ctx.notes.append(note)
            return base if replayed else None

        # Estimate with text tokens which suffix of the candidates pays for itself (a
        # later first edit point re-prefills less); render only that one to confirm.
        chosen, estimate = self._best_suffix(ctx, original, chosen, identities, memo)
        if not chosen:
            note.update(pending=len(todo), estimate=estimate, decision="not worth it yet")
            ctx.notes.append(note)
            return base if replayed else None

        chosen = self.finalize(ctx, original, chosen)
        trial = list(messages)
        for i, m in chosen.items():
            trial[i] = m
        candidate = with_messages(ctx.turn, trial)
        try:
            before = render(ctx.tokenizer, base)
            after = render(ctx.tokenizer, candidate)
        except Exception as exc:  # a template that refuses the shape: leave the request as it is
            log.warning("%s: cannot render to count tokens (%s); no rewrite", self.name, exc)
            return base if replayed else None
        removed = len(before) - len(after)
        reprefill = len(after) - common_prefix(before, after)
        edit_point = min(chosen)
        note.update(segments=len(chosen), tokens_before=len(before), tokens_after=len(after), removed=removed,
                    reprefill=reprefill, edit_point=edit_point)
        if removed < self.clear_at_least or removed * self.horizon < reprefill:
            note["decision"] = "not worth the re-prefill" if removed >= self.clear_at_least else "below clear_at_least"
            ctx.notes.append(note)
            return base if replayed else None
        for i, m in chosen.items():
            memo["rewrites"][identities[i]] = dataclasses.replace(m)
        memo["frontier"] = identities[max(chosen)]
        memo["commits"] += 1
        note["decision"] = "rewritten"
        note.update(self.describe(chosen))
        ctx.notes.append(note)
        log.info("%s: %d messages rewritten from message %d: %d -> %d prompt tokens (%d re-prefilled once)",
                 self.name, len(chosen), edit_point, len(before), len(after), reprefill)
        return candidate

    def _best_suffix(self, ctx: RequestContext, original: list["Message"], chosen: dict[int, "Message"],
                     identities: list[str], memo: dict[str, Any]) -> tuple[dict[int, "Message"], int]:
        """The rewrites from the earliest first edit point that passes the trigger by
        estimate (removed tokens; tokens after the edit point), or ({}, best estimate)."""
        sizes = memo.setdefault("sizes", {})  # identity -> text tokens (messages are resent unchanged)

        def size(i: int) -> int:
            if identities[i] not in sizes:
                sizes[identities[i]] = _message_tokens(ctx.tokenizer, original[i])
            return sizes[identities[i]]

        with_reasoning = renders_reasoning(ctx.tokenizer)
        gain = {i: _message_tokens(ctx.tokenizer, original[i], with_reasoning)
                - _message_tokens(ctx.tokenizer, m, with_reasoning) for i, m in chosen.items()}
        order = sorted(chosen)
        tail = 0  # text tokens from the candidate on to the end
        removed = 0
        best: int | None = None
        best_removed = 0
        for n in range(len(order) - 1, -1, -1):
            start = order[n]
            end = order[n + 1] if n + 1 < len(order) else len(original)
            tail += sum(size(i) for i in range(start, end))
            removed += gain[start]
            if removed >= self.clear_at_least and removed * self.horizon >= tail - removed:
                best = n  # keep going: an earlier start that still pays removes more
            best_removed = max(best_removed, removed)
        if best is None:
            return {}, best_removed
        return {i: chosen[i] for i in order[best:]}, best_removed

    def describe(self, chosen: dict[int, "Message"]) -> dict[str, Any]:
        """Extra fields for the note (subclasses: mode, fallbacks)."""
        return {}


def _message_tokens(tokenizer: Any, message: "Message", with_reasoning: bool = True) -> int:
    """Text tokens of a message (content, reasoning where the template shows it, calls)."""
    parts = [message.content or ""]
    if with_reasoning:
        parts.append(message.reasoning or "")
    parts.extend(f"{c.name} {c.arguments}" for c in message.tool_calls)
    return text_tokens(tokenizer, "\n".join(p for p in parts if p))


_RENDERS_REASONING: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def renders_reasoning(tokenizer: Any) -> bool:
    """Whether the chat template shows an earlier assistant message's reasoning (many
    drop it; then rewriting reasoning changes no prompt token). Probed once per tokenizer."""
    key = tokenizer
    if key not in _RENDERS_REASONING:
        from jumpahead.core.turn import Message, ToolCall, Turn

        probe = "zqxprobe reasoning marker"
        turn = Turn(messages=[Message("user", "hi"),
                              Message("assistant", "ok", reasoning=probe, tool_calls=[ToolCall("f", "{}", "c1")]),
                              Message("tool", "done", tool_call_id="c1"), Message("user", "next")])
        try:
            ids = render(tokenizer, turn)
            _RENDERS_REASONING[key] = "zqxprobe" in tokenizer.decode(ids)
        except Exception:  # cannot tell: assume it does (the exact render check decides)
            _RENDERS_REASONING[key] = True
    return _RENDERS_REASONING[key]


def render(tokenizer: Any, turn: "Turn") -> list[int]:
    """Prompt token ids of `turn` under the tokenizer's chat template (as the server renders)."""
    from jumpahead.core.prompt import render_prompt

    return render_prompt(tokenizer, turn)


