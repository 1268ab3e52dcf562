"""Proposal method names, and which ones a server runs when a request names none.

Exact methods never change the output (docs/design.md, Proposal): verified copies (echo,
n-gram) are accepted only where the row's own sampler picks them, and checked strict
fill only where the masked sampler does. Echo and checked strict fill are the
server's default (`jumpahead serve`; `--methods none` turns every proposer off,
strict fill too): the benches show them not slowing rows with nothing to copy or a
mixed batch. N-gram is exact too but stays opt-in: it proposes on one-token matches
and has no back-off on rows with nothing to copy (echo has), and no bench has shown
it paying next to echo. Unverified methods (a policy's jumps, asserted strict fill)
change what the model reads and stay opt-in; a draft model needs a second model.
"""

from __future__ import annotations

from typing import Sequence

KNOWN = ("echo", "ngram", "draft", "strict")
OFF = frozenset({"none", "off"})
# `jumpahead bench fill` measured echo against methods off: no-copy and mixed-batch
# arms no slower, copy-heavy turns faster (BENCHMARKS.md, "Exact methods by default").
# Strict fill is not listed: it runs unless a list says none/off (engine/strict.py).
SERVER_DEFAULT: tuple[str, ...] = ("echo",)


def parse_methods(text: str | None) -> tuple[str, ...]:
    """A `--methods` value: None = SERVER_DEFAULT; "none"/"off" = every proposer off
    (strict fill too); else comma-separated KNOWN names. ValueError names the bad ones."""
    if text is None:
        return SERVER_DEFAULT
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in names if m not in KNOWN and m not in OFF]
    if unknown:
        raise ValueError(f"unknown method(s) in --methods: {', '.join(unknown)} "
                         f"(known: {', '.join(KNOWN)}; 'none' turns every method off)")
    if set(names) & OFF and len(names) > 1:
        raise ValueError("--methods none cannot be combined with other methods")
    return names  # () = strict fill only


def describe(methods: Sequence[str]) -> list[str]:
    """What a method list runs, spelled out (strict fill is implied unless off)."""
    if set(methods) & OFF:
        return []
    return sorted(set(methods) | {"strict"})
