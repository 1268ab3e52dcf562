"""One forward of an mlx-lm model over a RowKVCache, with logits only where needed.

mlx-lm's `Model.__call__` projects every position onto the vocabulary; a 512-token
prefill chunk would spend more time in that projection than it saves. For model
classes whose head is a plain projection of the final hidden state we run the trunk
(`model.model`) and project only the positions a caller asks for; any other model
class runs whole and we slice its logits.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from . import attention
from .ragged import MIN_PADS, ragged_hidden, supports_ragged
from .row_cache import RowKVCache

# model_type values whose Model.__call__ is exactly `head(self.model(...))`.
_PLAIN_HEAD = {"llama", "qwen2", "qwen3", "mistral", "phi3", "granite", "olmo2", "smollm3"}


class ModelRunner:
    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.n_layers = len(model.layers)
        args = getattr(model, "args", None)
        model_type = getattr(args, "model_type", None)
        self.split = model_type in _PLAIN_HEAD and hasattr(model, "model")
        if self.split and getattr(args, "tie_word_embeddings", False) and not hasattr(model, "lm_head"):
            self.head = model.model.embed_tokens.as_linear
        elif self.split and hasattr(model, "lm_head"):
            self.head = model.lm_head
        else:
            self.split = False
        # Our RowKVCache serves attention layers; models whose mlx-lm cache has
        # recurrent state (ArraysCache) cannot roll back, so they decline verification.
        make_cache = getattr(model, "make_cache", None)
        self.trimmable = True
        if make_cache is not None:
            self.trimmable = all(type(c).__name__ in ("KVCache", "RotatingKVCache") for c in make_cache())
        self.context_length = int(getattr(args, "max_position_embeddings", None) or 32768)
        self.ragged = self.split and supports_ragged(model)
        # our cache layers' attention calls go through engine/attention.py (fast on CPU)
        attention.install(model)

    def new_cache(self) -> RowKVCache:
        return RowKVCache(self.n_layers)

    def forward(
        self,
        tokens: list[list[int]] | mx.array,
        cache: RowKVCache,
        positions: slice | None = slice(-1, None),
        starts: list[int] | None = None,
    ) -> mx.array | None:
        """Run rows' tokens (equal widths) at their cache ends; return lazy logits.

        `positions` selects which of the W positions get logits ([B, n, V]);
        None asks for none (prefill chunks that only fill the cache). `starts`
        overrides where each row writes (a round launched before the previous one
        was committed writes one past the current ends).
        """
        inputs = tokens if isinstance(tokens, mx.array) else mx.array(tokens, dtype=mx.int32)
        cache.begin(inputs.shape[1], starts)
        if self.split:
            hidden = self.model.model(inputs, cache=cache.layers)
            if positions is None:
                return None
            return self.head(hidden[:, positions, :])
        logits = self.model(inputs, cache=cache.layers)
        return None if positions is None else logits[:, positions, :]

    def forward_ragged(
        self, rows: list[list[int]], cache: RowKVCache, counts: list[int]
    ) -> tuple[mx.array | None, list[int]]:
        """Rows of different widths in one forward, each written at its cache end.

        counts[b] logit positions for row b: all of its inputs (len(rows[b])), only its
        last (1) or none (0). Returns lazy logits [N, V] (None when no row needs any:
        the vocabulary projection is skipped) and each row's first index into them.
        Models the ragged path supports (engine/ragged.py) compute no padding outside
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
            hidden = ragged_hidden(self.model, rows, cache)
            if not picks:
                return None, offsets
            return self.head(mx.take(hidden, mx.array(picks, dtype=mx.int32), axis=0)), offsets
        padded = [r + [0] * (width - len(r)) for r in rows]
        if not picks:
            self.forward(padded, cache, None)
            return None, offsets
        logits = self.forward(padded, cache, slice(None) if width > 1 else slice(-1, None))
        flat = logits.reshape(-1, logits.shape[-1])
        if len(picks) == flat.shape[0]:
            return flat, offsets
        return mx.take(flat, mx.array(picks, dtype=mx.int32), axis=0), offsets
