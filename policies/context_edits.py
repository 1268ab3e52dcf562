"""Anthropic context editing as sticky rewrites: `clear_tool_uses_20250919` and
`clear_thinking_20251015` (the request's edits, typed in core/turn.py: `Turn.context_edits`).

The API applies these edits server-side, statelessly, on every request. Here they are
StickyRewrite policies (policies/sticky.py): a tool use cleared at turn n is replayed
from the session memo byte for byte at n+1, new clears only extend past the last edit
point, so the edited prompt of turn n stays a token prefix of turn n+1's and the prefix
cache keeps hitting. `clear_at_least` is the StickyRewrite trigger of the same name (the
tokens a new clear must remove); no re-prefill horizon applies (the client asked for
the clearing). Each policy leaves `applied` (the API's applied-edit entry plus the
cleared message indices) after `on_request`; the runtime puts the request's report in
`usage.report.context_edits`, from which the Messages protocol answers `applied_edits`.

Also built-ins for any protocol: `--policy clear-tool-uses:trigger=30000,keep=3` and
`clear-thinking:keep=1`.

Differences from the API: the newest assistant message and what follows it (its tool
results) are never rewritten, whatever `keep` says (StickyRewrite's protected turn); a
result shorter than the placeholder is left as it is.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import orjson

from jumpahead.core.turn import CLEAR_THINKING, CLEAR_TOOL_USES, ClearThinkingEdit, ClearToolUsesEdit, ContextEditSpec

from .api import RequestContext
from .registry import PolicySpec
from .builtin import BUILTIN
from .sticky import StickyRewrite, bool_option, int_option, render, text_tokens

if TYPE_CHECKING:
    from jumpahead.core.turn import Message, Turn

CLEARED_RESULT = "[tool result cleared]"
NO_HORIZON = 10**9  # removed * horizon >= re-prefill always holds


def _names_option(options: dict[str, Any], name: str) -> list[str]:
    """A JSON array of names, or names separated by `|` or spaces (the CLI splits on commas)."""
    value = options.get(name)
    if value is None or value == "":
        return []
    text = str(value).strip()
    if text.startswith("["):
        try:
            names = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise ValueError(f"option {name}={text!r} is not a JSON array of names") from None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"option {name}={text!r} is not a JSON array of names")
        return names
    return [n for n in text.replace("|", " ").split() if n]


class ContextEdit(StickyRewrite):
    """An Anthropic edit run as a sticky rewrite; `applied` is its report for this request."""

    edit_type = ""
    count_field = ""
    default_clear_at_least = 0
    default_horizon = NO_HORIZON

    def __init__(self, **options: str) -> None:
        super().__init__(**options)
        self.applied: dict[str, Any] | None = None
        self._tokens_before: int | None = None

    def enabled(self) -> bool:
        return True

    def triggered(self, ctx: RequestContext) -> bool:
        return True

    def cleared(self, original: "Message", now: "Message") -> bool:
        raise NotImplementedError

    def _best_suffix(self, ctx: RequestContext, original: list["Message"], chosen: dict[int, "Message"],
                     identities: list[str], memo: dict[str, Any]) -> tuple[dict[int, "Message"], int]:
        # The API clears every eligible message at once, with no re-prefill horizon; the
        # exact render check then applies clear_at_least. (A template that drops earlier
        # reasoning still gets its thinking turns cleared: 0 tokens, reported as such.)
        return chosen, 0

    def on_request(self, ctx: RequestContext) -> "Turn | None":
        self.applied, self._tokens_before = None, None
        if not self.enabled() or not self.triggered(ctx):
            return None
        new = super().on_request(ctx)
        result = new if new is not None else ctx.turn
        indices = [i for i, (a, b) in enumerate(zip(ctx.turn.messages, result.messages)) if self.cleared(a, b)]
        if indices:
            before = self._tokens_before if self._tokens_before is not None else len(render(ctx.tokenizer, ctx.turn))
            self.applied = {"type": self.edit_type, self.count_field: len(indices),
                            "cleared_input_tokens": max(0, before - len(render(ctx.tokenizer, result))),
                            "messages": indices}
        return new


class ClearToolUses(ContextEdit):
    """Old tool results become a placeholder once the prompt passes `trigger`
    (`--policy clear-tool-uses:trigger=N,keep=3,clear_at_least=0,exclude_tools=a|b,clear_tool_inputs=false`)."""

    name = "clear-tool-uses"
    edit_type = CLEAR_TOOL_USES
    count_field = "cleared_tool_uses"

    def __init__(self, **options: str) -> None:
        super().__init__(**options)
        self.trigger = int_option(self.options, "trigger", 100_000)  # input tokens
        self.trigger_tool_uses = int_option(self.options, "trigger_tool_uses", 0)  # >0: by tool uses instead
        self.keep = int_option(self.options, "keep", 3)
        self.exclude = set(_names_option(self.options, "exclude_tools"))
        raw = str(self.options.get("clear_tool_inputs", "false")).strip()
        self.inputs: bool | set[str] = (bool_option(self.options, "clear_tool_inputs", False)
                                        if raw.lower() in ("true", "false", "1", "0", "yes", "no", "on", "off")
                                        else set(_names_option(self.options, "clear_tool_inputs")))
        self._cleared_ids: set[str] = set()

    def triggered(self, ctx: RequestContext) -> bool:
        messages = ctx.turn.messages
        if self.trigger_tool_uses:
            return sum(len(m.tool_calls) for m in messages if m.role == "assistant") > self.trigger_tool_uses
        self._tokens_before = len(render(ctx.tokenizer, ctx.turn))
        return self._tokens_before > self.trigger

    def _inputs_go(self, call_name: str) -> bool:
        return self.inputs is True or (isinstance(self.inputs, set) and call_name in self.inputs)

    def candidates(self, messages: list["Message"], protected_from: int) -> list[int]:
        names = {c.id: c.name for m in messages if m.role == "assistant" for c in m.tool_calls}
        results = [i for i, m in enumerate(messages) if m.role == "tool"]
        older = results[:len(results) - self.keep] if self.keep else results
        clear = [i for i in older if i < protected_from
                 and names.get(messages[i].tool_call_id or "", messages[i].name) not in self.exclude]
        self._cleared_ids = {messages[i].tool_call_id or "" for i in clear}
        out = list(clear)
        if self.inputs:
            # an assistant message's inputs go once every call of it whose inputs may go
            # is cleared: its rewrite is then final (the memo keeps one rewrite per message)
            for j in range(protected_from):
                calls = [c for c in messages[j].tool_calls if self._inputs_go(c.name) and c.name not in self.exclude]
                if messages[j].role == "assistant" and calls and all(c.id in self._cleared_ids for c in calls):
                    out.append(j)
        return sorted(out)

    def rewrite(self, ctx: RequestContext, messages: list["Message"], index: int) -> "Message | None":
        message = messages[index]
        if message.role == "tool":
            if text_tokens(ctx.tokenizer, message.content) <= text_tokens(ctx.tokenizer, CLEARED_RESULT):
                return None
            return dataclasses.replace(message, content=CLEARED_RESULT)
        calls = [dataclasses.replace(c, arguments="{}")
                 if c.id in self._cleared_ids and self._inputs_go(c.name) and c.name not in self.exclude else c
                 for c in message.tool_calls]
        if all(a.arguments == b.arguments for a, b in zip(calls, message.tool_calls)):
            return None
        return dataclasses.replace(message, tool_calls=calls)

    def cleared(self, original: "Message", now: "Message") -> bool:
        return original.role == "tool" and original.content != now.content


class ClearThinking(ContextEdit):
    """The reasoning of all but the last `keep` thinking turns is dropped
    (`--policy clear-thinking:keep=1`; `keep=all` keeps every one)."""

    name = "clear-thinking"
    edit_type = CLEAR_THINKING
    count_field = "cleared_thinking_turns"

    def __init__(self, **options: str) -> None:
        super().__init__(**options)
        self.keep_all = str(self.options.get("keep", "")).strip().lower() == "all"
        self.keep = 0 if self.keep_all else int_option(self.options, "keep", 1)

    def enabled(self) -> bool:
        return not self.keep_all

    def candidates(self, messages: list["Message"], protected_from: int) -> list[int]:
        thinking = [i for i, m in enumerate(messages) if m.role == "assistant" and m.reasoning]
        older = thinking[:len(thinking) - self.keep] if self.keep else thinking
        return [i for i in older if i < protected_from]

    def rewrite(self, ctx: RequestContext, messages: list["Message"], index: int) -> "Message | None":
        return dataclasses.replace(messages[index], reasoning=None)

    def cleared(self, original: "Message", now: "Message") -> bool:
        return original.role == "assistant" and bool(original.reasoning) and not now.reasoning


def edit_specs(edits: list[ContextEditSpec]) -> list[PolicySpec]:
    """The policies that apply the request's edits (`Turn.context_edits`), in order."""
    specs = []
    for edit in edits:
        if isinstance(edit, ClearToolUsesEdit):
            options = {"keep": str(edit.keep), "clear_at_least": str(edit.clear_at_least),
                       "exclude_tools": orjson.dumps(list(edit.exclude_tools)).decode()}
            if edit.trigger_unit == "tool_uses":
                options["trigger_tool_uses"] = str(edit.trigger)
            else:
                options["trigger"] = str(edit.trigger)
            inputs = edit.clear_tool_inputs
            options["clear_tool_inputs"] = ("true" if inputs else "false") if isinstance(inputs, bool) \
                else orjson.dumps(list(inputs)).decode()
            specs.append(PolicySpec("clear-tool-uses", BUILTIN["clear-tool-uses"], options))
        elif isinstance(edit, ClearThinkingEdit):
            specs.append(PolicySpec("clear-thinking", BUILTIN["clear-thinking"], {"keep": str(edit.keep)}))
    return specs


def report(policies: list[Any]) -> dict[str, Any]:
    """`usage.report.context_edits`: the edits that cleared something, and their total."""
    applied = [p.applied for p in policies if isinstance(p, ContextEdit) and p.applied]
    return {"applied_edits": applied, "cleared_input_tokens": sum(a["cleared_input_tokens"] for a in applied)}


__all__ = ["ClearThinking", "ClearToolUses", "ContextEdit", "edit_specs", "report"]
