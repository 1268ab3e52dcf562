"""Copy-opportunity analysis: how much of what a model types was already in front of it.

For each tool call of a session, its arguments' values (a write's content, an edit's
old and new strings, a bash command: what the model must type) are tokenized with the
serving model's tokenizer, and a call token counts as *copyable* from a source where
it lies in an exact window of W=8 consecutive tokens that appeared strictly earlier in
the session in that source (docs/design.md, "What real sessions show"). Sources are kinds
of earlier material: the model's reasoning, its visible text, system, user, tool
results (also with Claude Code's `N→` line-number prefixes stripped) and earlier
tool calls. Each text segment is tokenized on its own and windows never cross
segments; overlapping matched windows are merged, so each call token counts once.

Order rules: an assistant message's reasoning and text precede its calls; a call is
measured before it joins the index (never its own source), so its earlier sibling
calls count but it does not. Gen-to-gen duplicates measure each assistant message's
whole output against earlier assistant messages only.

One dict maps each window (its token ids as bytes: exact, no hash collisions) to a
bit mask of the source kinds it was seen in, so a session costs one pass.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from jumpahead.core.turn import ToolCall
from .session import Session

KIND = "jumpahead.analysis"
VERSION = 1
W = 8  # window length in tokens

# source kinds, one bit each
SYSTEM, USER, TOOL_RESULT, TOOL_RESULT_STRIPPED, CALL, REASONING, TEXT = (1 << i for i in range(7))

# measure name -> the source kinds it accepts
MEASURES: dict[str, int] = {
    "reasoning_text": REASONING | TEXT,  # (a) the model's own reasoning and visible text
    "reasoning": REASONING,  # (a') hidden reasoning alone
    "context": SYSTEM | USER | TOOL_RESULT | CALL,  # (b) the context, tool results as sent
    "context_stripped": SYSTEM | USER | TOOL_RESULT | TOOL_RESULT_STRIPPED | CALL,  # (b) modulo `N→`
    "tool_results": TOOL_RESULT,
    "tool_results_stripped": TOOL_RESULT | TOOL_RESULT_STRIPPED,
    "calls": CALL,
    "user": USER,
    "system": SYSTEM,
    "any": SYSTEM | USER | TOOL_RESULT | TOOL_RESULT_STRIPPED | CALL | REASONING | TEXT,
}
OUTPUT = REASONING | TEXT | CALL  # what assistant messages generated (gen-to-gen duplicates)

# Claude Code's Read result prefix: right-aligned line number and an arrow
_LINE_NUMBER = re.compile(r"^ *\d+→", re.MULTILINE)

Encoder = Callable[[list[str]], list[list[int]]]


def strip_line_numbers(text: str) -> str:
    """`     12→code` -> `code` on every line (Claude Code's Read results)."""
    return _LINE_NUMBER.sub("", text)


def argument_values(call: ToolCall) -> list[str]:
    """The texts the model types for a call: its argument values, in order.

    Keys, quotes and JSON syntax are left out: a template or grammar supplies those.
    Raw-text arguments that parse as JSON are treated as the parsed value.
    """
    args: Any = call.arguments
    if isinstance(args, str):
        try:
            parsed = orjson.loads(args)
        except orjson.JSONDecodeError:
            return [args] if args else []
        if not isinstance(parsed, (dict, list)):
            return [args] if args else []
        args = parsed
    out: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, str):
            if v:
                out.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif v is not None:
            out.append(orjson.dumps(v).decode())  # numbers, booleans as typed

    walk(args)
    return out


def batch_encoder(tokenizer: Any) -> Encoder:
    """texts -> token ids without special tokens, batched where the tokenizer allows."""
    inner = getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's TokenizerWrapper wraps HF
    backend = getattr(inner, "backend_tokenizer", None)
    if backend is None and hasattr(inner, "encode_batch"):
        backend = inner  # a bare `tokenizers.Tokenizer`
    if backend is not None:
        return lambda texts: [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    return lambda texts: [list(inner.encode(t, add_special_tokens=False)) for t in texts]


def _windows(ids: np.ndarray) -> list[bytes]:
    """Every W-token window of `ids` as an exact bytes key."""
    if len(ids) < W:
        return []
    win = np.ascontiguousarray(np.lib.stride_tricks.sliding_window_view(ids, W))
    return win.view(f"V{4 * W}").ravel().tolist()


class _Index:
    """window -> bit mask of the source kinds it appeared in (first appearance is enough)."""

    def __init__(self) -> None:
        self.seen: dict[bytes, int] = {}

    def add(self, keys: list[bytes], kind: int) -> None:
        seen = self.seen
        for k in keys:
            seen[k] = seen.get(k, 0) | kind

    def masks(self, keys: list[bytes]) -> np.ndarray:
        get = self.seen.get
        return np.fromiter((get(k, 0) for k in keys), dtype=np.int64, count=len(keys))


def _covered(masks: np.ndarray, accept: int, n: int) -> np.ndarray:
    """Per token of an n-token segment: lies in some matched window (windows merged)."""
    if n < W:
        return np.zeros(n, dtype=bool)
    hit = ((masks & accept) != 0).astype(np.int32)
    return np.convolve(hit, np.ones(W, dtype=np.int32))[:n] > 0


def _longest_run(cover: np.ndarray) -> int:
    if not cover.any():
        return 0
    padded = np.concatenate(([0], cover.astype(np.int8), [0]))
    edges = np.flatnonzero(np.diff(padded))
    return int((edges[1::2] - edges[::2]).max())


class _Segment:
    """One text tokenized on its own, with its window keys."""

    __slots__ = ("n", "keys")

    def __init__(self, ids: Sequence[int]) -> None:
        arr = np.asarray(ids, dtype=np.uint32)
        self.n = len(arr)
        self.keys = _windows(arr)


def _share(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def analyze_session(session: Session, tokenizer: Any, *, encode: Encoder | None = None) -> dict[str, Any]:
    """The copy-opportunity figures of one session (see the module docstring)."""
    t0 = time.perf_counter()
    encode = encode or batch_encoder(tokenizer)

    # Tokenize every distinct text of the session in one batch.
    texts: dict[str, None] = {}
    tool_texts = [orjson.dumps(t).decode() for t in session.tools]
    for t in tool_texts:
        texts[t] = None
    for m in session.messages:
        for t in (m.content, m.reasoning):
            if t:
                texts[t] = None
        if m.role == "tool" and m.content:
            texts[strip_line_numbers(m.content)] = None
        for c in m.tool_calls:
            for v in argument_values(c):
                texts[v] = None
    order = list(texts)
    segs = dict(zip(order, (_Segment(ids) for ids in encode(order)))) if order else {}

    index = _Index()
    copyable = dict.fromkeys(MEASURES, 0)
    tokens = {"output": 0, "reasoning": 0, "text": 0, "calls": 0}
    duplicate = 0
    rows: list[dict[str, Any]] = []

    for t in tool_texts:  # tool definitions sit in the system prompt
        index.add(segs[t].keys, SYSTEM)

    turn = -1
    for mi, m in enumerate(session.messages):
        if m.role != "assistant":
            kind = {"system": SYSTEM, "user": USER, "tool": TOOL_RESULT}.get(m.role, USER)
            if m.content:
                index.add(segs[m.content].keys, kind)
                if kind == TOOL_RESULT:
                    stripped = strip_line_numbers(m.content)
                    if stripped != m.content:
                        index.add(segs[stripped].keys, TOOL_RESULT_STRIPPED)
            continue

        turn += 1
        calls = [(c, [segs[v] for v in argument_values(c)]) for c in m.tool_calls]
        own = [segs[t] for t in (m.reasoning, m.content) if t] + [s for _, ss in calls for s in ss]
        # gen-to-gen: against earlier assistant output only (nothing of this message indexed yet)
        for s in own:
            duplicate += int(_covered(index.masks(s.keys), OUTPUT, s.n).sum())
        tokens["reasoning"] += segs[m.reasoning].n if m.reasoning else 0
        tokens["text"] += segs[m.content].n if m.content else 0
        tokens["output"] += sum(s.n for s in own)
        # reasoning and visible text come before the message's calls
        if m.reasoning:
            index.add(segs[m.reasoning].keys, REASONING)
        if m.content:
            index.add(segs[m.content].keys, TEXT)

        for ci, (call, call_segs) in enumerate(calls):
            n = sum(s.n for s in call_segs)
            counts = dict.fromkeys(MEASURES, 0)
            longest = 0
            for s in call_segs:
                masks = index.masks(s.keys)
                for name, accept in MEASURES.items():
                    cover = _covered(masks, accept, s.n)
                    counts[name] += int(cover.sum())
                    if name == "any":
                        longest = max(longest, _longest_run(cover))
            for name in MEASURES:
                copyable[name] += counts[name]
            tokens["calls"] += n
            rows.append({
                "message": mi, "turn": turn, "call": ci, "tool": call.name, "tokens": n,
                "copyable": counts["any"], "from_context": counts["context_stripped"],
                "from_reasoning_text": counts["reasoning_text"], "from_reasoning": counts["reasoning"],
                "longest_span": longest,
            })
            for s in call_segs:  # measured first: a call is never its own source
                index.add(s.keys, CALL)

    return {
        "id": session.id,
        "format": session.format,
        "source": session.source,
        "messages": len(session.messages),
        "assistant_messages": turn + 1,
        "tool_calls": len(rows),
        "tokens": tokens,
        "calls_share_of_output": _share(tokens["calls"], tokens["output"]),
        "copyable": copyable,
        "shares": {k: _share(v, tokens["calls"]) for k, v in copyable.items()},
        "gen_to_gen": {"tokens": duplicate, "share": _share(duplicate, tokens["output"])},
        "calls": rows,
        "elapsed_s": round(time.perf_counter() - t0, 3),
    }


def combine(sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """Overall figures: token sums over sessions, shares of the sums."""
    tokens = {k: sum(s["tokens"][k] for s in sessions) for k in ("output", "reasoning", "text", "calls")}
    copyable = {k: sum(s["copyable"][k] for s in sessions) for k in MEASURES}
    duplicate = sum(s["gen_to_gen"]["tokens"] for s in sessions)
    by_tool: dict[str, dict[str, Any]] = {}
    for s in sessions:
        for r in s["calls"]:
            t = by_tool.setdefault(r["tool"], {"calls": 0, "tokens": 0, "copyable": 0, "from_context": 0,
                                               "from_reasoning_text": 0})
            t["calls"] += 1
            for k in ("tokens", "copyable", "from_context", "from_reasoning_text"):
                t[k] += r[k]
    return {
        "sessions": len(sessions),
        "assistant_messages": sum(s["assistant_messages"] for s in sessions),
        "tool_calls": sum(s["tool_calls"] for s in sessions),
        "tokens": tokens,
        "calls_share_of_output": _share(tokens["calls"], tokens["output"]),
        "copyable": copyable,
        "shares": {k: _share(v, tokens["calls"]) for k, v in copyable.items()},
        "gen_to_gen": {"tokens": duplicate, "share": _share(duplicate, tokens["output"])},
        "by_tool": dict(sorted(by_tool.items(), key=lambda kv: -kv[1]["tokens"])),
    }


def load_tokenizer(path: str | None = None) -> Any:
    """The tokenizer only (never the weights): of `path`, else of the default model."""
    from mlx_lm.tokenizer_utils import load

    if path is None:
        import jumpahead.engine  # noqa: F401  (loads OpenBLAS before mlx)
        from jumpahead.engine.model.default_model import ensure_default_model

        folder = ensure_default_model(progress=lambda s: None)
    else:
        folder = Path(path).expanduser()
        if not folder.is_dir():  # a named model or a GGUF file: its converted folder
            import jumpahead.engine  # noqa: F401  (loads OpenBLAS before mlx)
            from jumpahead.engine.model.loader import KNOWN_MODELS, resolve_model

            if path in KNOWN_MODELS or folder.is_file():
                folder = Path(resolve_model(path, progress=lambda s: print(s, file=sys.stderr))[0])
        if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
            raise ValueError(f"{path}: not a model folder with a tokenizer (no tokenizer.json)")
    return load(folder)


def analyze_paths(paths: list[str], tokenizer_path: str | None = None) -> dict[str, Any]:
    """Analyze every session in every file; raises formats.UnknownFormat for unreadable files."""
    from .formats import load_sessions

    t0 = time.perf_counter()
    loaded = [(p, load_sessions(p)) for p in paths]  # fail on a bad file before loading a tokenizer
    tokenizer = load_tokenizer(tokenizer_path)
    encode = batch_encoder(tokenizer)
    sessions = [analyze_session(s, tokenizer, encode=encode) for _, ss in loaded for s in ss]
    return {
        "kind": KIND,
        "version": VERSION,
        "window": W,
        "tokenizer": tokenizer_path or "default",
        "files": [str(p) for p in paths],
        "sessions": sessions,
        "overall": combine(sessions),
        "elapsed_s": round(time.perf_counter() - t0, 3),
    }


_COLUMNS = [  # header, measure (a share of tool-call tokens)
    ("(a)rsn+txt", "reasoning_text"), ("(a')rsn", "reasoning"), ("(b)ctx", "context"),
    ("ctx-N→", "context_stripped"), ("results", "tool_results"), ("calls", "calls"),
    ("user", "user"), ("system", "system"),
]


def format_table(result: dict[str, Any]) -> str:
    """A fixed-width table: one row per session and an overall row."""
    name_w = 28
    head = (f"{'session':<{name_w}} {'format':<13} {'out tok':>8} {'call tok':>8} {'call%':>6} "
            + " ".join(f"{h:>10}" for h, _ in _COLUMNS) + f" {'gen2gen':>8}")

    def line(name: str, fmt: str, r: dict[str, Any]) -> str:
        if len(name) > name_w:
            name = name[: name_w - 1] + "…"
        return (f"{name:<{name_w}} {fmt:<13} {r['tokens']['output']:>8} {r['tokens']['calls']:>8} "
                f"{100 * r['calls_share_of_output']:>5.1f}% "
                + " ".join(f"{100 * r['shares'][m]:>9.1f}%" for _, m in _COLUMNS)
                + f" {100 * r['gen_to_gen']['share']:>7.1f}%")

    out = [f"copyable share of tool-call tokens (exact {result.get('window', W)}-token windows seen earlier; "
           "ctx-N→: tool results also matched without line-number prefixes)", head, "-" * len(head)]
    for s in result["sessions"]:
        out.append(line(str(s["id"]), str(s["format"]), s))
    out.append("-" * len(head))
    out.append(line("overall", f"{result['overall']['sessions']} sessions", result["overall"]))
    tools = list(result["overall"]["by_tool"].items())[:8]
    if tools:
        out.append("")
        out.append(f"{'tool':<20} {'calls':>6} {'tokens':>8} {'ctx%':>6} {'rsn+txt%':>9}")
        for name, t in tools:
            out.append(f"{name[:20]:<20} {t['calls']:>6} {t['tokens']:>8} "
                       f"{100 * _share(t['from_context'], t['tokens']):>5.1f}% "
                       f"{100 * _share(t['from_reasoning_text'], t['tokens']):>8.1f}%")
    return "\n".join(out)
