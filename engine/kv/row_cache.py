"""A batched cache whose rows have independent ends, for every layer kind mlx-lm uses.

Each row b owns batch index b of every layer's buffers and writes its new tokens at
its own end `ends[b]`. The group holds one layer object per entry of the model's
cache list (engine/kv/cache_layout.py derives the kinds from mlx-lm's `make_cache()`):

- full attention (`LayerCache`; MLA latents too: keys and values may differ in width):
  rolling row b back by r tokens is `ends[b] -= r`; no data moves. Queries see
  explicit per-row masks and per-row RoPE offsets.
- sliding window (`SlidingLayerCache`): a ring per row of window + the widest forward
  (position x at slot x % K), so memory does not grow with the context, and a
  rollback still never needs an evicted key (`ForwardPlan.ring_mask`); while no row
  passes K, slots are positions and each forward's attention reads only the columns
  some row's window reaches (`ForwardPlan.window`). The prefix cache keeps a sliding
  layer's last window as an exact snapshot (`row_states`).
- chunked attention (`ChunkedLayerCache`, Llama 4): keys kept like a full layer's; the
  model masks by chunk itself from one offset, so such a model runs one row per forward.
- recurrent state (`RecurrentLayerCache`: conv and Gated DeltaNet / SSM state, what
  mlx-lm's ArraysCache holds): one state per row, no positions. Rows of different
  widths share a padded forward through mlx-lm's own batching convention
  (`cache.lengths`: the state stops after each row's real tokens). It cannot roll
  back by moving a pointer: the scheduler keeps the state from before a verifying
  round and replays the accepted prefix (ModelRunner.replay).
- several per layer (`ListLayerCache`, mlx-lm's CacheList).

We write our own instead of mlx-lm's BatchKVCache because that one left-pads rows to
share a single write pointer, which cannot roll back one row without touching others.
The layer objects implement the interface mlx-lm's layers call (`offset`,
`update_and_fetch`, `make_mask`, `cache[i]`, `lengths`, `advance`), so mlx-lm's
model classes run unchanged. The buffers grow in steps along the sequence axis like
mlx-lm's KVCache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache

from . import fast_ops
from .cache_layout import CHUNKED, FULL, LIST, RECURRENT, SLIDING, LayerKind
from .kv_format import KVFormat

STEP = 256  # sequence-axis growth quantum, as in mlx-lm


@dataclass
class ForwardPlan:
    """What one forward over the batch writes: per-row start positions and width."""

    starts: list[int]
    width: int
    offset: mx.array  # [B] int32, RoPE offsets (= starts)
    mask: mx.array | str | None  # [B,1,W,S] bool, "causal", or None
    uniform: bool  # all starts equal: a single slice write serves every row
    span: int  # S: columns the queries can see (max(starts) + width)
    index: mx.array | None  # [B,1,W,1] write positions when not uniform
    # Real tokens per row when rows of different widths are padded to `width`
    # (recurrent layers stop their state there); None when every row is `width` wide.
    lengths: list[int] | None = None
    # A packed (ragged) forward writes only its real tokens: token t belongs to row
    # token_rows[t] at position token_pos[t] (engine/kv/ragged.py); set by its layout.
    token_rows: list[int] | None = None
    token_pos: list[int] | None = None
    # Sliding layers' ring sizes for this forward, by window (RowKVCache.begin)
    rings: dict[int, int] = field(default_factory=dict)
    _flat: dict[tuple[int, int], mx.array] = field(default_factory=dict)
    _windows: dict[tuple[int, bool | str], tuple[int, mx.array | None]] = field(default_factory=dict)
    _lengths: mx.array | None = None
    _causal: mx.array | None = None

    def flat_index(self, heads: int, capacity: int) -> mx.array:
        """[T*heads] indices of the packed tokens' slots in a [B*heads*capacity, D]
        view of a layer's buffer (shared by every layer of the forward)."""
        key = (heads, capacity)
        if key not in self._flat:
            self._flat[key] = mx.array(
                [(b * heads + h) * capacity + p for b, p in zip(self.token_rows, self.token_pos) for h in range(heads)],
                dtype=mx.int32,
            )
        return self._flat[key]

    def window(self, size: int, sliced: bool = True) -> tuple[int, mx.array | None]:
        """(first column, mask) for layers whose queries see the last `size` keys.

        A query at position p sees keys j with p - size < j <= p (mlx-lm's
        RotatingKVCache and create_causal_mask). `sliced`: the layer's attention reads
        only columns [lo, span), lo being the first any row's window reaches; the mask
        covers those columns. Shared by every layer of the forward with that window.
        """
        key = (size, sliced)
        found = self._windows.get(key)
        if found is None:
            lo = max(0, min(self.starts) - size + 1) if sliced else 0
            if self.uniform and self.width == 1 and self.starts[0] - lo < size:
                mask = None  # the single query sees every column it is given
            else:
                starts = self.starts[:1] if self.uniform else self.starts
                pos = mx.array(starts, dtype=mx.int32)[:, None] + mx.arange(self.width, dtype=mx.int32)[None, :]
                cols = mx.arange(lo, self.span, dtype=mx.int32)[None, None, :]
                p = pos[:, :, None]
                mask = ((cols <= p) & (cols > p - size))[:, None, :, :]  # [B or 1, 1, W, S - lo]
            found = self._windows[key] = (lo, mask)
        return found

    def wraps(self, size: int) -> bool:
        """Whether sliding layers of window `size` hold positions modulo their ring in
        this forward (some row reaches past the ring's length)."""
        ring = self.rings.get(size)
        return ring is not None and self.span > ring

    def ring_mask(self, size: int) -> mx.array:
        """[B,1,W,K] mask over a ring of K slots where position x lives at slot x % K.

        Slot s holds, for row b, the latest position x <= last_b (the row's last
        position in this forward) with x = s (mod K); a query at p sees it when
        p - size < x <= p. The ring is at least `size + width - 1` long, so a slot
        overwritten by padding or by a proposal rolled back later only ever held a
        position no query of the row can see again (RowKVCache.begin)."""
        key = (size, "ring")
        found = self._windows.get(key)
        if found is None:
            K = self.rings[size]
            starts = mx.array(self.starts, dtype=mx.int32)[:, None, None]  # [B,1,1]
            p = starts + mx.arange(self.width, dtype=mx.int32)[None, :, None]  # [B,W,1]
            last = starts + (self.width - 1)
            s = mx.arange(K, dtype=mx.int32)[None, None, :]
            x = last - ((last - s) % K)  # [B,1,K]
            mask = ((x >= 0) & (x <= p) & (x > p - size))[:, None, :, :]
            found = self._windows[key] = (0, mask)
        return found[1]

    def causal_array(self) -> mx.array | str | None:
        """The plan's mask as an array (models that combine it with scores of their own)."""
        if not isinstance(self.mask, str):
            return self.mask
        if self._causal is None:
            rows = mx.arange(self.width, dtype=mx.int32)[:, None] + (self.span - self.width)
            self._causal = (mx.arange(self.span, dtype=mx.int32)[None, :] <= rows)[None, None]
        return self._causal

    def lengths_array(self) -> mx.array | None:
        if self.lengths is None:
            return None
        if self._lengths is None:
            self._lengths = mx.array(self.lengths, dtype=mx.int32)
        return self._lengths


def plan_forward(
    starts: list[int], width: int, explicit: bool = False, lengths: list[int] | None = None
) -> ForwardPlan:
    """Precompute the mask/offset shared by every layer of one forward. `explicit`
    asks for the per-row mask array even when all starts are equal (a ragged
    forward slices it per run of rows; engine/kv/ragged.py). `lengths`: each row's real
    tokens when the rows are padded to `width`."""
    uniform = not explicit and all(s == starts[0] for s in starts)
    span = max(starts) + width
    offset = fast_ops.mark(mx.array(starts, dtype=mx.int32), span)  # RoPE reads it (engine/kv/fast_ops.py)
    index = None
    if uniform:
        # Keys are exactly [0, start+width): "causal" (bottom-right aligned) is exact.
        mask: mx.array | str | None = None if width == 1 else "causal"
    else:
        pos = offset[:, None] + mx.arange(width, dtype=mx.int32)[None, :]  # [B,W]
        cols = mx.arange(span, dtype=mx.int32)
        mask = (cols[None, None, :] <= pos[:, :, None])[:, None, :, :]  # [B,1,W,S]
        index = pos[:, None, :, None]
    if lengths is not None and all(n == width for n in lengths):
        lengths = None
    return ForwardPlan(list(starts), width, offset, mask, uniform, span, index, list(lengths) if lengths else None)


# A layer's keys (or values): one array [B, H, capacity, D], or, quantized
# (engine/kv/kv_format.py), the triple (words [B, H, capacity, D*bits/32], scales and
# biases [B, H, capacity, D/group]). Every group operation acts on each array alike.
Buffer = mx.array | tuple[mx.array, mx.array, mx.array] | None


def _parts(x: Buffer) -> tuple[mx.array, ...]:
    return x if isinstance(x, tuple) else (x,)


def map_buffer(x: Buffer, fn) -> Buffer:
    """fn applied to a buffer's arrays (one, or a quantized triple)."""
    if x is None:
        return None
    return tuple(fn(a) for a in x) if isinstance(x, tuple) else fn(x)


def _each2(x: Buffer, y: Buffer, fn) -> Buffer:
    return tuple(fn(a, b) for a, b in zip(x, y)) if isinstance(x, tuple) else fn(x, y)


class LayerCache:
    """One attention layer's keys and values for every row of a group; `fmt` (a
    KVFormat) stores them quantized."""

    def __init__(self, fmt: KVFormat | None = None) -> None:
        self.fmt = fmt
        self.keys = None  # [B, H, capacity, D], or its quantized triple
        self.values = None  # [B, H, capacity, Dv] (MLA: Dv != D), or its quantized triple
        self._plan: ForwardPlan | None = None
        # quantized: (dequantized keys, values, their packed triples) of this forward's fetch
        self._fetched: tuple | None = None
        self._last: tuple | None = None  # what the last update_and_fetch returned (keys_and_values)

    @property
    def plan(self) -> ForwardPlan | None:
        return self._plan

    @plan.setter
    def plan(self, plan: ForwardPlan | None) -> None:
        self._plan = plan
        self._fetched = None  # a new forward: the last one's views are not kept alive
        self._last = None

    # --- the interface mlx-lm attention layers call -------------------------------
    @property
    def offset(self) -> mx.array | int:
        plan = self.plan
        return fast_ops.RowStart(plan.starts[0]) if plan.uniform else plan.offset

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None):
        plan = self.plan
        if window_size is not None:
            # The model builds one windowed mask (from a sliding layer's cache) for all
            # its layers with that window: it covers the columns those layers return.
            if plan.wraps(window_size):
                return plan.ring_mask(window_size)
            return plan.window(window_size, sliced=self._slices(window_size) or window_size in plan.rings)[1]
        return plan.causal_array() if return_array else plan.mask

    def _slices(self, window: int) -> bool:
        return False

    def _visible(self) -> int:
        """First cache column this layer's queries read in the current forward."""
        return 0

    def _encode(self, keys: mx.array, values: mx.array):
        if self.fmt is None:
            return keys, values
        return self.fmt.quantize(keys, self.fmt.key_bits), self.fmt.quantize(values, self.fmt.value_bits)

    def _fetch(self, keys, values):
        """What update_and_fetch hands the model. Quantized: the visible columns
        dequantized (lazy), so model code that does its own math on the cached keys
        and values (MLA's latents and rope keys, gemma4's KV-shared layers, any
        attention not through mlx-lm's function) reads the same once-quantized
        tensors as ours; engine/kv/attention.py maps views that reach it unchanged back
        to the packed triples (`quantized_for`), and MLX never computes the unused
        dequantization."""
        fmt = self.fmt
        if fmt is None:
            self._last = (keys, values)
            return keys, values
        kd = mx.dequantize(*keys, group_size=fmt.group_size, bits=fmt.key_bits)
        vd = mx.dequantize(*values, group_size=fmt.group_size, bits=fmt.value_bits)
        self._fetched = (kd, vd, keys, values)
        self._last = (kd, vd)
        return kd, vd

    def keys_and_values(self):
        """What this forward's update_and_fetch returned (mlx-lm's KVCache interface:
        KV-sharing layers read an earlier layer's keys and values through it: afm7,
        gemma3n)."""
        if self._last is None:
            raise RuntimeError("keys_and_values before this forward wrote the layer")
        return self._last

    def quantized_for(self, keys, values):
        """The packed triples behind `keys` and `values` when they are this forward's
        dequantized views, as fetched; (None, None) otherwise (the caller attends
        over the float arrays it was given)."""
        fetched, self._fetched = self._fetched, None
        if fetched is not None and keys is fetched[0] and values is fetched[1]:
            return fetched[2], fetched[3]
        return None, None

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        plan = self.plan
        B, H, W, _ = keys.shape
        keys, values = self._encode(keys, values)
        self._reserve(B, H, plan.span, keys, values)
        if plan.uniform:
            s = plan.starts[0]
            for buf, new in ((self.keys, keys), (self.values, values)):
                for a, n in zip(_parts(buf), _parts(new)):
                    a[..., s : s + W, :] = n
        else:
            idx = plan.index
            put = lambda a, n: mx.put_along_axis(a, mx.broadcast_to(idx, n.shape), n, axis=2)  # noqa: E731
            self.keys = _each2(self.keys, keys, put)
            self.values = _each2(self.values, values, put)
        lo, hi = self._visible(), plan.span
        cut = lambda a: a[..., lo:hi, :]  # noqa: E731
        return self._fetch(map_buffer(self.keys, cut), map_buffer(self.values, cut))

    def update_tokens(self, keys: mx.array, values: mx.array):
        """Write packed tokens' keys/values [T, H, D] at their rows' positions (the
        plan's token_rows/token_pos) with one scatter each, no padded grid; return
        the keys/values the forward's queries see, as update_and_fetch does."""
        plan = self.plan
        T, H, _ = keys.shape
        B = len(plan.starts)
        keys, values = self._encode(keys, values)
        self._reserve(B, H, plan.span, map_buffer(keys, lambda a: a[None]), map_buffer(values, lambda a: a[None]))
        cap = self.capacity
        idx = plan.flat_index(H, cap)

        def scatter(a: mx.array, n: mx.array) -> mx.array:
            flat = a.reshape(B * H * cap, a.shape[-1])
            flat[idx] = n.reshape(T * H, a.shape[-1])
            return flat.reshape(B, H, cap, a.shape[-1])

        self.keys = _each2(self.keys, keys, scatter)
        self.values = _each2(self.values, values, scatter)
        cut = lambda a: a[..., : plan.span, :]  # noqa: E731
        self._last = (map_buffer(self.keys, cut), map_buffer(self.values, cut))
        return self._last

    @property
    def state(self):  # mlx-lm utilities look for this; we expose the raw buffers
        return self.keys, self.values

    # --- group management ----------------------------------------------------------
    @property
    def capacity(self) -> int:
        return 0 if self.keys is None else _parts(self.keys)[0].shape[2]

    def _reserve(self, B, H, span, keys, values) -> None:
        """Room for `span` columns; `keys`/`values` (new ones, [*, H, n, *]) give the
        trailing widths and dtypes of the buffers to make."""
        if self.keys is not None and self.capacity >= span:
            return
        new_cap = ((span + STEP - 1) // STEP) * STEP
        if self.keys is None:
            zeros = lambda n: mx.zeros((B, H, new_cap, n.shape[-1]), n.dtype)  # noqa: E731
            self.keys, self.values = map_buffer(keys, zeros), map_buffer(values, zeros)
            return
        self.fit(new_cap)

    def fit(self, capacity: int) -> None:
        """Pad the sequence axis to `capacity` (so two caches can be joined)."""
        if self.keys is None or self.capacity >= capacity:
            return
        grow = capacity - self.capacity
        pad = lambda a: mx.concatenate([a, mx.zeros((*a.shape[:2], grow, a.shape[3]), a.dtype)], 2)  # noqa: E731
        self.keys = map_buffer(self.keys, pad)
        self.values = map_buffer(self.values, pad)

    def buffers(self) -> list[mx.array]:
        return [a for b in (self.keys, self.values) if b is not None for a in _parts(b)]


class SlidingLayerCache(LayerCache):
    """A sliding-window attention layer kept as a ring: position x of a row lives at slot
    x % K, K = the buffers' length, at least window + the widest forward - 1 (grown,
    re-rolled, when a wider forward comes). So its memory is bounded by the window, not
    the context, and a rollback after a rejected proposal still never needs an evicted
    key (see ForwardPlan.ring_mask). While no row reaches past K, slots are positions
    and the forward reads only the columns some row's window reaches, as a full layer's."""

    def __init__(self, window: int, fmt: KVFormat | None = None) -> None:
        super().__init__(fmt)
        self.window = window

    def ring_size(self, span: int, width: int) -> int:
        """K for a forward of `width` tokens reaching `span`: never shrinks; grows in
        steps of min(STEP, window), so a short window's ring stays short."""
        return max(self.capacity, self.rounded(min(span, self.window + width - 1)))

    def rounded(self, n: int) -> int:
        step = min(STEP, self.window)
        return ((n + step - 1) // step) * step

    def _slices(self, window: int) -> bool:
        return window == self.window

    def _visible(self) -> int:
        return self.plan.window(self.window)[0]

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None):
        # A model asking a sliding layer's cache for its mask without naming the window
        # gets the layer's own window (mlx-lm's RotatingKVCache does the same).
        return super().make_mask(n, return_array, window_size or self.window)

    def _reserve(self, B, H, span, keys, values) -> None:
        K = self.plan.rings[self.window]
        if self.keys is None:
            zeros = lambda n: mx.zeros((B, H, K, n.shape[-1]), n.dtype)  # noqa: E731
            self.keys, self.values = map_buffer(keys, zeros), map_buffer(values, zeros)
            return
        self.resize(K, self.plan.starts)

    def resize(self, size: int, ends: list[int]) -> None:
        """Grow the ring to `size` slots, each row's positions [end - old K, end)
        moved to their new slots (positions at or past a row's end are not kept)."""
        K = self.capacity
        if self.keys is None or K >= size:
            return
        if max(ends) <= K:  # nothing wrapped: slots are positions
            self.fit(size)
            return
        e = mx.array(ends, dtype=mx.int32)[:, None] - 1  # [B,1]: each row's last position
        s = mx.arange(size, dtype=mx.int32)[None, :]
        x = e - ((e - s) % size)  # the position new slot s holds
        held = (x >= 0) & (x > e - K)
        src = mx.where(held, x % K, 0)[:, None, :, None]  # [B,1,size,1]
        keep = held[:, None, :, None]

        def roll(a: mx.array) -> mx.array:
            idx = mx.broadcast_to(src, (a.shape[0], a.shape[1], size, 1))
            return mx.where(keep, mx.take_along_axis(a, idx, axis=2), mx.zeros((), a.dtype))

        self.keys, self.values = map_buffer(self.keys, roll), map_buffer(self.values, roll)

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        plan = self.plan
        if not plan.wraps(self.window):
            return super().update_and_fetch(keys, values)
        B, H, W, _ = keys.shape
        keys, values = self._encode(keys, values)
        self._reserve(B, H, plan.span, keys, values)
        K = self.capacity
        pos = mx.array(plan.starts, dtype=mx.int32)[:, None] + mx.arange(W, dtype=mx.int32)[None, :]
        idx = (pos % K)[:, None, :, None]  # [B,1,W,1]
        put = lambda a, n: mx.put_along_axis(a, mx.broadcast_to(idx, n.shape), n, axis=2)  # noqa: E731
        self.keys = _each2(self.keys, keys, put)
        self.values = _each2(self.values, values, put)
        return self._fetch(self.keys, self.values)

    def slots(self, lo: int, end: int) -> mx.array:
        """The slots of positions [lo, end) of a row, in position order."""
        return mx.arange(lo, end, dtype=mx.int32) % max(self.capacity, 1)

    def update_tokens(self, keys, values):  # the ragged path serves only full layers
        raise NotImplementedError("sliding-window layers take the padded forward")


class ChunkedLayerCache(LayerCache):
    """A chunked-attention layer (mlx-lm's ChunkedKVCache, Llama 4): every key kept, as
    a full layer's (so rollback and the prefix cache work as there); a query sees the
    keys of its own chunk. The model computes that mask itself from `start_position`
    (0 here: keys are never trimmed) and `offset`, one for the batch: such a model is
    served one row at a time (cache_layout.single_row)."""

    def __init__(self, chunk: int, fmt: KVFormat | None = None) -> None:
        super().__init__(fmt)
        self.chunk_size = chunk
        self.start_position = 0

    def maybe_trim_front(self) -> None:  # mlx-lm's ChunkedKVCache drops old chunks; we keep them
        return None

    @property
    def offset(self) -> int:
        plan = self.plan
        if not plan.uniform:
            raise RuntimeError("chunked-attention layers serve one row at a time")
        return plan.starts[0]

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None):
        plan = self.plan
        pos = mx.array(plan.starts, dtype=mx.int32)[:, None, None] + mx.arange(plan.width, dtype=mx.int32)[None, :, None]
        cols = mx.arange(plan.span, dtype=mx.int32)[None, None, :]
        return ((cols <= pos) & (cols // self.chunk_size == pos // self.chunk_size))[:, None]


class RecurrentLayerCache(ArraysCache):
    """A recurrent layer's state arrays, one batch row per group row (mlx-lm's
    ArraysCache interface: `cache[i]`, `lengths`, `advance`, `make_mask`). A subclass
    of it because some model classes store their state only into an ArraysCache
    (mamba: `if isinstance(cache, ArraysCache): cache[0] = ...`); its own __init__
    and batching methods are not used."""

    def __init__(self, size: int) -> None:
        self.cache: list[mx.array | None] = [None] * size
        self.plan: ForwardPlan | None = None
        self.left_padding = None  # mlx-lm's left-padded batching; our rows are right-padded

    def __getitem__(self, i: int) -> mx.array | None:
        return self.cache[i]

    def __setitem__(self, i: int, value: mx.array) -> None:
        self.cache[i] = value

    @property
    def lengths(self) -> mx.array | None:
        return None if self.plan is None else self.plan.lengths_array()

    def advance(self, n: int) -> None:
        """mlx-lm counts lengths down after each forward; ours are set per forward."""

    def make_mask(self, n: int, **_: object) -> mx.array | None:
        lengths = self.lengths
        if lengths is None:
            return None
        return mx.arange(n, dtype=mx.int32)[None, :] < lengths[:, None]

    @property
    def state(self):
        return self.cache

    def empty(self) -> bool:
        return self.cache[0] is None


class ListLayerCache:
    """Several caches for one layer (mlx-lm's CacheList): the layer indexes them."""

    def __init__(self, caches: list) -> None:
        self.caches = caches

    def __getitem__(self, i: int):
        return self.caches[i]


def _build(kind: LayerKind, fmt: KVFormat | None = None):
    if kind.kind == FULL:
        return LayerCache(fmt)
    if kind.kind == SLIDING:
        return SlidingLayerCache(int(kind.window), fmt)
    if kind.kind == CHUNKED:
        return ChunkedLayerCache(int(kind.window), fmt)
    if kind.kind == RECURRENT:
        return RecurrentLayerCache(kind.size)
    if kind.kind == LIST:
        return ListLayerCache([_build(k, fmt) for k in kind.children])
    raise ValueError(f"unknown layer kind {kind.kind!r}")


def _leaves(layers: list) -> list:
    out = []
    for layer in layers:
        out.extend(_leaves(layer.caches) if isinstance(layer, ListLayerCache) else [layer])
    return out


def _joined(parts: list[mx.array], pad: int) -> mx.array:
    """[1, H, sum(n) + pad, D] from parts [H, n, D], in one new buffer (mx.pad of a
    single part measured 2x faster than concatenating it with zeros)."""
    if len(parts) == 1:
        return mx.pad(parts[0][None], [(0, 0), (0, 0), (0, pad), (0, 0)])
    H, _, D = parts[0].shape
    return mx.concatenate(parts + [mx.zeros((H, pad, D), parts[0].dtype)], axis=1)[None]


@dataclass(frozen=True)
class DiskPiece:
    """A segment of a prefix-cache hit still in its file: `read(dest)` fills
    `dest(l, j)` ([H, length, D] views of the row's new buffers) from the file
    (engine/prefix/ssd_cache.py `read_kv_into`), so a restart's hit costs about the read."""

    layers: int
    length: int
    heads: int
    width: int
    dtype: mx.Dtype
    read: Callable[[Callable[[int, int], np.ndarray]], None]

    def load(self) -> mx.array:
        """The segment as one [L,2,H,n,D] array (for a reader that is not a row)."""
        out = mx.zeros((self.layers, 2, self.heads, self.length, self.width), self.dtype)
        mx.eval(out)
        host = np.asarray(out)
        self.read(lambda l, j: host[l, j])
        return out


def _starts(pieces: list) -> list[tuple[int, object]]:
    out, at = [], 0
    for p in pieces:
        out.append((at, p))
        at += p.length if isinstance(p, DiskPiece) else p.shape[3]
    return out


def _take(a: mx.array | None, idx: mx.array) -> mx.array | None:
    return None if a is None else a[idx]


class RowKVCache:
    """All layers' caches for one group of rows, plus each row's end pointer.

    `layout`: the model's LayerKinds (engine/kv/cache_layout.py), or a layer count for a
    model of full-attention layers only."""

    def __init__(self, layout: list[LayerKind] | int, fmt: KVFormat | None = None) -> None:
        if isinstance(layout, int):
            layout = [LayerKind(FULL)] * layout
        self.layout = list(layout)
        self.fmt = fmt
        self.layers = [_build(k, fmt) for k in self.layout]
        self.leaves = _leaves(self.layers)
        self.attention: list[LayerCache] = [l for l in self.leaves if isinstance(l, LayerCache)]
        self.recurrent: list[RecurrentLayerCache] = [l for l in self.leaves if isinstance(l, RecurrentLayerCache)]
        self.ends: list[int] = []

    # A prefix segment holds the full-attention layers by token; a sliding layer's part
    # of a prefix is only its last window, kept as an exact snapshot beside the
    # recurrent state (row_states), so stored prefixes do not grow with it.
    @property
    def windowed(self) -> list["SlidingLayerCache"]:
        return [l for l in self.attention if isinstance(l, SlidingLayerCache)]

    @property
    def stored(self) -> list[LayerCache]:
        return [l for l in self.attention if not isinstance(l, SlidingLayerCache)]

    @property
    def size(self) -> int:
        return len(self.ends)

    def begin(
        self, width: int, starts: list[int] | None = None, explicit: bool = False, lengths: list[int] | None = None
    ) -> ForwardPlan:
        """Prepare a forward of `width` tokens per row, written at each row's end
        (`lengths`: real tokens per row when rows are padded to `width`)."""
        plan = plan_forward(self.ends if starts is None else starts, width, explicit, lengths)
        for layer in self.windowed:  # layers of one window grow together: one size each
            plan.rings.setdefault(layer.window, layer.ring_size(plan.span, width))
        for layer in self.leaves:
            layer.plan = plan
        return plan

    def advance(self, counts: list[int]) -> None:
        """Commit `counts[b]` tokens of the last forward for row b (the rest roll back;
        recurrent state must already be at those counts: ModelRunner.replay)."""
        self.ends = [e + c for e, c in zip(self.ends, counts)]

    def rollback(self, row: int, n: int) -> None:
        """O(1): move row's end pointer back; the stale columns are masked and overwritten."""
        if self.recurrent:
            raise RuntimeError("recurrent state cannot be rolled back by a pointer (ModelRunner.replay)")
        self.ends[row] = max(0, self.ends[row] - n)

    def append_rows(self, other: "RowKVCache") -> None:
        """Join the rows of `other` (e.g. freshly prefilled) after this group's rows."""
        if other.size == 0:
            return
        if self.size == 0:
            self.layers, self.leaves, self.ends = other.layers, other.leaves, list(other.ends)
            self.attention, self.recurrent = other.attention, other.recurrent
            return
        for mine, theirs in zip(self.attention, other.attention):
            if theirs.keys is None:
                continue
            if mine.keys is None:  # never written: this group's rows had no tokens here
                theirs.fit(1)
                zeros = lambda a: mx.zeros((self.size, *a.shape[1:]), a.dtype)  # noqa: E731
                mine.keys, mine.values = map_buffer(theirs.keys, zeros), map_buffer(theirs.values, zeros)
            cap = max(mine.capacity, theirs.capacity)
            if isinstance(mine, SlidingLayerCache):  # rings: each row's positions re-rolled
                mine.resize(cap, self.ends)
                theirs.resize(cap, other.ends)
            mine.fit(cap)
            theirs.fit(cap)
            join = lambda a, b: mx.concatenate([a, b], axis=0)  # noqa: E731
            mine.keys = _each2(mine.keys, theirs.keys, join)
            mine.values = _each2(mine.values, theirs.values, join)
        for mine, theirs in zip(self.recurrent, other.recurrent):
            for i, (a, b) in enumerate(zip(mine.cache, theirs.cache)):
                if a is None and b is None:
                    continue
                if a is None:
                    a = mx.zeros((self.size, *b.shape[1:]), b.dtype)
                if b is None:
                    b = mx.zeros((other.size, *a.shape[1:]), a.dtype)
                mine.cache[i] = mx.concatenate([a, b], axis=0)
        self.ends += other.ends

    def remove_rows(self, rows: list[int]) -> None:
        """Retire rows; the remaining rows keep their order."""
        drop = set(rows)
        keep = [i for i in range(self.size) if i not in drop]
        self.ends = [self.ends[i] for i in keep]
        if not keep:
            for layer in self.attention:
                layer.keys = layer.values = None
            for layer in self.recurrent:
                layer.cache = [None] * len(layer.cache)
            return
        idx = mx.array(keep, dtype=mx.int32)
        for layer in self.attention:
            layer.keys = map_buffer(layer.keys, lambda a: a[idx])
            layer.values = map_buffer(layer.values, lambda a: a[idx])
        for layer in self.recurrent:
            layer.cache = [_take(a, idx) for a in layer.cache]
        mx.eval(self.arrays())

    def arrays(self) -> list[mx.array]:
        out = [a for l in self.attention for a in l.buffers()]
        return out + [a for l in self.recurrent for a in l.cache if a is not None]

    # --- recurrent state: checkpoints around a verifying round ---------------------------
    def states(self) -> list[list[mx.array | None]]:
        """The recurrent layers' state arrays as they are now (arrays never change in
        place, so this is a checkpoint that costs nothing)."""
        return [list(l.cache) for l in self.recurrent]

    def set_states(self, states: list[list[mx.array | None]]) -> None:
        for layer, s in zip(self.recurrent, states):
            layer.cache = list(s)

    def choose_states(self, rows: list[bool], chosen: list[list], other: list[list]) -> None:
        """Per row: `chosen` states where rows[b], `other` states elsewhere."""
        sel = mx.array(rows)
        for layer, a_list, b_list in zip(self.recurrent, chosen, other):
            out = []
            for a, b in zip(a_list, b_list):
                if a is None or b is None:
                    out.append(a if b is None else b)
                    continue
                out.append(mx.where(sel.reshape((-1,) + (1,) * (a.ndim - 1)), a, b))
            layer.cache = out

    # --- the prefix cache's view: segments of one row -----------------------------------
    @property
    def snapshots(self) -> bool:
        """Whether a stored prefix needs an exact snapshot (row_states) beside its
        segments: recurrent state, or sliding layers' windows."""
        return bool(self.recurrent or self.windowed)

    def segment_packing(self) -> str | None:
        """How one row's full-attention KV packs into one array: "pair" ([L, 2, H, n, D]),
        "concat" (keys and values of different widths, MLA: [L, 1, H, n, Dk + Dv]),
        "bytes" (quantized layers, engine/kv/kv_format.py: [L, 1, H, n, bytes] of raw
        words, scales and biases), "none" (no full-attention layers), or None when the layers' shapes differ (no
        single array holds them; the prefix cache is off for such models). Sliding
        layers are not in segments (see `windowed`)."""
        if not self.stored:
            return "none"
        if self.fmt is not None:
            return self._byte_packing()
        shapes = {(l.keys.shape[1], l.keys.shape[3], l.values.shape[3], l.keys.dtype)
                  for l in self.stored if l.keys is not None}
        if len(shapes) != 1 or any(l.keys is None for l in self.stored):
            return None
        _, dk, dv, _ = shapes.pop()
        return "pair" if dk == dv else "concat"

    def segment(self, index: int, start: int, end: int) -> mx.array:
        """Row `index`'s full-attention KV at positions [start, end) as one fresh array."""
        packing = self.segment_packing()
        if packing == "none":
            return mx.zeros((0, 1, 1, end - start, 1), mx.float32)
        if packing == "bytes":
            kv = mx.stack([self._layer_bytes(l, index, start, end) for l in self.stored])[:, None]
        elif packing == "pair":
            kv = mx.stack([mx.stack([l.keys[index, :, start:end, :], l.values[index, :, start:end, :]])
                           for l in self.stored])
        elif packing == "concat":
            kv = mx.stack([mx.concatenate([l.keys[index, :, start:end, :], l.values[index, :, start:end, :]],
                                          axis=-1)[None] for l in self.stored])
        else:
            raise ValueError("attention layers of different shapes cannot be packed into one segment")
        mx.eval(kv)
        return kv

    # Quantized layers pack into one uint8 array: each row's words, scales and biases
    # (keys, then values) side by side as raw bytes, [L, 1, H, n, bytes per head].
    def _byte_packing(self) -> str | None:
        if any(l.keys is None for l in self.stored):
            return None
        widths = {(_parts(l.keys)[0].shape[1], self._row_bytes(l)) for l in self.stored}
        return "bytes" if len(widths) == 1 else None

    @staticmethod
    def _row_bytes(layer: LayerCache) -> int:
        return sum(a.shape[-1] * a.dtype.size for a in layer.buffers())

    @staticmethod
    def _layer_bytes(layer: LayerCache, index: int, start: int, end: int) -> mx.array:
        return mx.concatenate([mx.view(mx.contiguous(a[index, :, start:end, :]), mx.uint8)
                               for a in layer.buffers()], axis=-1)

    def _from_bytes(self, layer: int, parts: list[mx.array]) -> tuple[tuple, tuple]:
        """Keys and values (quantized triples) of stored layer `layer` from its byte
        segments [1, H, n, bytes]; `part_specs` (ModelRunner's probe) gives each
        array's width and dtype."""
        raw = mx.concatenate([p[0] for p in parts], axis=1) if len(parts) > 1 else parts[0][0]
        arrays, at = [], 0
        for width, dtype in self.part_specs[layer]:
            n = width * dtype.size
            arrays.append(mx.view(mx.contiguous(raw[..., at : at + n]), dtype))
            at += n
        half = len(arrays) // 2
        return tuple(arrays[:half]), tuple(arrays[half:])

    def install_segments(self, pieces: list, length: int, capacity: int) -> None:
        """Fill this single-row cache with `pieces` (segments covering [0, length): mlx
        arrays [L,2|1,H,n,D'], or DiskPieces read from their file into the new buffers
        once those exist) as new buffers of `capacity` columns."""
        pad = max(capacity - length, 1)
        stored = [i for i, layer in enumerate(self.attention) if not isinstance(layer, SlidingLayerCache)]
        disk = [(at, p) for at, p in _starts(pieces) if isinstance(p, DiskPiece)]
        if disk and (self.fmt is not None or any(not isinstance(p, DiskPiece) and p.shape[1] != 2 for p in pieces)):
            raise ValueError("disk pieces need keys and values stored apart, unquantized")
        for l, a in enumerate(stored):
            layer = self.attention[a]
            if self.fmt is not None:  # "bytes" packing
                keys, values = self._from_bytes(l, [p[l] for p in pieces])
                grow = lambda x: mx.pad(x[None], [(0, 0), (0, 0), (0, pad), (0, 0)])  # noqa: E731
                layer.keys, layer.values = map_buffer(keys, grow), map_buffer(values, grow)
                continue
            if disk:  # one fresh buffer each: pieces in RAM written into it, files read into it
                d = disk[0][1]
                shape = (1, d.heads, length + pad, d.width)
                bufs = []
                for j in range(2):
                    buf = mx.zeros(shape, d.dtype)
                    for at, piece in _starts(pieces):
                        if not isinstance(piece, DiskPiece):
                            buf[:, :, at : at + piece.shape[3], :] = piece[l, j][None]
                    bufs.append(buf)
                layer.keys, layer.values = bufs
                continue
            if pieces[0][l].shape[0] == 2:
                keys = [p[l, 0] for p in pieces]
                values = [p[l, 1] for p in pieces]
            else:
                dk = self._key_width(a)
                keys = [p[l, 0, :, :, :dk] for p in pieces]
                values = [p[l, 0, :, :, dk:] for p in pieces]
            layer.keys = _joined(keys, pad)
            layer.values = _joined(values, pad)
        self.ends = [length]
        if disk:
            mx.eval(self.arrays())  # the buffers exist; the files' bytes go straight into them
            bufs = [(self.attention[a].keys, self.attention[a].values) for a in stored]
            for at, p in disk:
                views = [(np.asarray(k)[0], np.asarray(v)[0]) for k, v in bufs]
                p.read(lambda l, j: views[l][j][:, at : at + p.length, :])

    def _key_width(self, layer: int) -> int:
        dk = getattr(self, "key_widths", None)
        if not dk:
            raise ValueError("a packed (concat) segment needs the layers' key widths")
        return dk[layer]

    def row_states(self, index: int) -> dict[str, mx.array]:
        """Row `index`'s exact snapshot as fresh copies: recurrent state arrays
        ({"layer.array": [1, ...]}) and each sliding layer's keys and values over the
        last `window` positions before the row's end ({"w<layer>.k"/".v": [1, H, n, D]}:
        all that any later query of this row reads there)."""
        out = {}
        for i, layer in enumerate(self.recurrent):
            for e, a in enumerate(layer.cache):
                if a is not None:
                    out[f"{i}.{e}"] = mx.contiguous(a[index : index + 1])
        end = self.ends[index] if self.windowed else 0
        for i, layer in enumerate(self.windowed):
            if layer.keys is not None:
                lo = max(0, end - layer.window)
                for name, buf in (("k", layer.keys), ("v", layer.values)):
                    for c, a in enumerate(_parts(buf)):  # quantized: "w<i>.k0" .. "w<i>.k2"
                        key = f"w{i}.{name}{c}" if isinstance(buf, tuple) else f"w{i}.{name}"
                        out[key] = mx.contiguous(a[index : index + 1][:, :, layer.slots(lo, end), :])
        mx.eval(list(out.values()))
        return out

    def set_row_states(self, states: dict[str, mx.array], capacity: int | None = None) -> None:
        """Install one row's snapshot (this cache holds that row alone, its end already
        set by install_segments): recurrent states as they are; each sliding layer's
        window placed just before the end in new buffers of `capacity` columns. The
        columns before the window stay zero: no query of this row reads them (its
        windowed reads and masks start inside the window)."""
        for i, layer in enumerate(self.recurrent):
            layer.cache = [states.get(f"{i}.{e}") for e in range(len(layer.cache))]
        end = self.ends[0] if self.ends else 0
        for i, layer in enumerate(self.windowed):
            if layer.fmt is None:
                k, v = states.get(f"w{i}.k"), states.get(f"w{i}.v")
            else:
                k, v = (tuple(states.get(f"w{i}.{name}{c}") for c in range(3)) for name in "kv")
                if any(a is None for a in k + v):
                    k = v = None
            if k is None or v is None:
                raise ValueError(f"the snapshot has no window for sliding layer {i}")
            n = _parts(k)[0].shape[2]
            if n != min(end, layer.window):
                raise ValueError(f"sliding layer {i}: a window of {n} tokens for a prefix of {end}")
            # a ring (SlidingLayerCache) of room for the window and the next chunk
            cap = layer.rounded(min(max(capacity or 0, end + 1), layer.window + min(STEP, layer.window)))
            if end <= cap:  # slots are positions
                place = lambda a: mx.pad(a, [(0, 0), (0, 0), (end - n, cap - end), (0, 0)])  # noqa: E731
            else:
                idx = (mx.arange(end - n, end, dtype=mx.int32) % cap)[None, None, :, None]
                place = lambda a: mx.put_along_axis(  # noqa: E731
                    mx.zeros((*a.shape[:2], cap, a.shape[3]), a.dtype), mx.broadcast_to(idx, a.shape), a, axis=2)
            layer.keys, layer.values = map_buffer(k, place), map_buffer(v, place)
