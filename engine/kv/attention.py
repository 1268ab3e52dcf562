"""Scaled dot-product attention that is fast on MLX's CPU backend.

On the CPU, `mx.fast.scaled_dot_product_attention` falls back to composed ops, and
MLX's CPU `exp` (so its softmax) runs at ~86 M elements/s here, while numpy's
SIMD exp runs ~25x faster (BENCHMARKS.md). Attention's softmax has B*Hq*L*S
elements per layer, so it dominates wherever the scores are large: a verifying round
(L > 1 query per row), long contexts (S in the thousands: agent prompts are 10-30k
tokens) and prefill chunks (L = 512). A 512-token chunk at 10k context spends
~16 s in exp alone with MLX's, ~0.6 s with numpy's.

So where the score tensor is large this computes the scores with MLX's matmul (the
grouped query heads folded into the rows of one matmul per key head, no repeated
keys), evaluates them, takes the softmax in numpy, and multiplies by the values in
MLX. Evaluating mid-forward synchronizes once per layer, which measured cheap here
(the engine does not pipeline rounds on the CPU); tiny score tensors keep MLX's own
kernel. On a GPU nothing here applies: its kernels are fused.

`install(model)` points the `scaled_dot_product_attention` of every mlx-lm module
whose classes make up the model (wrappers such as qwen3_5 or the multimodal ones run
another file's attention classes) at `attention` for calls that carry our RowKVCache
layers; any other cache (mlx-lm's own, used by its generate) goes to the original
function unchanged.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import mlx.core as mx
import numpy as np

from . import host_work
from .prefill_attention import blocked_attention

# Score elements per layer (B * Hq * L * S) from which the numpy softmax is used.
# Measured break-even: single-row decoding at 400 cached tokens (3.6k elements) costs
# the same either way, at 1.2k tokens numpy is 11% faster per token, at 4k 27%.
NUMPY_MIN = 4096
# Quantized KV on the CPU: dequantize and use BLAS (quantized_attention); True takes the
# quantized_matmul path the GPU takes (the tests compare the two).
QUANTIZED_MATMUL_ON_CPU = False


def _mask_array(mask: Any, L: int, S: int) -> mx.array | None:
    """A boolean (True = visible) or additive mask broadcastable to [B, 1, L, S]."""
    if mask is None:
        return None
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"unsupported attention mask {mask!r}")
        # bottom-right aligned, as mx.fast.scaled_dot_product_attention's "causal"
        rows = mx.arange(L, dtype=mx.int32)[:, None] + (S - L)
        return mx.arange(S, dtype=mx.int32)[None, :] <= rows
    return mask


def _softmax_rows(x: np.ndarray, sink: np.ndarray | None = None) -> np.ndarray:
    """Softmax over the last axis of x, in place, in float32, with numpy's vectorized exp.

    `sink` (broadcastable to x[..., :1]): one more logit per row that takes part in
    the normalisation but has no value (gpt-oss's attention sinks). In place: a score
    tensor is ~11 MB per layer at 4k context, and a fresh array for each step costs
    page faults (freed memory goes back to the OS: engine/memory.py)."""
    top = x.max(axis=-1, keepdims=True)
    if sink is not None:
        top = np.maximum(top, sink)
    np.subtract(x, top, out=x)
    np.exp(x, out=x)
    total = x.sum(axis=-1, keepdims=True)
    if sink is not None:
        total = total + np.exp(sink - top)
    x /= total
    return x


# Score elements from which the softmax is split by rows over a few threads
# (engine/kv/host_work.py). Measured on a 2-core EPYC, the softmax of a 512-token
# chunk's scores at 2k context after their matmuls: 20.4 ms a layer on one thread, 11.6
# on two (BENCHMARKS.md, issue 42).
SPLIT_MIN = 1 << 20


def softmax_in_place(hosts: list[np.ndarray]) -> None:
    """_softmax_rows over each array (no sinks), split by rows over `host_work.workers()`
    threads where the arrays are large."""
    n = host_work.workers()
    if n == 1 or sum(h.size for h in hosts) < SPLIT_MIN:
        for h in hosts:
            _softmax_rows(h)
        return
    blocks = [b for h in hosts for b in host_work.row_blocks(h, n)]
    for f in [host_work.pool(n).submit(_softmax_rows, b) for b in blocks]:
        f.result()


def _masked(scores: mx.array, mask: Any, B: int, Hkv: int, rep: int, L: int, S: int) -> mx.array:
    """scores [B, Hkv, rep*L, S] with the mask applied (-inf where hidden)."""
    m = _mask_array(mask, L, S)
    if m is None:
        return scores
    s5 = scores.reshape(B, Hkv, rep, L, S)
    if m.ndim == 4:  # [B or 1, 1 or Hq, L, S]
        m = m.reshape(m.shape[0], -1, 1, L, S) if m.shape[1] == 1 else m.reshape(m.shape[0], Hkv, rep, L, S)
    if m.dtype == mx.bool_:
        s5 = mx.where(m, s5, mx.array(-np.inf, dtype=s5.dtype))
    else:
        s5 = s5 + m.astype(s5.dtype)
    return s5.reshape(B, Hkv, rep * L, S)


def _probabilities(scores: mx.array, sinks: mx.array | None, Hkv: int, rep: int, L: int) -> mx.array:
    """softmax over the keys of scores [B, Hkv, rep*L, S] in float32: numpy's exp where
    the tensor is large (module docstring), MLX's otherwise."""
    scores = scores.astype(mx.float32)
    if scores.size < NUMPY_MIN or mx.default_device() != mx.cpu:
        if sinks is None:
            return mx.softmax(scores, axis=-1, precise=True)
        sink = sinks.astype(mx.float32).reshape(1, Hkv, rep, 1, 1)
        sink = mx.broadcast_to(sink, (1, Hkv, rep, L, 1)).reshape(1, Hkv, rep * L, 1)
        top = mx.maximum(scores.max(axis=-1, keepdims=True), sink)
        e = mx.exp(scores - top)
        return e / (e.sum(axis=-1, keepdims=True) + mx.exp(sink - top))
    scores = mx.contiguous(scores)
    mx.eval(scores)
    sink = None
    if sinks is not None:  # query rows are (key head, rep, L): head h = kv * rep + r
        sink = np.asarray(sinks.astype(mx.float32)).reshape(1, Hkv, rep, 1, 1)
        sink = np.broadcast_to(sink, (1, Hkv, rep, L, 1)).reshape(1, Hkv, rep * L, 1)
    host = np.asarray(scores)
    if host.flags.owndata or not host.flags.writeable:  # numpy made a copy: return that
        return mx.array(_softmax_rows(host.copy(), sink))
    # the scores are this call's own evaluated buffer: the probabilities replace them there
    if sink is None and host.flags.c_contiguous:
        softmax_in_place([host])
    else:
        _softmax_rows(host, sink)
    return scores


def _hide_causal_tail(scores: mx.array, B: int, Hkv: int, rep: int, L: int, S: int) -> mx.array | None:
    """The "causal" mask applied in place on evaluated scores: only the last L columns
    hold hidden keys (query i sees columns <= S - L + i), so only their upper triangle
    is written, instead of a select over all S columns (a pass over the whole tensor).
    None where numpy cannot write the buffer in place (the caller masks in MLX)."""
    scores = mx.contiguous(scores.astype(mx.float32))
    mx.eval(scores)
    host = np.asarray(scores)
    if host.flags.owndata or not host.flags.writeable:
        return None
    tail = host.reshape(B, Hkv, rep, L, S)[..., S - L :]
    np.copyto(tail, -np.inf, where=np.triu(np.ones((L, L), dtype=bool), 1))  # no index arrays
    return scores


# Query rows (rep * L) per key head up to which, for heads up to KEYS_LEFT_MAX_DIM wide,
# the scores are computed as K @ Q^T (the keys the left operand of sgemm) and transposed
# back, instead of Q @ K^T. A decode step has rep (2-4) rows: at 64-wide heads OpenBLAS's
# sgemm then reads the keys at 1.1-2x the rate (scores of 30 layers at 8k context, one
# row: 18.7 vs 12.0 ms; four rows 83 vs 60 ms), with the same bits on this machine's
# OpenBLAS (each score sums the same products in the same order: tests/test_attention.py).
# At 128- and 256-wide heads (Gemma 3 270M) it measured 0.83-1.05x, and from 5 rows a
# key head (verifying rounds) 0.56-0.86x: those keep Q @ K^T (BENCHMARKS.md, issue 42).
KEYS_LEFT_MAX_ROWS = 4
KEYS_LEFT_MAX_DIM = 64

# Query rows (rep * L) per key head from which a prefill-sized forward takes one 2D
# matmul per (row, key head) instead of one batched matmul: MLX's CPU batched matmul
# ran the scores of a 512-token chunk at 2k context at a third of the speed of the same
# sgemm calls made one by one (24 vs 8 ms a layer), with bit-identical results.
PER_HEAD_MIN_ROWS = 64
def _per_head(q: mx.array, k: mx.array, v: mx.array, scale: float, causal: bool, rep: int) -> mx.array | None:
    """The numpy-softmax attention (causal or unmasked, uniform rows) with one 2D
    matmul per (row, key head) for the scores and the weighted sum. Same arithmetic
    per element as the batched path (tests/test_attention.py compares them bit for
    bit); None where numpy cannot write an evaluated buffer in place (the caller
    takes the batched path)."""
    B, Hq, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    qs = (q * scale).reshape(B, Hkv, rep * L, D)
    parts = [mx.contiguous((qs[b, h] @ k[b, h].swapaxes(-1, -2)).astype(mx.float32))
             for b in range(B) for h in range(Hkv)]  # [rep*L, S] each
    mx.eval(parts)
    hosts = [np.asarray(p) for p in parts]
    if any(h.flags.owndata or not h.flags.writeable for h in hosts):
        return None
    if causal:  # rows are (rep, L): query i of each head hides the tail's columns > i
        hidden = np.triu(np.ones((L, L), dtype=bool), 1)
        for host in hosts:
            np.copyto(host.reshape(rep, L, S)[..., S - L :], -np.inf, where=hidden)  # no index arrays
    softmax_in_place(hosts)
    outs = [p.astype(v.dtype) @ v[i // Hkv, i % Hkv] for i, p in enumerate(parts)]  # [rep*L, Dv]
    return mx.stack(outs).reshape(B, Hq, L, v.shape[-1])


def attention(
    q: mx.array, k: Any, v: Any, scale: float, mask: Any = None, sinks: mx.array | None = None,
    fmt: Any = None,
) -> mx.array:
    """softmax(q k^T * scale + mask) v for q [B, Hq, L, D], k/v [B, Hkv, S, D];
    `sinks` [Hq]: a per-head logit in the softmax without a value (gpt-oss). With `fmt`
    (a KVFormat), k and v are quantized triples (engine/kv/kv_format.py)."""
    if fmt is not None:
        return quantized_attention(q, k, v, scale, mask, sinks, fmt)
    B, Hq, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    if B * Hq * L * S < NUMPY_MIN or mx.default_device() != mx.cpu:
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask, sinks=sinks)
    rep = Hq // Hkv
    causal = isinstance(mask, str) and mask == "causal" and L > 1
    if (causal or mask is None) and sinks is None and rep * L >= PER_HEAD_MIN_ROWS:
        out = blocked_attention(q, k, v, scale, causal, rep)  # engine/kv/prefill_attention.py
        if out is not None:
            return out
    if (causal or mask is None) and sinks is None and rep * L >= PER_HEAD_MIN_ROWS and B * Hkv > 1:
        out = _per_head(q, k, v, scale, causal, rep)
        if out is not None:
            return out
    # query head h reads key head h // rep: fold the rep heads' queries into rows
    qs = (q * scale).reshape(B, Hkv, rep * L, D)
    if rep * L <= KEYS_LEFT_MAX_ROWS and D <= KEYS_LEFT_MAX_DIM:  # decoding: the keys as sgemm's left operand
        scores = (k @ qs.swapaxes(-1, -2)).swapaxes(-1, -2)  # [B, Hkv, rep*L, S], transposed view
    else:
        scores = qs @ k.swapaxes(-1, -2)  # [B, Hkv, rep*L, S]
    masked = _hide_causal_tail(scores, B, Hkv, rep, L, S) if causal else None
    if masked is None:
        masked = _masked(scores, mask, B, Hkv, rep, L, S)
    probs = _probabilities(masked, sinks, Hkv, rep, L)
    out = probs.astype(v.dtype) @ v  # [B, Hkv, rep*L, Dv]
    return out.reshape(B, Hq, L, v.shape[-1])


def quantized_attention(q: mx.array, k: tuple, v: tuple, scale: float, mask: Any, sinks: mx.array | None,
                        fmt: Any) -> mx.array:
    """Attention over quantized keys and values.

    On the CPU the keys and values this forward reads are dequantized and the float
    path above runs: MLX's CPU `quantized_matmul` is a plain loop, 5-8x slower than
    dequantizing and using BLAS once a round carries 2 or more queries per row, and
    about even for one (9 query / 3 KV heads, 4k keys: 1 query 3.1 vs 2.7 ms, 8
    queries 20.9 vs 4.8 ms per layer at 8 bits). Elsewhere (Apple silicon) the scores
    and the weighted sum are `quantized_matmul`s on the packed words, as mlx-lm's
    quantized attention does, with our softmax (sinks, separate key and value bits)."""
    if mx.default_device() == mx.cpu and not QUANTIZED_MATMUL_ON_CPU:
        kd = mx.dequantize(*k, group_size=fmt.group_size, bits=fmt.key_bits).astype(q.dtype)
        vd = mx.dequantize(*v, group_size=fmt.group_size, bits=fmt.value_bits).astype(q.dtype)
        return attention(q, kd, vd, scale, mask, sinks)
    B, Hq, L, D = q.shape
    Hkv, S = k[0].shape[1], k[0].shape[2]
    rep = Hq // Hkv
    qs = (q * scale).reshape(B, Hkv, rep * L, D)
    scores = mx.quantized_matmul(qs, *k, transpose=True, group_size=fmt.group_size, bits=fmt.key_bits)
    probs = _probabilities(_masked(scores, mask, B, Hkv, rep, L, S), sinks, Hkv, rep, L)
    out = mx.quantized_matmul(probs.astype(q.dtype), *v, transpose=False, group_size=fmt.group_size,
                              bits=fmt.value_bits)  # [B, Hkv, rep*L, Dv]
    return out.reshape(B, Hq, L, out.shape[-1])


def model_modules(model: Any) -> list[Any]:
    """The Python modules of every class in the model's module tree (mlx-lm wrappers,
    e.g. qwen3_5 or the multimodal gemma3/gemma4/mistral3, run attention classes of
    another model file), in first-seen order."""
    seen: dict[str, Any] = {}
    for _, m in model.named_modules():
        name = type(m).__module__
        if name not in seen and sys.modules.get(name) is not None:
            seen[name] = sys.modules[name]
    name = type(model).__module__
    if name not in seen and sys.modules.get(name) is not None:
        seen[name] = sys.modules[name]
    return list(seen.values())


def _route(module: Any) -> bool:
    """Point `module.scaled_dot_product_attention` at `attention` for our cache layers;
    False where the module has no such function."""
    from .row_cache import LayerCache

    original: Callable | None = getattr(module, "scaled_dot_product_attention", None)
    if original is None:
        return False
    if getattr(original, "_jumpahead", False):
        return True

    def routed(queries, keys, values, cache, scale, mask, sinks=None):
        if isinstance(cache, LayerCache):
            # quantized layers hand the model dequantized views (row_cache.py); where
            # those reach attention unchanged, the packed triples they came from are read
            kq, vq = cache.quantized_for(keys, values)
            if kq is not None:
                return attention(queries, kq, vq, scale, mask, sinks, fmt=cache.fmt)
            return attention(queries, keys, values, scale, mask, sinks)
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    routed._jumpahead = True  # type: ignore[attr-defined]
    routed._original = original  # type: ignore[attr-defined]
    module.scaled_dot_product_attention = routed
    return True


def install(model: Any) -> bool:
    """Route the attention calls with our cache layers through `attention`, in every
    module whose classes make up the model (model_modules). Returns False (and changes
    nothing) where none of them calls mlx-lm's `scaled_dot_product_attention`."""
    routed = [_route(m) for m in model_modules(model)]
    return any(routed)
