"""What each layer of a model keeps between forwards, derived from mlx-lm's own classes.

mlx-lm tells, per model class, which cache each layer needs: `model.make_cache()`
returns one cache object per layer (KVCache for full attention, RotatingKVCache for a
sliding window, ArraysCache for recurrent state such as Gated DeltaNet / Mamba conv
and SSM state, CacheList for layers that keep several). We read that list once at
load and map each object to a `LayerKind`; the engine's batched group cache
(engine/kv/row_cache.py) builds one layer object per kind. A family mlx-lm adds later
works here without per-model code as long as it uses these cache classes; a cache
class we do not know is refused at load (`UnsupportedModel`), naming it, instead of
failing every request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlx_lm.models.cache import ArraysCache, CacheList, ChunkedKVCache, KVCache, RotatingKVCache

FULL = "full"  # every key stays visible (plain attention, MLA latents)
SLIDING = "sliding"  # a query sees the last `window` keys
RECURRENT = "recurrent"  # fixed-size state arrays (conv state, DeltaNet / SSM state)
LIST = "list"  # several of the above in one layer (CacheList)
CHUNKED = "chunked"  # a query sees the keys of its own chunk of `window` positions (Llama 4)


class UnsupportedModel(ValueError):
    """A model whose layers keep state this engine cannot batch or roll back."""


@dataclass(frozen=True)
class LayerKind:
    kind: str
    window: int | None = None  # SLIDING: keys visible to a query (mlx-lm max_size); CHUNKED: chunk size
    size: int = 0  # RECURRENT: number of state arrays
    children: tuple["LayerKind", ...] = field(default=())  # LIST


def kind_of(cache: Any, where: str = "") -> LayerKind:
    """The LayerKind serving one mlx-lm cache object (subclasses included)."""
    name = type(cache).__name__
    if isinstance(cache, CacheList):
        return LayerKind(LIST, children=tuple(kind_of(c, where) for c in cache.caches))
    if isinstance(cache, ChunkedKVCache):  # before KVCache: it subclasses it
        return LayerKind(CHUNKED, window=int(cache.chunk_size))
    if isinstance(cache, RotatingKVCache):
        if getattr(cache, "keep", 0):
            raise UnsupportedModel(
                f"{where}cache class {name} with keep={cache.keep} (kept sink tokens) is not supported by the engine"
            )
        return LayerKind(SLIDING, window=int(cache.max_size))
    if isinstance(cache, KVCache):
        return LayerKind(FULL)
    if isinstance(cache, ArraysCache):
        return LayerKind(RECURRENT, size=len(cache.cache))
    module = type(cache).__module__
    own = "" if module == "mlx_lm.models.cache" else f" (the model's own class, from {module})"
    raise UnsupportedModel(f"{where}cache class {name}{own} is not supported by the engine: it batches and "
                           "rolls back mlx-lm's KVCache, RotatingKVCache, ChunkedKVCache, ArraysCache and CacheList")


def model_layout(model: Any) -> list[LayerKind]:
    """One LayerKind per entry of the cache list the model's forward takes."""
    make_cache = getattr(model, "make_cache", None)
    if make_cache is None:  # mlx-lm's make_prompt_cache: a KVCache per layer
        return [LayerKind(FULL) for _ in model.layers]
    caches = make_cache()
    return [kind_of(c, f"layer {i}: ") for i, c in enumerate(caches)]


def leaves(layout: list[LayerKind]) -> list[LayerKind]:
    out: list[LayerKind] = []
    for k in layout:
        out.extend(leaves(list(k.children)) if k.kind == LIST else [k])
    return out


def single_row(layout: list[LayerKind]) -> bool:
    """Whether the model's forward serves one row at a time. mlx-lm's chunked-attention
    model (llama4) builds its chunk mask and its attention temperature from one offset
    (`cache[0].offset`, `mx.arange(offset, ...)`), which rows at different positions
    cannot share; so such a model runs its rows one after another (max_batch 1)."""
    return any(k.kind == CHUNKED for k in leaves(layout))


def has_recurrent(layout: list[LayerKind]) -> bool:
    return any(k.kind == RECURRENT for k in leaves(layout))


def summary(layout: list[LayerKind]) -> dict[str, Any]:
    """/health's account: layer counts per kind and the sliding windows."""
    counts: dict[str, int] = {}
    windows: set[int] = set()
    for k in leaves(layout):
        counts[k.kind] = counts.get(k.kind, 0) + 1
        if k.window:
            windows.add(k.window)
    out: dict[str, Any] = {"layers": counts}
    if windows:
        out["windows"] = sorted(windows)
    return out
