"""Token-for-token oracles, with a proof of near-tie where float rounding differs.

Batched and single-row forwards use different matmul shapes, so the last bits of a
logit can differ; when two candidate tokens are within that noise, argmax may flip.
`assert_same_or_near_tie` accepts a divergence only if, at the first differing
position, the two tokens' logits (recomputed by plain mlx-lm on the shared prefix)
are within `tol` of each other and are the top two.
"""

from __future__ import annotations

import mlx.core as mx

NEAR_TIE = 1e-2  # logits are O(10); batched-vs-alone float32 noise is O(1e-5..1e-3)


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def reference_logits(model, tokens: list[int]) -> mx.array:
    """Plain mlx-lm forward over the whole sequence; logits of the last position."""
    out = model(mx.array([tokens], dtype=mx.int32))[0, -1].astype(mx.float32)
    mx.eval(out)
    return out


def assert_same_or_near_tie(model, prompt: list[int], got: list[int], want: list[int], tol: float = NEAR_TIE,
                            logits_fn=None) -> str:
    """Pass if equal; else prove the first divergence is a near-tie. Returns a note.
    `logits_fn(tokens)` replaces the plain forward as the reference (e.g. a forward
    over the same quantized KV cache)."""
    i = first_difference(got, want)
    if i is None:
        return "identical"
    assert i < len(got) and i < len(want), f"lengths differ without a token difference: {len(got)} vs {len(want)}"
    logits = (logits_fn or (lambda t: reference_logits(model, t)))(prompt + want[:i])
    a, b = float(logits[got[i]]), float(logits[want[i]])
    top2 = mx.argsort(-logits)[:2].tolist()
    assert abs(a - b) <= tol and {got[i], want[i]} == set(top2), (
        f"divergence at output position {i} is not a near-tie: tokens {got[i]} vs {want[i]}, "
        f"logits {a:.5f} vs {b:.5f}, top2 {top2}"
    )
    return f"near-tie at {i}: |{a:.5f} - {b:.5f}| <= {tol}"
