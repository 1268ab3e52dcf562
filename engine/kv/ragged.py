"""A forward over rows of different widths that computes no padding outside attention.

A verifying Round is ragged: a row carrying 8 proposal tokens sits next to rows that
carry none. Padding every row to the widest one makes each padded position cost what
a real token costs (on this CPU a batch of 4 is compute-bound: width 9 costs 2.8x
width 1), so rows with nothing to propose would pay for their neighbours' proposals.
Here the rows' real tokens are packed into one sequence [1, T] for everything that
acts per token (embedding, norms, q/k/v/o projections, RoPE, MLP, head), and keys
and values go straight from the packed sequence into each row's cache slots by one
scatter per layer. Only the queries are spread into a padded [B, W] grid, for
attention (padded slots repeat the row's last real query; their outputs are
dropped). Attention runs in one call over the grid, or, where that spares many
padded queries, per run of consecutive equal-width rows on slices of the cache
(RaggedLayout.runs). With only a few padded slots the plain padded forward is
cheaper still (MIN_PADS; ModelRunner.forward_ragged).

mlx-lm's decoder layers cannot be called this way (their attention reshapes its input
to [B, L, ...] before projecting), so this re-states the standard pre-norm block
(llama, mistral, qwen2, qwen3) from the layer's own modules and weights; any other
model class takes the padded path (ModelRunner.forward_ragged).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from . import fast_ops
from .attention import attention
from .row_cache import ForwardPlan, RowKVCache, map_buffer

RAGGED_MODEL_TYPES = {"llama", "mistral", "qwen2", "qwen3"}


def supports_ragged(model: nn.Module) -> bool:
    """True when every layer is the standard pre-norm block this module re-states."""
    args = getattr(model, "args", None)
    if getattr(args, "model_type", None) not in RAGGED_MODEL_TYPES or not hasattr(model, "model"):
        return False
    for layer in model.layers:
        attn = getattr(layer, "self_attn", None)
        if getattr(layer, "use_sliding", False) or attn is None:
            return False
        if not all(hasattr(attn, a) for a in ("q_proj", "k_proj", "v_proj", "o_proj", "rope", "scale")):
            return False
        if not all(hasattr(layer, a) for a in ("mlp", "input_layernorm", "post_attention_layernorm")):
            return False
    return True


# Attention runs per run of consecutive rows of equal width when that saves more than
# it costs. On this CPU every MLX op costs ~30-40 us of dispatch, so one more run (its
# slices, RoPE, attention and reshapes in 30 layers) costs ~5-6 ms a forward, while a
# padded query slot costs ~1 ms at ~250 cached tokens (more as the context grows).
# Measured at B=4 (ms): [9,1,9,1] one call 176 vs per run 175; [2,1,2,1] 100 vs 118;
# at B=4 [17,1,1,1] and B=12 [9,1x11] runs won 25 and 100 ms.
SLOT_PER_CALL = 1 / 6  # padded query slots that pay for one more attention run
# Below this many padded slots the plain padded forward (mlx-lm's own layers) wins:
# the ragged path's extra gathers cost more than a few padded tokens' MLP (B=4: [2,1,1,1]
# padded 85 vs ragged 88 ms, [2,1,2,1] 90 vs 100; [3,3,1,1] 108 vs 98).
MIN_PADS = 4


@dataclass
class QueryRun:
    start: int  # first row (rows start..stop-1 share one width)
    stop: int
    width: int
    mask: mx.array | str | None = None  # the run's rows of the forward's mask (set per forward)


class RaggedLayout:
    """Where each row's real tokens sit in the packed sequence and the padded grid."""

    def __init__(self, widths: list[int]) -> None:
        self.widths = widths
        self.B = len(widths)
        self.W = max(widths)
        self.offsets: list[int] = []  # row b's first packed index
        at = 0
        for n in widths:
            self.offsets.append(at)
            at += n
        self.T = at
        # flat padded index (b * W + i) -> packed index; padded slots repeat the row's last
        self.spread = mx.array(
            [self.offsets[b] + min(i, n - 1) for b, n in enumerate(widths) for i in range(self.W)], dtype=mx.int32
        )
        # packed index -> flat padded index (b * W + i)
        self.pack = mx.array([b * self.W + i for b, n in enumerate(widths) for i in range(n)], dtype=mx.int32)
        runs: list[QueryRun] = []
        for b, n in enumerate(widths):
            if runs and runs[-1].width == n:
                runs[-1].stop = b + 1
            else:
                runs.append(QueryRun(b, b + 1, n))
        pads = self.B * self.W - self.T
        # None: one attention call over the padded grid
        self.runs: list[QueryRun] | None = runs if len(runs) > 1 and pads * SLOT_PER_CALL >= len(runs) - 1 else None

    def plan(self, plan: ForwardPlan) -> None:
        """Give the forward's plan each packed token's row and position (the cache
        writes only real tokens) and slice its mask for each run."""
        plan.token_rows = [b for b, n in enumerate(self.widths) for _ in range(n)]
        plan.token_pos = [plan.starts[b] + i for b, n in enumerate(self.widths) for i in range(n)]
        # RoPE offset of each packed token (engine/kv/fast_ops.py reads its positions' bound)
        self.positions = fast_ops.mark(mx.array(plan.token_pos, dtype=mx.int32), max(plan.token_pos) + 1)
        for r in self.runs or ():
            r.mask = plan.mask[r.start : r.stop, :, : r.width, :]


def _grid(x: mx.array, spread: mx.array, rows: int, heads: int) -> mx.array:
    """[T, heads*D] packed -> [rows, heads, W, D] padded."""
    return mx.take(x, spread, axis=0).reshape(rows, -1, heads, x.shape[-1] // heads).transpose(0, 2, 1, 3)


def _attention(attn: nn.Module, x: mx.array, layout: RaggedLayout, cache) -> mx.array:
    n_heads, n_kv = attn.n_heads, attn.n_kv_heads
    T = layout.T

    def heads(proj: nn.Module, n: int, norm: nn.Module | None) -> mx.array:
        """Project the packed tokens, each its own length-1 sequence [T, n, 1, D], so
        that per-head norms (qwen3) and RoPE (offset = the token's position) apply
        per token; -> [T, n, D]."""
        y = proj(x)[0].reshape(T, n, 1, -1)
        if norm is not None:
            y = norm(y)
        return attn.rope(y, offset=layout.positions).reshape(T, n, -1)

    # Keys and values stay packed and land in the cache by one scatter (no padded grid).
    k = heads(attn.k_proj, n_kv, getattr(attn, "k_norm", None))
    keys, values = cache.update_tokens(k, attn.v_proj(x)[0].reshape(T, n_kv, -1))
    q = heads(attn.q_proj, n_heads, getattr(attn, "q_norm", None)).reshape(T, -1)  # [T, heads*D]
    if layout.runs is None:
        q = _grid(q, layout.spread, layout.B, n_heads)
        out = attention(q, keys, values, attn.scale, cache.plan.mask, fmt=cache.fmt)
        out = out.transpose(0, 2, 1, 3).reshape(layout.B * layout.W, -1)
        return attn.o_proj(mx.take(out, layout.pack, axis=0)[None])
    outs = []
    for r in layout.runs:
        # a run's rows are contiguous in the packed order and in the batch: slices, no copies
        a, b = layout.offsets[r.start], layout.offsets[r.stop - 1] + r.width
        qr = q[a:b].reshape(r.stop - r.start, r.width, n_heads, -1).transpose(0, 2, 1, 3)
        rows = lambda a: a[r.start : r.stop]  # noqa: E731
        kr, vr = map_buffer(keys, rows), map_buffer(values, rows)
        out = attention(qr, kr, vr, attn.scale, r.mask, fmt=cache.fmt)
        outs.append(out.transpose(0, 2, 1, 3).reshape((r.stop - r.start) * r.width, -1))
    return attn.o_proj(mx.concatenate(outs, axis=0)[None])  # runs in order = packed order


def ragged_hidden(model: nn.Module, rows: list[list[int]], cache: RowKVCache) -> mx.array:
    """Final hidden states [T, D] of every real token of `rows`, written at each row's
    cache end (the caller advances the ends by what it keeps; nothing is written past
    a row's real tokens)."""
    layout = RaggedLayout([len(r) for r in rows])
    layout.plan(cache.begin(layout.W, explicit=True))
    ids = mx.array([t for r in rows for t in r], dtype=mx.int32)[None]
    trunk = model.model
    h = trunk.embed_tokens(ids)
    for layer, lc in zip(trunk.layers, cache.layers):
        h = h + _attention(layer.self_attn, layer.input_layernorm(h), layout, lc)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return trunk.norm(h)[0]
