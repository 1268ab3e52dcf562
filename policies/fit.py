"""`fit`: shrink a prompt that does not fit the model's window, cheapest step first.

A prompt fits when its tokens leave `reserve` tokens of the window for the answer
(option reserve; default max(1024, the request's max_tokens), capped at an eighth of
the window or 1024, whichever is more). Steps, applied in order until the prompt fits:

1. `mask`: tool results before the last turn become one-line placeholders;
2. `clear-thinking`: the reasoning of assistant messages before the last turn is dropped;
3. `short-tools`: tool descriptions cut to their first sentence (names and parameter
   schemas kept, the schemas' own descriptions clipped);
4. `bare-tools`: tool descriptions cut to 80 characters, schema descriptions (and
   `$schema` tags) dropped;
5. `cut-middle`: the leading system messages, the first user message and the newest
   messages that fit are kept (a last turn over half the room is clipped first); a note
   `[N earlier messages omitted ...]` stands for the rest; a tool call and its results
   are never split. The cut lies on a grid: the first message at least k blocks (a
   third of the room the head leaves) into the history, k the fewest that fit;
6. `clip`: long texts (content, reasoning, string arguments of tool calls) of the
   messages between the head and the last turn keep their head and tail;
7. `clip-head`: the system messages and the first user message too;
8. `clip-last`: the last turn's messages too (a huge pending tool result).

Sticky: the steps a session needed stay applied at its later turns (each is a pure
function of the history, and the cut only moves later), so consecutive turns share a
prefix. The cut's grid is counted from the head in the messages' own tokens, so an
appended message moves no grid point: the cut stays while the history grows by less
than a block, then skips a whole block, and a restarted server (no memo) places it
where the session had it. What was done goes to ctx.notes (the runtime reports it in usage).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import orjson

from .api import Policy, RequestContext
from .compaction import placeholder
from .sticky import int_option, last_turn_start, message_identity, render, with_messages

if TYPE_CHECKING:
    from jumpahead.core.turn import Message, Tool, ToolCall, Turn

log = logging.getLogger(__name__)

STEPS = ("mask", "clear-thinking", "short-tools", "bare-tools", "cut-middle", "clip", "clip-head", "clip-last")
_MIN_MASK_CHARS = 120  # shorter results are about as long as their placeholder
_MIN_CLIP = 512  # characters a clipped message keeps at least (head and tail)
_OMITTED = "earlier messages omitted to fit the model's context"


def reserve_for(turn: "Turn", context_length: int, reserve: int | None = None) -> int:
    """Tokens kept free for the answer."""
    if reserve is not None:
        return min(reserve, context_length - 1)
    # an agent asks for far more (Claude Code: 32000) than one turn needs; an eighth of
    # the window (at least 1024) leaves room for a tool call or a short answer
    return min(max(1024, turn.max_tokens or 0), max(1024, context_length // 8), context_length // 2)


class Fit(Policy):
    """Shrink prompts that exceed the window (`--policy fit[:reserve=N]`)."""

    name = "fit"

    def __init__(self, **options: str) -> None:
        super().__init__(**options)
        self.reserve = int_option(self.options, "reserve", 0) if "reserve" in self.options else None
        self._clipped_last = False

    def on_request(self, ctx: RequestContext) -> "Turn | None":
        turn = ctx.turn
        limit = ctx.context_length - reserve_for(turn, ctx.context_length, self.reserve)
        memo = ctx.session.memo.setdefault("fit", {"level": 0, "cut": None})
        if memo["level"] == 0 and _surely_fits(turn, limit):
            return None
        size = len(render(ctx.tokenizer, turn))
        if size <= limit and memo["level"] == 0:
            return None
        before = size
        applied: list[str] = []
        current = turn
        level = 0
        while level < len(STEPS) and (level < memo["level"] or size > limit):
            step = STEPS[level]
            shrunk = self._apply(step, ctx, current, limit, memo)
            level += 1
            if shrunk is not current:  # a step with nothing to do costs no render
                if step != "cut-middle" or any(_OMITTED in (m.content or "")[:80] for m in shrunk.messages):
                    applied.append(step)
                if self._clipped_last:  # the cut clipped a huge last turn first
                    applied.append("clip-last")
                    self._clipped_last = False
                current = shrunk
                size = len(render(ctx.tokenizer, current))
        memo["level"] = max(memo["level"], level)
        note: dict[str, Any] = {"policy": "fit", "steps": applied, "tokens_before": before, "tokens_after": size,
                                "limit": limit, "context_length": ctx.context_length}
        if memo["cut"] is not None and "cut-middle" in applied:
            note["omitted_messages"] = memo["cut"]["omitted"]
        if size > limit:
            note["fitted"] = False
            ctx.notes.append(note)
            log.warning("fit: %d prompt tokens after %s, still over the %d-token limit", size, ", ".join(applied),
                        limit)
            return None  # the engine answers context_length_exceeded
        note["fitted"] = True
        ctx.notes.append(note)
        log.info("fit: %d -> %d prompt tokens (limit %d) by %s", before, size, limit, ", ".join(applied))
        return current

    # --- the steps ------------------------------------------------------------------
    def _apply(self, step: str, ctx: RequestContext, turn: "Turn", limit: int, memo: dict[str, Any]) -> "Turn":
        messages = list(turn.messages)
        last = last_turn_start(messages)
        changed = False
        if step == "mask":
            for i in range(last):
                m = messages[i]
                if m.role == "tool" and len(m.content or "") >= _MIN_MASK_CHARS:
                    messages[i] = dataclasses.replace(m, content=placeholder(m.content or ""))
                    changed = True
            return with_messages(turn, messages) if changed else turn
        if step == "clear-thinking":
            for i in range(last):
                if messages[i].role == "assistant" and messages[i].reasoning:
                    messages[i] = dataclasses.replace(messages[i], reasoning=None)
                    changed = True
            return with_messages(turn, messages) if changed else turn
        if step in ("short-tools", "bare-tools"):
            if not turn.tools:
                return turn
            bare = step == "bare-tools"
            return dataclasses.replace(turn, tools=[shorten_tool(t, bare) for t in turn.tools])
        if step == "cut-middle":
            return self._cut_middle(ctx, turn, limit, memo)
        return self._clip(ctx, turn, limit, memo, step)

    def _cut_middle(self, ctx: RequestContext, turn: "Turn", limit: int, memo: dict[str, Any]) -> "Turn":
        messages = turn.messages
        # identities of the request's own messages: earlier steps rewrite messages in
        # place (same positions) but differently once a message leaves the last turn
        originals = ctx.turn.messages
        head = _head_length(messages)
        starts = [i for i in range(head, len(messages)) if messages[i].role != "tool"]
        if not starts:
            return turn
        turn = self._shrink_huge_last_turn(ctx, turn, head, limit, memo)
        messages = turn.messages
        previous = memo["cut"]
        floor = 0  # the cut only moves later: start no earlier than last time
        if previous is not None:
            floor = next((n for n, i in enumerate(starts) if message_identity(originals[i]) == previous["first_kept"]), 0)

        def cut(n: int) -> "Turn":
            return _omit(turn, head, starts[n])

        # The cut lies on a grid the history's growth does not move: the first message
        # that starts at least k blocks (a third of the room the head leaves) after the
        # head, k the fewest that fit. A restarted server places it where the session
        # had it; the session keeps its cut while it fits (the memo's floor), and one
        # that must move skips a whole block, so the next turns keep it (and their prefix).
        grid = _grid(ctx, turn, head, starts, limit, memo)
        candidates = sorted({floor, *(n for n in grid if n > floor)})
        lo, hi = 0, len(candidates) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if len(render(ctx.tokenizer, cut(candidates[mid]))) <= limit:
                hi = mid
            else:
                lo = mid + 1
        n = candidates[lo]
        start = starts[n]
        if start == head:  # nothing omitted
            return turn
        memo["cut"] = {"first_kept": message_identity(originals[start]), "omitted": start - head}
        return cut(n)

    def _shrink_huge_last_turn(self, ctx: RequestContext, turn: "Turn", head: int, limit: int,
                               memo: dict[str, Any]) -> "Turn":
        """A last turn larger than half the room (a big file read) is clipped to half
        before the cut is placed: else the cut would drop the whole history for it, and
        at the next turn (that result masked) the history would be needlessly gone."""
        messages = turn.messages
        last = last_turn_start(messages)
        if last <= head:
            return turn
        fixed = len(render(ctx.tokenizer, _omit(turn, head, len(messages))))
        core = _omit(turn, head, last)  # the head, the note, the last turn
        half = (limit - fixed) // 2
        if len(render(ctx.tokenizer, core)) - fixed <= half:
            return turn
        clipped = self._clip(ctx, core, fixed + half, memo, "clip-last")
        k = len(messages) - last
        self._clipped_last = clipped is not core
        return with_messages(turn, [*messages[:last], *clipped.messages[-k:]]) if self._clipped_last else turn

    def _clip(self, ctx: RequestContext, turn: "Turn", limit: int, memo: dict[str, Any], step: str) -> "Turn":
        """Long texts keep their head and tail, the budget (characters per text, at least
        _MIN_CLIP) halved until the prompt fits. Each step remembers its budget (later
        turns clip the same messages the same way), except `clip-last`: the last turn
        changes every turn."""
        messages = turn.messages
        head, last = _head_length(messages), last_turn_start(messages)
        lo, hi = {"clip": (head, last), "clip-head": (0, head), "clip-last": (last, len(messages))}[step]
        if lo >= hi:
            return turn
        lengths = [max(len(m.content or ""), len(m.reasoning or ""), *(len(c.arguments) for c in m.tool_calls))
                   for m in messages[lo:hi]]
        budget = (memo.get(step) if step != "clip-last" else None) or max(max(lengths), _MIN_CLIP)
        while True:
            part = [_clip_message(m, budget) for m in messages[lo:hi]]
            clipped = with_messages(turn, [*messages[:lo], *part, *messages[hi:]])
            if len(render(ctx.tokenizer, clipped)) <= limit or budget <= _MIN_CLIP:
                if step != "clip-last":
                    memo[step] = budget
                return clipped if clipped.messages != messages else turn
            budget = max(_MIN_CLIP, budget // 2)


def shorten_tool(tool: "Tool", bare: bool) -> "Tool":
    """The tool with its description cut (names and parameter schemas kept)."""
    text = " ".join((tool.description or "").split())
    if bare:
        description = _clip(text, 80)
    else:
        first = text.split(". ", 1)[0]
        description = _clip(first if first.endswith(".") or first == text else first + ".", 200)
    parameters = _clip_schema(tool.parameters, None if bare else 100) if tool.parameters else tool.parameters
    return dataclasses.replace(tool, description=description, parameters=parameters)


def _clip_schema(value: Any, limit: int | None) -> Any:
    """The schema with every `description` clipped to `limit` characters (None: removed,
    and the `$schema` tag too: metadata that constrains nothing)."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key == "$schema" and limit is None:
                continue
            if key == "description" and isinstance(item, str):
                if limit is not None:
                    out[key] = _clip(" ".join(item.split()), limit)
                continue
            out[key] = _clip_schema(item, limit)
        return out
    if isinstance(value, list):
        return [_clip_schema(v, limit) for v in value]
    return value


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _head_length(messages: list["Message"]) -> int:
    """The kept head: the leading system messages and the first user message."""
    i = 0
    while i < len(messages) and messages[i].role == "system":
        i += 1
    first_user = next((j for j in range(i, len(messages)) if messages[j].role == "user"), None)
    return (first_user + 1) if first_user is not None else i


def _grid(ctx: RequestContext, turn: "Turn", head: int, starts: list[int], limit: int,
          memo: dict[str, Any]) -> list[int]:
    """Indices into `starts` where the cut may lie: for k = 0, 1, 2, ..., the first
    message start at least k blocks of tokens after the head (the last start, the newest
    message, ends the list). A block is a third of the room that the tools and the
    head leave under `limit` (a quarter moved the cut more often on the public sessions,
    a half kept less history); positions are counted in the messages' own text tokens,
    so an appended message moves none of them."""
    messages = turn.messages
    base = len(render(ctx.tokenizer, with_messages(turn, list(messages[:head]))))
    block = max(1, (limit - base) // 3)
    sizes = memo.setdefault("sizes", {})  # identity -> text tokens (messages are resent unchanged)
    offsets, total = {}, 0
    for i in range(head, len(messages)):
        offsets[i] = total
        key = message_identity(messages[i])
        if key not in sizes:
            sizes[key] = _message_size(ctx.tokenizer, messages[i])
        total += sizes[key]
    grid, k = [], 0
    for n, i in enumerate(starts):
        if offsets[i] >= k * block:
            grid.append(n)
            k = offsets[i] // block + 1  # the next block boundary past it
    if not grid or grid[-1] != len(starts) - 1:
        grid.append(len(starts) - 1)
    return grid


def _message_size(tokenizer: Any, message: "Message") -> int:
    """Text tokens of a message (content, reasoning, tool calls) and a few for its frame."""
    parts = [message.content or "", message.reasoning or "", *(f"{c.name} {c.arguments}" for c in message.tool_calls)]
    text = "\n".join(p for p in parts if p)
    return (len(tokenizer.encode(text, add_special_tokens=False)) if text else 0) + 4


def _omit(turn: "Turn", head: int, start: int) -> "Turn":
    from jumpahead.core.turn import Message

    omitted = start - head
    if omitted <= 0:
        return turn
    note = Message("user", f"[{omitted} {_OMITTED}]")
    return with_messages(turn, [*turn.messages[:head], note, *turn.messages[start:]])


def _clip_message(message: "Message", budget: int) -> "Message":
    """The message with its text, reasoning and long string arguments of its tool calls
    cut to their head and tail (ids, names and argument keys stay)."""
    changes: dict[str, Any] = {}
    content = message.content or ""
    if _OMITTED not in content[:80]:  # the cut's own note stays
        clipped = _clip_middle(content, budget)
        if clipped is not content:
            changes["content"] = clipped
    if message.reasoning:
        clipped = _clip_middle(message.reasoning, budget)
        if clipped is not message.reasoning:
            changes["reasoning"] = clipped
    calls = [_clip_call(c, budget) for c in message.tool_calls]
    if any(a is not b for a, b in zip(calls, message.tool_calls)):
        changes["tool_calls"] = calls
    return dataclasses.replace(message, **changes) if changes else message


def _clip_middle(text: str, budget: int) -> str:
    """`text` itself where clipping gains little, else its head and tail."""
    if len(text) <= budget + 64:
        return text
    keep = budget // 2
    return f"{text[:keep]}\n[... {len(text) - 2 * keep} chars omitted ...]\n{text[-keep:]}"


def _clip_call(call: "ToolCall", budget: int) -> "ToolCall":
    if len(call.arguments) <= budget + 64:
        return call
    try:
        args = orjson.loads(call.arguments)
    except orjson.JSONDecodeError:
        return dataclasses.replace(call, arguments=_clip_middle(call.arguments, budget))

    def clip(value: Any) -> Any:
        if isinstance(value, str):
            return _clip_middle(value, budget)
        if isinstance(value, dict):
            return {k: clip(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clip(v) for v in value]
        return value

    return dataclasses.replace(call, arguments=orjson.dumps(clip(args)).decode())


def _surely_fits(turn: "Turn", limit: int) -> bool:
    """A cheap upper bound: a byte-level BPE token covers at least one character, so
    the characters (plus template overhead) bound the tokens."""
    chars = sum(len(m.content or "") + len(m.reasoning or "") + sum(len(c.arguments) + len(c.name) for c in m.tool_calls)
                for m in turn.messages)
    chars += sum(len(t.name) + len(t.description or "") + len(str(t.parameters or "")) for t in turn.tools)
    return chars + 16 * len(turn.messages) + 512 < limit
