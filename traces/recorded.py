"""What our own traces recorded for a turn, as replay needs it.

A jumpahead trace (`serve --trace-dir`) keeps the exact token ids the model emitted
(the provenance runs). Replay forces those ids rather than the answer re-rendered from
its text: a model's own tokenization is often not the canonical one (under a grammar
the model may write `<` then `tool_call>`; strict fill appends the grammar's tokens,
not the tokenizer's merges), and a turn cut by `max_tokens` or a stop string has no
EOS. A re-rendered answer then has other ids and often another count, and every
provenance figure (what strict fill or echo supplied) is counted over other tokens.
"""

from __future__ import annotations

from typing import Any

from jumpahead.core.turn import Message


def recorded_tokens(message: Message) -> list[int] | None:
    """The output ids a jumpahead trace recorded for this assistant message (None: the
    message holds none, or its answer continued an assistant prefix the client sent,
    so the ids cover only part of the message)."""
    runs = message.meta.get("runs")
    if not runs or message.meta.get("continues"):
        return None
    tokens = [t for run in runs for t in run.get("tokens") or []]
    return [int(t) for t in tokens] if tokens else None


def same_tokenizer(tokenizer: Any, message: Message) -> bool:
    """True when `tokenizer` decodes every recorded run to the text the recording
    server's tokenizer decoded it to: the ids mean the same text to this model (a trace
    recorded with another model's vocabulary fails this at its first run)."""
    runs = message.meta.get("runs") or []
    for run in runs:
        ids = [int(t) for t in run.get("tokens") or []]
        try:
            if tokenizer.decode(ids) != run.get("text", ""):
                return False
        except Exception:  # ids this tokenizer cannot decode
            return False
    return True


def recorded_output(tokenizer: Any, message: Message) -> tuple[str, list[int]] | None:
    """(text without EOS, ids) of the recorded answer when replay should force the ids
    themselves; None where the answer must be rendered from its text."""
    tokens = recorded_tokens(message)
    if tokens is None or not same_tokenizer(tokenizer, message):
        return None
    eos = set(getattr(tokenizer, "eos_token_ids", ()) or ())
    body = tokens[:-1] if tokens[-1] in eos else tokens
    return tokenizer.decode(body), tokens
