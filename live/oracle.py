"""Oracle jumps in a live run: the task's ideal tool calls are the hindsight.

Forced replay hands `oracle-jump` the recorded output of the turn
(`jumpahead.oracle_output`, policies/jump.py). A live run has no recording: the model
writes its own reasoning, so no fixed text can be a prefix of its output. What a live
run does know is the task's ideal solution (`Task.ideal`: tool name and arguments in
order). The agent sends it per request as `"jumpahead": {"oracle_calls": [{"name",
"arguments"}, ...]}`, and `LiveOracleJump` builds, at each boundary, the oracle text the
built-in policy expects: the model's output so far up to its open call, then the ideal
call whose rendering in the model's own layout continues what the model has written of
the call so far (name, and the arguments already complete, in the model's order). From
there `OracleJump.plan` runs unchanged: only content that already exists before the jump
point (context or output, stretches of at least `min_chars`) is supplied, never further.
Ideal calls the conversation already made (same name and arguments) are not offered
again. Where several ideal calls fit, the one the model's text of this turn names last
(a string argument such as the path, "I write notes/dragon.txt") is offered, else the
first in the ideal order: the model settles which call it makes before it writes it. No
ideal call agrees with the call so far: no jump.

`LiveMistakenJump` is `mistaken-jump` whose `base=oracle` is this live oracle.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from jumpahead.policies.api import BoundaryEvent, RequestContext
from jumpahead.policies.call_text import CallFormat, parse_partial
from jumpahead.policies.jump import MistakenJump, OracleJump
from jumpahead.policies.jump_plan import JumpPlan

ORACLE_FIELD = "oracle_calls"  # in the request's `jumpahead` object


def oracle_calls(turn: Any) -> list[tuple[str, dict[str, Any]]]:
    """The ideal calls the request carries (`jumpahead.oracle_calls`), well-formed ones only."""
    options = getattr(turn, "extra", {}).get("jumpahead")
    raw = options.get(ORACLE_FIELD) if isinstance(options, dict) else None
    out: list[tuple[str, dict[str, Any]]] = []
    for item in raw if isinstance(raw, list) else []:
        if isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("arguments"), dict):
            out.append((item["name"], item["arguments"]))
    return out


def _call_key(name: str, arguments: Any) -> tuple[str, str]:
    return name, json.dumps(arguments, sort_keys=True)


def calls_left(turn: Any, calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """The ideal calls the conversation has not made yet, in their order. Two ideal calls
    may share a tool name and its first arguments (create_two_files: two write_file), so
    an oracle offered every ideal call at every turn re-supplies the one already done."""
    made: Counter[tuple[str, str]] = Counter()
    for message in getattr(turn, "messages", []):
        for call in getattr(message, "tool_calls", None) or []:
            try:
                made[_call_key(call.name, json.loads(call.arguments or "{}"))] += 1
            except (TypeError, ValueError):
                continue
    left = []
    for name, arguments in calls:
        key = _call_key(name, arguments)
        if made[key] > 0:
            made[key] -= 1
        else:
            left.append((name, arguments))
    return left


def named_last(head: str, candidates: list[tuple[str, dict[str, Any]]]) -> int:
    """The index of the candidate whose string argument the text `head` mentions last
    (its latest occurrence wins); 0 where the text names none of them."""
    best, best_at = 0, -1
    for i, (_, arguments) in enumerate(candidates):
        for value in arguments.values():
            if isinstance(value, str) and 3 <= len(value.strip()) <= 200:
                at = head.rfind(value.strip())
                if at > best_at:
                    best, best_at = i, at
    return best


def render_call(call_text: str, name: str, arguments: dict[str, Any], end: str) -> str | None:
    """The call body (after the start marker) in the layout the model is writing:
    its leading whitespace and separators, the arguments it completed first in its own
    order, then the rest in the ideal order, closed with `}}` and the end marker.
    None where the model's call so far is not a prefix of it."""
    fmt = CallFormat.detect(call_text, end)
    lead = call_text[: len(call_text) - len(call_text.lstrip())]
    partial = parse_partial(call_text)
    order = [k for k in (partial.args if partial is not None else {}) if k in arguments]
    if partial is not None and partial.key in arguments and partial.key not in order:
        order.append(partial.key)
    order += [k for k in arguments if k not in order]
    items = [(k, arguments[k]) for k in order]
    body = (f"{lead}{{{json.dumps('name')}{fmt.key_sep}{fmt.dump(name)}{fmt.item_sep}"
            f"{json.dumps('arguments')}{fmt.key_sep}{{{fmt.members(items)}{fmt.close()}")
    return body if body.startswith(call_text) else None


class LiveOracleJump(OracleJump):
    """`oracle-jump` with the task's ideal calls as the oracle (see the module doc)."""

    name = "live-oracle-jump"

    def configure(self, ctx: RequestContext) -> None:
        super().configure(ctx)
        self.calls = calls_left(ctx.turn, oracle_calls(ctx.turn))
        self.oracle = None

    def plan(self, event: BoundaryEvent) -> JumpPlan | None:
        out, call_text = event.output_text, event.call_text
        self.oracle = None
        if not self.calls or not call_text or not out.endswith(call_text):
            return None
        head = out[: len(out) - len(call_text)]
        fits = [(name, arguments, body) for name, arguments in self.calls
                if (body := render_call(call_text, name, arguments, self.end)) is not None]
        if not fits:
            return None
        _, _, body = fits[named_last(head, [(n, a) for n, a, _ in fits])]
        self.oracle, self._ids = head + body, None
        return super().plan(event)


class LiveMistakenJump(MistakenJump):
    """`mistaken-jump` whose oracle base is `LiveOracleJump`."""

    name = "live-mistaken-jump"

    def __init__(self, **options: str) -> None:
        super().__init__(**options)
        if options.get("base") in ("oracle", "oracle-jump"):
            rest = {k: v for k, v in options.items() if k not in ("rate", "seed", "base")}
            self.base = LiveOracleJump(**rest)
