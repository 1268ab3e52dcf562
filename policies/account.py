"""The compact account of a finished tool step, built deterministically.

A finished step is an assistant message whose tool calls all have their results. Its
reasoning is replaced by what later turns still need (docs/design.md, micro-compaction):

- notes: the reasoning's sentences that carry decisions, constraints, plans, file
  paths, identifiers that later messages use, and questions; the rest is dropped;
- actions: each call as its tool name and key arguments (path, command, pattern, ...);
- results: per call, the exit code, the first error line, or the first line;
- open questions: the question sentences.

Everything here is a pure function of its inputs, so the same step always gives the
same bytes (the sticky memo then keeps it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from jumpahead.core.turn import Message, ToolCall

HEADER = "[compacted step]"

_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9`\"'(\[])|\n+")
_DECISION = re.compile(
    r"\b(must|should|need|needs|needed|have to|will|I'll|I will|let's|let me|plan|decid\w*|instead|because|"
    r"so that|don't|do not|never|always|avoid|constraint|require\w*|fix\w*|bug|issue|error|fail\w*|"
    r"root cause|problem|approach|next|then|first|finally|conclu\w*|the cause|turns out|found|works?|"
    r"correct|wrong|missing|expected|TODO)\b",
    re.IGNORECASE)
_PATH = re.compile(r"(?:[\w.~-]*/)+[\w.-]+|\b[\w-]+\.(?:py|js|ts|tsx|jsx|go|rs|c|h|cpp|hpp|java|rb|md|json|toml|"
                   r"yaml|yml|txt|sh|cfg|ini|html|css|sql|lock)\b")
_IDENT = re.compile(r"`([^`\n]{2,80})`|\b([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+|"
                    r"[a-z][a-z0-9]*_[a-z0-9_]+|[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*)\b")
_PATH_KEYS = ("path", "file_path", "filepath", "filename", "file", "notebook_path", "target_file", "dir", "directory")
_KEY_ARGS = ("command", "cmd", "pattern", "query", "url", "old_str", "old_string", "description", "prompt", "skill")
_EXIT = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>|\bexit(?:ed with)?(?: code|\s+status)?[:= ]\s*(-?\d+)",
                   re.IGNORECASE)
_ERROR = re.compile(r"Traceback|\b\w*(?:Error|Exception)\b|\bfailed\b|\bFAILED\b|No such file|not found|"
                    r"command not found|\berror\b", re.IGNORECASE)


def sentences(text: str) -> list[str]:
    """The text cut into sentences and lines, trimmed, empty ones dropped."""
    return [s.strip() for s in _SENTENCE.split(text or "") if s and s.strip()]


def identifiers(text: str) -> set[str]:
    out = set()
    for m in _IDENT.finditer(text or ""):
        out.add(m.group(1) or m.group(2))
    return out


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def extract_notes(text: str, later_text: str, limit: int = 600) -> tuple[list[str], list[str]]:
    """(notes, questions): the sentences worth keeping, in their original order, within
    `limit` characters (the highest-scoring first when they do not all fit)."""
    scored: list[tuple[float, int, str]] = []
    questions: list[str] = []
    for order, sentence in enumerate(sentences(text)):
        if sentence.rstrip().endswith("?"):
            questions.append(_clip(sentence, 200))
            continue
        score = 0.0
        if _DECISION.search(sentence):
            score += 1.0
        if _PATH.search(sentence):
            score += 1.5
        used_later = [i for i in identifiers(sentence) if i in later_text]
        if used_later:
            score += 1.0 + 0.25 * min(len(used_later), 4)
        if score > 0:
            scored.append((score, order, _clip(sentence, 240)))
    kept: list[tuple[int, str]] = []
    used = 0
    for score, order, sentence in sorted(scored, key=lambda t: (-t[0], t[1])):
        if used + len(sentence) + 1 > limit:
            continue
        kept.append((order, sentence))
        used += len(sentence) + 1
    return [s for _, s in sorted(kept)], questions[:3]


def _arguments(call: "ToolCall") -> Any:
    try:
        return orjson.loads(call.arguments) if call.arguments.strip() else {}
    except orjson.JSONDecodeError:
        return call.arguments


def describe_call(call: "ToolCall", limit: int = 160) -> str:
    """`name(key=value, ...)` with the arguments that identify what the call did."""
    args = _arguments(call)
    if not isinstance(args, dict):
        return f"{call.name}({_clip(str(args), limit)})"
    parts = []
    for key in (*_PATH_KEYS, *_KEY_ARGS):
        value = args.get(key)
        if isinstance(value, (str, int, float)) and str(value).strip():
            parts.append(f"{key}={_clip(str(value), limit)}")
    if not parts:  # no known key: the short scalar arguments
        parts = [f"{k}={_clip(str(v), 60)}" for k, v in args.items() if isinstance(v, (str, int, float, bool))][:3]
    for key in ("content", "new_str", "new_string", "file_text"):
        value = args.get(key)
        if isinstance(value, str) and value:
            parts.append(f"{key}=<{len(value)} chars>")
    return f"{call.name}({', '.join(parts)})"


def describe_result(text: str, limit: int = 160) -> str:
    """Exit code, the first error line, else the first non-empty line of a tool result."""
    text = text or ""
    lines = [line.strip() for line in text.splitlines() if line.strip()
             and not re.fullmatch(r"</?(?:returncode|output|tool_response)>.*", line.strip())]
    parts = []
    m = _EXIT.search(text)
    if m:
        parts.append(f"exit {m.group(1) or m.group(2)}")
    error = next((line for line in lines if _ERROR.search(line)), None)
    if error is not None:
        parts.append(_clip(error, limit))
    elif lines:
        parts.append(_clip(lines[0], limit))
    else:
        parts.append("(empty)")
    return "; ".join(parts)


def account(notes: Sequence[str], calls: Iterable["ToolCall"], results: dict[str, "Message"],
            questions: Sequence[str] = (), summary: str | None = None) -> str:
    """The compact account as text (one line per part)."""
    lines = [HEADER]
    if summary:
        lines.append("Summary: " + summary.strip())
    elif notes:
        lines.append("Notes: " + " ".join(notes))
    calls = list(calls)
    if calls:
        lines.append("Actions: " + "; ".join(describe_call(c) for c in calls))
        outcomes = []
        for c in calls:
            result = results.get(c.id)
            outcomes.append(f"{c.name} -> {describe_result(result.content or '') if result else '(no result)'}")
        lines.append("Results: " + "; ".join(outcomes))
    if questions:
        lines.append("Open: " + " ".join(questions))
    return "\n".join(lines)


def later_text(messages: Sequence["Message"], index: int) -> str:
    """What the messages after `index` say (texts and call arguments): identifiers the
    reasoning names and later messages use are kept."""
    parts = []
    for m in messages[index + 1:]:
        parts.append(m.content or "")
        parts.append(m.reasoning or "")
        parts.extend(c.arguments for c in m.tool_calls)
    return "\n".join(parts)
