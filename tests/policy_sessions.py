"""Helpers for the context-rewrite tests: the public sessions, windows of consecutive
turns, the default tokenizer alone (no weights), and the checks every rewrite must pass."""

from __future__ import annotations

import copy
import os
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
# SESSIONS: the public sessions (traces/public/SOURCES.md), one per agent format, the
# ones the forecast bench replays (the tests import it from here).
from jumpahead.bench.forecast import SESSIONS  # noqa: F401

SHARED = Path(os.environ.get("JUMPAHEAD_SHARED") or Path(__file__).resolve().parents[2] / "shared")
PUBLIC = SHARED / "traces" / "public"


@cache
def load_public(name: str) -> Any:
    path = PUBLIC / name
    if not path.exists():
        pytest.skip(f"{path} is absent: these tests read the public sessions from ../shared/traces/public")
    try:
        import jumpahead.traces.importers  # noqa: F401  (registers the formats)
        from jumpahead.traces.formats import UnknownFormat, load_session
    except ImportError as exc:
        pytest.skip(f"the trace importers are not available: {exc}")
    try:
        return load_session(path)
    except UnknownFormat as exc:
        pytest.skip(f"no importer reads {name} yet: {exc}")


@cache
def default_tokenizer(show_reasoning: bool = False) -> Any:
    """The default model's tokenizer (only the tokenizer: no weights are loaded).

    `show_reasoning`: under a chat template that shows earlier assistant reasoning as
    <think>...</think> (as DeepSeek's and Qwen3's in-loop templates do). The served
    SmolLM2 template drops reasoning, so a reasoning rewrite changes no prompt token
    there; this variant measures what it removes where a template keeps it."""
    from mlx_lm.tokenizer_utils import load

    from jumpahead.engine.model.default_model import CHAT_TEMPLATE, ensure_default_model

    tokenizer = load(ensure_default_model(progress=lambda s: None))
    if show_reasoning:
        plain = "{{- '<|im_start|>assistant\\n' + content -}}"
        assert plain in CHAT_TEMPLATE, "the default template changed: update the reasoning variant"
        tokenizer._tokenizer.chat_template = CHAT_TEMPLATE.replace(
            plain, "{{- '<|im_start|>assistant\\n' -}}{%- if message.reasoning_content -%}"
                   "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' -}}{%- endif -%}{{- content -}}")
    return tokenizer


def window(session: Any, size: int, max_chars: int = 160_000) -> list[int]:
    """`size` consecutive assistant turns (message indices), each context extending the
    one before (no agent compaction in between), chosen where the most finished
    reasoning and visible text lies at its start, among contexts of at most
    `max_chars` characters (render time)."""
    from jumpahead.policies.sticky import calls_completed, last_turn_start, tool_results

    turns = session.assistant_indices()
    contexts = [session.context_indices(i) for i in turns]
    length = [len(m.content or "") + len(m.reasoning or "") + sum(len(c.arguments) for c in m.tool_calls)
              for m in session.messages]
    sizes = [sum(length[j] for j in c) for c in contexts]

    def run_ok(k: int) -> bool:
        return k + size <= len(turns) and all(
            sizes[j] <= max_chars and contexts[j + 1][:len(contexts[j])] == contexts[j] for j in range(k, k + size - 1)
        ) and sizes[k + size - 1] <= max_chars

    best, best_score = None, -1
    for k in range(len(turns)):
        if not run_ok(k):
            continue
        messages = session.turn(turns[k]).messages
        last, results = last_turn_start(messages), tool_results(messages)
        score = sum(len(messages[j].reasoning or "") + len(messages[j].content or "")
                    for j in range(last) if calls_completed(messages, j, results))
        if score > best_score:
            best, best_score = k, score
    if best is None:  # a short session: all its turns
        return turns[:size]
    return turns[best:best + size]


def snapshot(turn: Any) -> Any:
    return copy.deepcopy(turn)


def check_rewrite(original: Any, before: Any, out: Any, *, results_may_change: bool = False) -> list[int]:
    """The invariants of every context rewrite; returns the indices of changed messages.

    - the input Turn is not mutated (`before` is its deep copy taken first);
    - same messages in the same order: roles, tool-call ids, names and arguments, the
      tool results' call ids; user and system messages unchanged;
    - the last turn (newest assistant message and all after it) unchanged;
    - tool results unchanged unless `results_may_change` (masking)."""
    from jumpahead.policies.sticky import last_turn_start

    assert original == before, "on_request mutated its input Turn"
    a, b = original.messages, out.messages
    assert len(a) == len(b)
    changed = []
    last = last_turn_start(a)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.role == y.role
        assert [(c.id, c.name, c.arguments) for c in x.tool_calls] == [(c.id, c.name, c.arguments) for c in y.tool_calls]
        assert x.tool_call_id == y.tool_call_id
        if x.role in ("user", "system") or i >= last:
            assert x == y, f"message {i} ({x.role}) changed"
        if x.role == "tool" and not results_may_change:
            assert x.content == y.content, f"tool result {i} changed"
        if x != y:
            changed.append(i)
    assert out.tools == original.tools
    return changed


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
