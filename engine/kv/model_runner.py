"""One forward of an mlx-lm model over a RowKVCache, with logits only where needed.

mlx-lm's `Model.__call__` projects every position onto the vocabulary; a 512-token
prefill chunk would spend more time in that projection than it saves (Gemma 3's
262k-entry vocabulary makes it 10x worse). Where the head is a plain projection of
the trunk's final hidden state (`lm_head` or the tied embedding), we run the trunk
(`model.model`) and project only the positions a caller asks for. Which one it is
is not declared anywhere, so it is found at load by one tiny forward: the candidate
head whose output equals the model's own logits is used; a model with anything else
after its trunk (soft-capping, scaling) runs whole and we slice its logits.

The layer kinds come from the model class itself (engine/kv/cache_layout.py); a model
that keeps recurrent state has its verifying rounds settled by `replay`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn

from . import attention
from . import fast_ops
from . import host_decode
from . import host_swiglu
from . import model_check
from . import row_gemv
from .cache_layout import UnsupportedModel, has_recurrent, model_layout, single_row, summary
from .kv_format import KVFormat
from .ragged import MIN_PADS, ragged_hidden, supports_ragged
from .row_cache import RowKVCache

log = logging.getLogger("jumpahead.engine")


def _trunk(model: nn.Module) -> nn.Module | None:
    trunk = getattr(model, "model", None)
    return trunk if isinstance(trunk, nn.Module) and hasattr(trunk, "embed_tokens") else None


def _activation_dtype(model: nn.Module) -> mx.Dtype:
    """The dtype the model computes in: its first floating parameter's (a quantized
    model's scales are in it)."""
    from mlx.utils import tree_flatten

    for _, v in tree_flatten(model.parameters()):
        if mx.issubdtype(v.dtype, mx.floating):
            return v.dtype
    return mx.float32


def _head_candidates(model: nn.Module, trunk: nn.Module) -> list[Callable[[mx.array], mx.array]]:
    out = []
    for owner in (model, getattr(model, "language_model", None)):
        head = getattr(owner, "lm_head", None) if owner is not None else None
        if isinstance(head, nn.Module):
            out.append(head)
    embed = getattr(trunk, "embed_tokens", None)
    if embed is not None and hasattr(embed, "as_linear"):
        out.append(embed.as_linear)
    return out


class ModelRunner:
    def __init__(self, model: nn.Module, kv_format: KVFormat | None = None) -> None:
        self.model = model
        self.kv_format = kv_format
        self.layout = model_layout(model)  # raises UnsupportedModel for unknown cache kinds
        self.n_layers = len(self.layout)
        args = getattr(model, "args", None)
        self.model_type = getattr(args, "model_type", None) or type(model).__module__.rsplit(".", 1)[-1]
        self.recurrent = has_recurrent(self.layout)
        # Set from the load-time check below (engine/kv/model_check.py): rows of different
        # widths share a padded forward only where that equals the rows alone, and
        # verified proposals need an exact way back after a rejection.
        self.padding_safe = True
        self.trimmable = True
        self.context_length = int(
            getattr(args, "max_position_embeddings", None)
            or getattr(getattr(args, "text_config", None) or {}, "get", lambda *_: None)("max_position_embeddings")
            or 32768
        )
        row_gemv.uninstall(model)  # a runner made before over this model installed its own
        # our cache layers' attention calls go through engine/kv/attention.py (fast on CPU)
        installed = attention.install(model)
        if kv_format is not None and not installed:
            raise UnsupportedModel(f"{self.model_type}: --kv-bits needs attention through mlx-lm's "
                                   "scaled_dot_product_attention, which this model class does not call")
        # RoPE and RMSNorm with fewer graph nodes where verified bit-identical here
        self.fast_ops = fast_ops.install(model, _activation_dtype(model))
        # mlx-lm's swiglu through numpy's exp (MLX's CPU sigmoid is scalar) where verified here
        self.swiglu = host_swiglu.install(attention.model_modules(model), quantized_kv=kv_format is not None)
        self.trunk = _trunk(model)
        self.head = None
        # The trunk's final hidden state at the positions that got logits in the last
        # forward (lazy, [N, D] aligned with them): a learned drafter reads it
        # (engine/methods/drafter.py). Kept only while `keep_hidden` is set and the head splits.
        self.keep_hidden = False
        self.host: host_decode.HostDecoder | None = None  # set after the load-time check
        self.last_hidden: mx.array | None = None
        # The trunk's final hidden state at every input of the last forward, per row
        # (lazy [W, D] each; a padded row's tail is padding): MTP (engine/methods/mtp.py) writes
        # its own cache from the target's state at each committed position. Kept only
        # while `keep_all_hidden` is set and the head splits.
        self.keep_all_hidden = False
        self.row_hidden: list[mx.array] | None = None
        self.key_widths: list[int] = []
        try:
            self._probe()
        except Exception as exc:  # noqa: BLE001 (the model's own forward over our cache)
            raise UnsupportedModel(f"{self.model_type}: a forward over the engine's cache fails at load: "
                                   f"{type(exc).__name__}: {str(exc).strip()[:300]}") from exc
        self.split = self.head is not None
        # one decode row's linears through the BLAS's sgemv where verified and faster here
        self.row_gemv, self.head = row_gemv.install(model, self.head, quantized_kv=kv_format is not None)
        self.ragged = self.split and supports_ragged(model)
        # How this model is served, decided by running it (engine/kv/model_check.py)
        try:
            self.serving = model_check.check_once(self)
        except model_check.RefusedModel as exc:
            raise UnsupportedModel(str(exc)) from exc
        self.padding_safe = self.serving.padded
        self.trimmable = self.serving.verifies
        self.one_row = single_row(self.layout) or not self.serving.batch
        # one row's decode step in numpy and sgemv, outside MLX's graph, where verified and faster
        self.host_decode, self.host = host_decode.install(self)
        for reason in self.serving.reasons:
            log.warning("%s: %s", self.model_type, reason)

    def describe(self) -> dict[str, Any]:
        """/health's account of the layer kinds the engine serves for this model."""
        out = summary(self.layout)
        out.update({"model_type": self.model_type, "split_head": self.split, "ragged": self.ragged,
                    "verifies": self.trimmable,
                    # rows served one at a time: chunked attention (cache_layout.single_row)
                    # or the load-time check (engine/kv/model_check.py)
                    "one_row_per_forward": self.one_row,
                    **self.serving.describe(),
                    "fast_ops": self.fast_ops,
                    "row_gemv": self.row_gemv,
                    "swiglu": self.swiglu,
                    "host_decode": self.host_decode,
                    "kv_cache": {**(self.kv_format.describe() if self.kv_format else {"format": "full"}),
                                 "bytes_per_token": self.kv_bytes_per_token,
                                 "sliding_window_bytes_per_row": self.window_bytes}})
        return out

    def _probe(self) -> None:
        """One tiny forward: which candidate head reproduces the model's logits, and
        the key width of each attention layer (for packed prefix-cache segments)."""
        tokens = mx.array([[1, 2, 3]], dtype=mx.int32)
        cache = RowKVCache(self.layout, self.kv_format)
        cache.ends = [0]
        cache.begin(3)
        full = self.model(tokens, cache=cache.layers)
        mx.eval(full)
        self.key_widths = [l.buffers()[0].shape[-1] if l.keys is not None else 0 for l in cache.attention]
        # one row's KV bytes per cached token: the layers that keep every token (/health);
        # a sliding layer keeps a ring of its window (plus the widest forward) instead,
        # whatever the context: `window_bytes` per row for its window
        per_token = lambda layers: sum(a.shape[1] * a.shape[-1] * a.dtype.size  # noqa: E731
                                       for l in layers for a in l.buffers())
        self.kv_bytes_per_token = per_token(cache.stored)
        self.window_bytes = sum(per_token([l]) * l.window for l in cache.windowed)
        # each stored layer's arrays (width, dtype): how byte-packed segments unpack
        self.part_specs = [[(a.shape[-1], a.dtype) for a in l.buffers()] for l in cache.stored]
        # how the prefix cache packs a row's attention KV (None: it cannot; see RowKVCache)
        self.packing = cache.segment_packing()
        # whether stored prefixes carry exact snapshots (recurrent state, sliding windows)
        self.snapshots = cache.snapshots
        self.windowed = bool(cache.windowed)
        if self.trunk is None:
            return
        cache = RowKVCache(self.layout, self.kv_format)
        cache.ends = [0]
        cache.begin(3)
        hidden = self.trunk(tokens, cache=cache.layers)
        if not isinstance(hidden, mx.array) or hidden.ndim != 3:
            return
        scale = float(mx.abs(full).max().item()) or 1.0
        for head in _head_candidates(self.model, self.trunk):
            try:
                logits = head(hidden)
            except Exception:  # a candidate of another shape
                continue
            if logits.shape == full.shape and float(mx.abs(logits - full).max().item()) <= 1e-5 * scale:
                self.head = head
                return

    def warm_up(self, tokens: int = 64) -> float:
        """Run a prefill chunk and a decoding round on a throwaway cache; seconds taken.

        A process's first forwards pay one-time costs (kernels, thread pools, the
        allocator's first buffers, numpy's and MLX's attention paths): ~0.4 s here with
        the default model, which a restarted server's first turn would pay on top of
        its prompt-cache hit. `tokens` is large enough to take the numpy softmax path
        (engine/kv/attention.py), the round after it the MLX one."""
        t0 = time.perf_counter()
        cache = self.new_cache()
        cache.ends = [0]
        ids = [(7 * i) % 200 + 1 for i in range(tokens)]  # ids every vocabulary has
        self.forward([ids], cache, None)
        mx.eval(cache.arrays())
        cache.advance([tokens])
        logits, _ = self.forward_ragged([[ids[-1]]], cache, [1])
        mx.eval(logits)
        return time.perf_counter() - t0

    def fresh_logits(self, tokens: list[int]) -> mx.array:
        """The logits after `tokens`, from one forward over a fresh cache in the served
        KV format (float32, evaluated): the single-forward reference oracles compare to."""
        cache = self.new_cache()
        cache.ends = [0]
        out = self.forward([tokens], cache)[0, -1].astype(mx.float32)
        mx.eval(out)
        return out

    def new_cache(self) -> RowKVCache:
        cache = RowKVCache(self.layout, self.kv_format)
        cache.key_widths = self.key_widths
        cache.part_specs = self.part_specs
        return cache

    def forward(
        self,
        tokens: list[list[int]] | mx.array,
        cache: RowKVCache,
        positions: slice | None = slice(-1, None),
        starts: list[int] | None = None,
        lengths: list[int] | None = None,
        host: bool = True,
    ) -> mx.array | None:
        """Run rows' tokens (equal widths) at their cache ends; return lazy logits.

        `positions` selects which of the W positions get logits ([B, n, V]);
        None asks for none (prefill chunks that only fill the cache). `starts`
        overrides where each row writes (a round launched before the previous one
        was committed writes one past the current ends). `lengths`: each row's real
        tokens when rows are padded to one width (recurrent state stops there).
        `host=False` keeps a decode step in MLX (engine/kv/host_decode.py verifies against it).
        """
        if host and self.host is not None and self._host_step(tokens, positions, lengths):
            cache.begin(1, starts)
            return self.host.logits([int(t[0]) for t in tokens], cache)
        inputs = tokens if isinstance(tokens, mx.array) else mx.array(tokens, dtype=mx.int32)
        cache.begin(inputs.shape[1], starts, lengths=lengths)
        with fast_ops.active(), self._host_swiglu():
            return self._forward(inputs, cache, positions)

    def _host_step(self, tokens: list[list[int]] | mx.array, positions: slice | None, lengths: list[int] | None) -> bool:
        """Rows of one known token each (as many as the host step serves) whose last logits
        are all that is asked for. A token given as an MLX array is a pipelined round's lazy
        argmax (engine/schedule/scheduler.py): its forward is queued before the token is
        read, which a host step cannot do."""
        one = isinstance(tokens, list) and 0 < len(tokens) <= self.host.max_rows and all(len(t) == 1 for t in tokens)
        return (one and (lengths is None or all(n == 1 for n in lengths))
                and positions in (slice(-1, None), slice(None))
                and not self.keep_hidden and not self.keep_all_hidden and self.host.current())

    def _host_swiglu(self) -> Any:
        """numpy's swiglu in this runner's forwards only where install routed it for this
        runner (not over a quantized KV cache: engine/kv/host_swiglu.py)."""
        return contextlib.nullcontext() if self.swiglu["routed"] else host_swiglu.suspended()

    def _forward(self, inputs: mx.array, cache: RowKVCache, positions: slice | None) -> mx.array | None:
        if self.split:
            hidden = self.trunk(inputs, cache=cache.layers)
            if self.keep_all_hidden:
                self.row_hidden = [hidden[b] for b in range(hidden.shape[0])]
            if positions is None:
                return None
            picked = hidden[:, positions, :]
            if self.keep_hidden:
                self.last_hidden = picked
            return self.head(picked)
        logits = self.model(inputs, cache=cache.layers)
        return None if positions is None else logits[:, positions, :]

    def forward_ragged(
        self, rows: list[list[int]], cache: RowKVCache, counts: list[int]
    ) -> tuple[mx.array | None, list[int]]:
        """Rows of different widths in one forward, each written at its cache end.

        counts[b] logit positions for row b: all of its inputs (len(rows[b])), only its
        last (1) or none (0). Returns lazy logits [N, V] (None when no row needs any:
        the vocabulary projection is skipped) and each row's first index into them.
        Models the ragged path supports (engine/kv/ragged.py) compute no padding outside
        attention; others are padded to the widest row and sliced.
        """
        width = max(len(r) for r in rows)
        ragged = self.ragged and len(rows) * width - sum(len(r) for r in rows) >= MIN_PADS
        picks: list[int] = []  # hidden/logit rows to keep: packed index, or b * width + i
        offsets: list[int] = []
        packed = 0
        for b, (r, n) in enumerate(zip(rows, counts)):
            offsets.append(len(picks))
            start = packed if ragged else b * width
            picks += [start + len(r) - n + i for i in range(n)]
            packed += len(r)
        if ragged:
            with fast_ops.active(), self._host_swiglu():
                hidden = ragged_hidden(self.model, rows, cache)
            if self.keep_all_hidden:
                starts = [0]
                for r in rows:
                    starts.append(starts[-1] + len(r))
                self.row_hidden = [hidden[a:b] for a, b in zip(starts, starts[1:])]
            if not picks:
                return None, offsets
            picked = mx.take(hidden, mx.array(picks, dtype=mx.int32), axis=0)
            if self.keep_hidden:
                self.last_hidden = picked
            return self.head(picked), offsets
        padded = [r + [0] * (width - len(r)) for r in rows]
        lengths = [len(r) for r in rows]
        if not picks:
            self.forward(padded, cache, None, lengths=lengths)
            return None, offsets
        logits = self.forward(padded, cache, slice(None) if width > 1 else slice(-1, None), lengths=lengths)
        flat = logits.reshape(-1, logits.shape[-1])
        hidden = None
        if self.keep_hidden and self.split and self.last_hidden is not None:
            hidden = self.last_hidden.reshape(-1, self.last_hidden.shape[-1])
        if len(picks) == flat.shape[0]:
            self.last_hidden = hidden
            return flat, offsets
        index = mx.array(picks, dtype=mx.int32)
        if hidden is not None:
            self.last_hidden = mx.take(hidden, index, axis=0)
        return mx.take(flat, index, axis=0), offsets

    def replay(
        self, cache: RowKVCache, rows: list[list[int]], counts: list[int], before: list[list[mx.array | None]]
    ) -> int:
        """Settle recurrent state after a round in which row b consumed only counts[b]
        of its inputs rows[b] (a rejected proposal, EOS inside a copy, a cut run).

        The forward left each recurrent state after all of a row's inputs; attention
        rolls back by pointer, state cannot. So the rows that consumed less restart
        from `before` (the states checkpointed before the round) and replay exactly
        their consumed prefix in one padded forward without a head. Every row takes
        part (the batch shares the forward) but the others keep the state the round
        left them; their attention writes recompute the same keys from the same
        inputs and state, and writes past a row's end are masked and overwritten.
        Returns the replay width (0: nothing to replay).
        """
        need = [c < len(r) for c, r in zip(counts, rows)]
        if not self.recurrent or not any(need):
            return 0
        width = max(c for c, n in zip(counts, need) if n)
        after = cache.states()
        cache.set_states(before)
        inputs = [(r[:width] + [0] * width)[:width] for r in rows]
        lengths = [c if n else min(len(r), width) for c, n, r in zip(counts, need, rows)]
        self.forward(inputs, cache, None, lengths=lengths)
        cache.choose_states(need, cache.states(), after)
        mx.eval(cache.arrays())
        return width
