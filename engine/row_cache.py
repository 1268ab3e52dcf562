"""A batched KV cache whose rows have independent ends.

Each row b owns batch index b of every layer's key/value buffers and writes its new
tokens at its own end `ends[b]`, so rolling row b back by r tokens is `ends[b] -= r`:
no data moves. Queries see explicit per-row masks and per-row RoPE offsets. The
buffers grow in steps along the sequence axis like mlx-lm's KVCache.

We write our own instead of mlx-lm's BatchKVCache because that one left-pads rows to
share a single write pointer, which cannot roll back one row without touching others.
The layer objects implement the interface mlx-lm's attention layers call
(`offset`, `update_and_fetch`, `make_mask`), so mlx-lm's model classes run unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx

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
    # A packed (ragged) forward writes only its real tokens: token t belongs to row
    # token_rows[t] at position token_pos[t] (engine/ragged.py); set by its layout.
    token_rows: list[int] | None = None
    token_pos: list[int] | None = None
    _flat: dict[tuple[int, int], mx.array] = field(default_factory=dict)

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


def plan_forward(starts: list[int], width: int, explicit: bool = False) -> ForwardPlan:
    """Precompute the mask/offset shared by every layer of one forward. `explicit`
    asks for the per-row mask array even when all starts are equal (a ragged
    forward slices it per run of rows; engine/ragged.py)."""
    uniform = not explicit and all(s == starts[0] for s in starts)
    span = max(starts) + width
    offset = mx.array(starts, dtype=mx.int32)
    index = None
    if uniform:
        # Keys are exactly [0, start+width): "causal" (bottom-right aligned) is exact.
        mask: mx.array | str | None = None if width == 1 else "causal"
    else:
        pos = offset[:, None] + mx.arange(width, dtype=mx.int32)[None, :]  # [B,W]
        cols = mx.arange(span, dtype=mx.int32)
        mask = (cols[None, None, :] <= pos[:, :, None])[:, None, :, :]  # [B,1,W,S]
        index = pos[:, None, :, None]
    return ForwardPlan(list(starts), width, offset, mask, uniform, span, index)


class LayerCache:
    """One attention layer's keys and values for every row of a group."""

    def __init__(self) -> None:
        self.keys: mx.array | None = None  # [B, H, capacity, D]
        self.values: mx.array | None = None
        self.plan: ForwardPlan | None = None

    # --- the interface mlx-lm attention layers call -------------------------------
    @property
    def offset(self) -> mx.array | int:
        plan = self.plan
        return plan.starts[0] if plan.uniform else plan.offset

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None):
        if window_size is not None:
            raise NotImplementedError("sliding-window layers are not supported by RowKVCache")
        mask = self.plan.mask
        if return_array and isinstance(mask, str):
            return plan_forward([0] * len(self.plan.starts), n).mask  # never hit by llama
        return mask

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        plan = self.plan
        B, H, W, D = keys.shape
        self._reserve(B, H, D, plan.span, keys.dtype, values.shape[-1], values.dtype)
        if plan.uniform:
            s = plan.starts[0]
            self.keys[..., s : s + W, :] = keys
            self.values[..., s : s + W, :] = values
        else:
            idx = plan.index
            self.keys = mx.put_along_axis(self.keys, mx.broadcast_to(idx, keys.shape), keys, axis=2)
            self.values = mx.put_along_axis(
                self.values, mx.broadcast_to(idx, values.shape), values, axis=2
            )
        return self.keys[..., : plan.span, :], self.values[..., : plan.span, :]

    def update_tokens(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write packed tokens' keys/values [T, H, D] at their rows' positions (the
        plan's token_rows/token_pos) with one scatter each, no padded grid; return
        the keys/values the forward's queries see, as update_and_fetch does."""
        plan = self.plan
        T, H, D = keys.shape
        B, Dv = len(plan.starts), values.shape[-1]
        self._reserve(B, H, D, plan.span, keys.dtype, Dv, values.dtype)
        cap = self.capacity
        idx = plan.flat_index(H, cap)
        flat = self.keys.reshape(B * H * cap, D)
        flat[idx] = keys.reshape(T * H, D)
        self.keys = flat.reshape(B, H, cap, D)
        flat = self.values.reshape(B * H * cap, Dv)
        flat[idx] = values.reshape(T * H, Dv)
        self.values = flat.reshape(B, H, cap, Dv)
        return self.keys[..., : plan.span, :], self.values[..., : plan.span, :]

    @property
    def state(self):  # mlx-lm utilities look for this; we expose the raw buffers
        return self.keys, self.values

    # --- group management ----------------------------------------------------------
    @property
    def capacity(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def _reserve(self, B, H, D, span, kdtype, Dv, vdtype) -> None:
        if self.keys is not None and self.keys.shape[2] >= span:
            return
        new_cap = ((span + STEP - 1) // STEP) * STEP
        if self.keys is None:
            self.keys = mx.zeros((B, H, new_cap, D), kdtype)
            self.values = mx.zeros((B, H, new_cap, Dv), vdtype)
            return
        grow = new_cap - self.keys.shape[2]
        self.keys = mx.concatenate([self.keys, mx.zeros((B, H, grow, D), kdtype)], axis=2)
        self.values = mx.concatenate([self.values, mx.zeros((B, H, grow, Dv), vdtype)], axis=2)

    def fit(self, capacity: int) -> None:
        """Pad the sequence axis to `capacity` (so two caches can be joined)."""
        if self.keys is None or self.keys.shape[2] >= capacity:
            return
        B, H, C, D = self.keys.shape
        Dv = self.values.shape[-1]
        self.keys = mx.concatenate([self.keys, mx.zeros((B, H, capacity - C, D), self.keys.dtype)], 2)
        self.values = mx.concatenate(
            [self.values, mx.zeros((B, H, capacity - C, Dv), self.values.dtype)], 2
        )


class RowKVCache:
    """All layers' caches for one group of rows, plus each row's end pointer."""

    def __init__(self, n_layers: int) -> None:
        self.layers = [LayerCache() for _ in range(n_layers)]
        self.ends: list[int] = []

    @property
    def size(self) -> int:
        return len(self.ends)

    def begin(self, width: int, starts: list[int] | None = None, explicit: bool = False) -> ForwardPlan:
        """Prepare a forward of `width` tokens per row, written at each row's end."""
        plan = plan_forward(self.ends if starts is None else starts, width, explicit)
        for layer in self.layers:
            layer.plan = plan
        return plan

    def advance(self, counts: list[int]) -> None:
        """Commit `counts[b]` tokens of the last forward for row b (the rest roll back)."""
        self.ends = [e + c for e, c in zip(self.ends, counts)]

    def rollback(self, row: int, n: int) -> None:
        """O(1): move row's end pointer back; the stale columns are masked and overwritten."""
        self.ends[row] = max(0, self.ends[row] - n)

    def append_rows(self, other: "RowKVCache") -> None:
        """Join the rows of `other` (e.g. freshly prefilled) after this group's rows."""
        if other.size == 0:
            return
        if self.size == 0:
            self.layers, self.ends = other.layers, list(other.ends)
            return
        for mine, theirs in zip(self.layers, other.layers):
            cap = max(mine.capacity, theirs.capacity)
            mine.fit(cap)
            theirs.fit(cap)
            mine.keys = mx.concatenate([mine.keys, theirs.keys], axis=0)
            mine.values = mx.concatenate([mine.values, theirs.values], axis=0)
        self.ends += other.ends

    def remove_rows(self, rows: list[int]) -> None:
        """Retire rows; the remaining rows keep their order."""
        drop = set(rows)
        keep = [i for i in range(self.size) if i not in drop]
        self.ends = [self.ends[i] for i in keep]
        if not keep:
            for layer in self.layers:
                layer.keys = layer.values = None
            return
        idx = mx.array(keep, dtype=mx.int32)
        for layer in self.layers:
            layer.keys = layer.keys[idx]
            layer.values = layer.values[idx]
        mx.eval([l.keys for l in self.layers] + [l.values for l in self.layers])

    def arrays(self) -> list[mx.array]:
        return [a for l in self.layers for a in (l.keys, l.values) if a is not None]
