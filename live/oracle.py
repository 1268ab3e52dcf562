"""Oracle jumps in a live run: steering (the task's ideal calls) and hindsight (the
model's own recorded future, from the ordinary arm on the same seed).

Forced replay hands `oracle-jump` the recorded output of the turn
(`jumpahead.oracle_output`, policies/jump.py). An arm of a live run writes its own
reasoning, so only a recording of the same model on the same conversation can be a
prefix of its output (the hindsight oracle below). The steering oracle instead uses the
task's ideal solution (`Task.ideal`: tool name and arguments in
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

This ideal-call oracle *steers*: the task's answer travels with every request, so it
can lead the model to calls it would not have made. Live arms name it `steering-jump`
(`oracle-jump` is its old name); it is never the upper bound.

The hindsight oracle is the model's own future: `LiveHindsightJump` is the built-in
`OracleJump` fed, per turn, with the ordinary arm's recorded output of the same turn of
the same seed (`oracle_output`, the field replay hands over). The runner runs the
ordinary arm first (live/command.py) and the agent sends turn k's recording only while
every earlier turn of this run equals the recording's (`hindsight_output`): once the
conversation left the recording, the recording is no longer this run's future.
`OracleJump.plan` then supplies the recorded rest of a call only as far as its content
already exists before the jump point (context or output so far), never further.

`LiveMistakenJump` is `mistaken-jump` whose `base=oracle` (or `steering`) is the steering
oracle and whose `base=hindsight` is the hindsight oracle.
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
    return [(call.name, call.arguments) for call in turn.options.oracle_calls]


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
        base = options.get("base")
        live = {"oracle": LiveOracleJump, "oracle-jump": LiveOracleJump, "steering": LiveOracleJump,
                "hindsight": LiveHindsightJump}.get(base or "")
        super().__init__(**{**options, "base": "oracle"} if live else options)
        if live is not None:
            rest = {k: v for k, v in options.items() if k not in ("rate", "seed", "base")}
            self.base = live(**rest)


HINDSIGHT_FIELD = "oracle_output"  # the built-in oracle-jump's request field (policies/jump.py)


class LiveHindsightJump(OracleJump):
    """`oracle-jump` on the ordinary arm's recorded output of this turn (the module doc):
    hindsight of the model's own continuation, supplied only where its content existed
    before the jump point. Its own name keeps its interventions apart from steering's."""

    name = "hindsight-jump"


def recorded_turns(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The ordinary arm's turns of one task record as the hindsight arm needs them: the
    raw output (the model's own text, call markup included) and what the agent kept of it
    (content and calls), to tell whether a later run is still on the recording."""
    return [{"output": t.get("output") or "", "content": t.get("content") or "",
             "calls": [(c.get("name"), c.get("arguments")) for c in t.get("calls") or []]}
            for t in record.get("turns") or []]


def _same_turn(turn: Any, recorded: dict[str, Any]) -> bool:
    content = turn.get("content") if isinstance(turn, dict) else turn.content
    calls = turn.get("calls") if isinstance(turn, dict) else turn.calls
    return ((content or "") == recorded["content"]
            and [(c.get("name"), c.get("arguments")) for c in calls or []] == list(recorded["calls"]))


def hindsight_output(recording: list[dict[str, Any]], turns_so_far: list[Any]) -> str | None:
    """The recorded output of the next turn, or None: past the recording's end, without
    its raw text, or where an earlier turn of this run differs from the recorded one (the
    recording is then no longer this run's future)."""
    k = len(turns_so_far)
    if k >= len(recording) or not recording[k]["output"]:
        return None
    if not all(_same_turn(t, r) for t, r in zip(turns_so_far, recording)):
        return None
    return recording[k]["output"]
