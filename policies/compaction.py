"""Built-in context rewrites: micro-compaction, observation masking, thinking clearing.

All three are sticky (policies/sticky.py): a rewrite decided at turn n is replayed byte
for byte at later turns, new ones only extend it, and one is committed only when the
tokens it removes pay for the re-prefill after its edit point. Tool calls and their
results always stay paired (same ids, same arguments); user messages and the last turn
(the newest assistant message and everything after it) are never touched.

- `compaction` (mode=extract|model): the reasoning of a finished tool step (every call
  answered) becomes a compact account (policies/account.py); with `mode=model` the
  serving model writes the notes (ctx.generate), extraction where it cannot.
  Options: clear_at_least (1024), horizon (8), min_tokens (64: shorter texts stay),
  target=all|reasoning (all: also the visible text of a tool-calling message),
  max_chars (600: notes kept per text), summary_tokens (160: mode=model).
- `masking` (keep=N, default 3): old tool results become a one-line placeholder.
- `thinking-clearing` (keep=N, default 1): old assistant reasoning is dropped.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from . import account as acc
from .api import RequestContext
from .sticky import StickyRewrite, calls_completed, int_option, text_tokens, tool_results

if TYPE_CHECKING:
    from jumpahead.core.turn import Message

log = logging.getLogger(__name__)

SUMMARY_PROMPT = (
    "Below is the reasoning a coding agent wrote before it made some tool calls, and what the calls did. "
    "Rewrite the reasoning as a short account for the agent's later steps: the decisions and constraints "
    "that still hold, files it touched, what failed, and open questions. At most {words} words, no preamble.\n\n"
    "Reasoning:\n{reasoning}\n\nCalls and results:\n{calls}\n"
)


class Compaction(StickyRewrite):
    """Micro-compaction of finished reasoning (`--policy compaction[:mode=model,...]`)."""

    name = "compaction"

    def __init__(self, **options: str) -> None:
        super().__init__(**options)
        self.mode = str(self.options.get("mode", "extract"))
        if self.mode not in ("extract", "model"):
            raise ValueError(f"option mode={self.mode!r}: expected extract or model")
        self.target = str(self.options.get("target", "all"))
        if self.target not in ("all", "reasoning"):
            raise ValueError(f"option target={self.target!r}: expected all or reasoning")
        self.min_tokens = int_option(self.options, "min_tokens", 64)  # shorter segments are left alone
        self.max_chars = max(80, int_option(self.options, "max_chars", 600))  # notes kept per segment
        self.summary_tokens = max(8, int_option(self.options, "summary_tokens", 160))  # mode=model: per summary
        self._fallbacks: list[str] = []

    def candidates(self, messages: list["Message"], protected_from: int) -> list[int]:
        results = tool_results(messages)
        return [i for i in range(protected_from) if calls_completed(messages, i, results)]

    def rewrite(self, ctx: RequestContext, messages: list["Message"], index: int) -> "Message | None":
        message = messages[index]
        results = tool_results(messages)
        later = acc.later_text(messages, index)
        changes: dict[str, Any] = {}
        placed = False  # the actions and results go into one field only
        if text_tokens(ctx.tokenizer, message.reasoning) >= self.min_tokens:
            notes, questions = acc.extract_notes(message.reasoning or "", later, self.max_chars)
            changes["reasoning"] = acc.account(notes, message.tool_calls, results, questions)
            placed = True
        if self.target == "all" and text_tokens(ctx.tokenizer, message.content) >= self.min_tokens:
            notes, questions = acc.extract_notes(message.content or "", later, self.max_chars)
            changes["content"] = acc.account(notes, message.tool_calls if not placed else (), results, questions)
        if not changes:
            return None
        new = dataclasses.replace(message, **changes)
        before = sum(text_tokens(ctx.tokenizer, getattr(message, k)) for k in changes)
        after = sum(text_tokens(ctx.tokenizer, getattr(new, k)) for k in changes)
        return new if after < before else None

    def finalize(self, ctx: RequestContext, messages: list["Message"], chosen: dict[int, "Message"]) -> dict[int, "Message"]:
        self._fallbacks = []
        if self.mode != "model":
            return chosen
        if ctx.generate is None:
            self._fallbacks.append("no model at hand (ctx.generate is None): extraction used")
            return chosen
        results = tool_results(messages)
        out = dict(chosen)
        for i, extracted in chosen.items():
            original = messages[i]
            changes: dict[str, str] = {}
            fields = [f for f in ("reasoning", "content") if getattr(extracted, f) != getattr(original, f)]
            for n, field in enumerate(fields):
                summary = self._summary(ctx, original, getattr(original, field) or "",
                                        text_tokens(ctx.tokenizer, getattr(extracted, field)) // 2, results, i)
                if summary is not None:  # else the extraction stays
                    changes[field] = acc.account((), original.tool_calls if n == 0 else (), results, summary=summary)
            if changes:
                out[i] = dataclasses.replace(extracted, **changes)
        return out

    def _summary(self, ctx: RequestContext, original: "Message", source: str, budget: int,
                 results: dict[str, "Message"], index: int) -> str | None:
        """The model's account of one text, or None (and a fallback note) where it cannot."""
        budget = min(self.summary_tokens, max(16, budget))
        calls = "\n".join(f"- {acc.describe_call(c)} -> "
                          f"{acc.describe_result(results[c.id].content or '') if c.id in results else '(no result)'}"
                          for c in original.tool_calls)
        prompt = SUMMARY_PROMPT.format(words=max(10, budget * 3 // 4), reasoning=source[:6000], calls=calls)
        try:
            summary = " ".join((ctx.generate(prompt, budget) or "").split())
        except Exception as exc:  # the engine refused (full, closed): keep the extraction
            self._fallbacks.append(f"message {index}: model summary failed ({type(exc).__name__}: {exc}); "
                                   "extraction used")
            return None
        if not summary:
            self._fallbacks.append(f"message {index}: the model wrote nothing; extraction used")
            return None
        return summary

    def describe(self, chosen: dict[int, "Message"]) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode}
        if self._fallbacks:
            out["fallback"] = self._fallbacks
        return out


class ObservationMasking(StickyRewrite):
    """Old tool results become `[tool result elided: N chars; first line]` (`--policy masking:keep=3`)."""

    name = "masking"

    def __init__(self, **options: str) -> None:
        super().__init__(**options)
        self.keep = int_option(self.options, "keep", 3)
        self.min_chars = int_option(self.options, "min_chars", 256)  # smaller results are not worth a placeholder

    def candidates(self, messages: list["Message"], protected_from: int) -> list[int]:
        tools = [i for i, m in enumerate(messages) if m.role == "tool"]
        kept = set(tools[len(tools) - self.keep:]) if self.keep else set()
        return [i for i in tools if i < protected_from and i not in kept]

    def rewrite(self, ctx: RequestContext, messages: list["Message"], index: int) -> "Message | None":
        message = messages[index]
        content = message.content or ""
        if len(content) < self.min_chars:
            return None
        return dataclasses.replace(message, content=placeholder(content))


def placeholder(content: str) -> str:
    first = next((line.strip() for line in content.splitlines() if line.strip()), "")
    return f"[tool result elided: {len(content)} chars; {acc._clip(first, 100)}]"


class ThinkingClearing(StickyRewrite):
    """The reasoning of old assistant messages is dropped (`--policy thinking-clearing:keep=1`)."""

    name = "thinking-clearing"

    def __init__(self, **options: str) -> None:
        super().__init__(**options)
        self.keep = max(1, int_option(self.options, "keep", 1))

    def candidates(self, messages: list["Message"], protected_from: int) -> list[int]:
        assistants = [i for i, m in enumerate(messages) if m.role == "assistant"]
        kept = set(assistants[len(assistants) - self.keep:])
        return [i for i in assistants if i < protected_from and i not in kept and messages[i].reasoning]

    def rewrite(self, ctx: RequestContext, messages: list["Message"], index: int) -> "Message | None":
        return dataclasses.replace(messages[index], reasoning=None)
