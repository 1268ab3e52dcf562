"""Fewer graph nodes per decoded token on the CPU, bit for bit the same results.

On MLX's CPU backend `mx.fast.rope` and `mx.fast.rms_norm` run their composed
fallbacks: a RoPE call is ~31 graph nodes (it recomputes its frequencies, an `exp`,
a `cos` and a `sin` every call) and an RMSNorm 11. A decode step of the default model
is ~4,000 nodes, each ~3-5 µs of dispatch on this CPU (`jumpahead bench roofline`),
and RoPE alone is ~1,900 of them. So, for the modules where it gives the same bits:

- RoPE reads its cosines and sines from a table (one per distinct rotation, shared by
  the layers, grown as contexts grow) gathered once per forward, and applies the
  fallback's own rotation arithmetic (`x1*cos - x2*sin`, `x1*sin + x2*cos`), compiled.
  The table is made by running the module itself on a probe (ones in the first half,
  zeros in the second: the outputs are exactly its cosines and sines), so nothing is
  read from its source or configuration beyond `dims` and `traditional`.
- RMSNorm runs the fallback's arithmetic as one compiled function (4 nodes: the
  reduction stays apart).

Each substitution is *verified at load* against the module it replaces (random
inputs, several widths, int and per-row offsets, the model's dtype) and installed
only where every output is bit-identical; otherwise the module is left alone and the
reason kept (`ModelRunner.describe()`). They take effect only inside the engine's own
forwards (`active()`, with our cache's offsets): mlx-lm's own generation over the
same model object runs the original modules, so the tests' mlx-lm oracle stays
independent of this code. mlx-lm itself compiles only small activations; we cannot
compile the whole step because the attention's key length changes every token.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Callable, Iterator

import mlx.core as mx
import mlx.nn as nn

from .held import Held

log = logging.getLogger("jumpahead.engine")

MIN_TABLE = 4096  # positions a RoPE table starts with; it doubles as contexts need

_active = Held()


def active() -> Held:
    """The engine's forwards: substituted modules take their fast path inside."""
    return _active


def _is_active() -> bool:
    return _active.on


class RowStart(int):
    """A RoPE offset from the engine's cache (every row at the same start)."""


# Per-row offset arrays the engine's cache made, by id: (weakref, positions limit).
_marked: dict[int, tuple[weakref.ref, int]] = {}


def mark(offsets: mx.array, limit: int) -> mx.array:
    """Note `offsets` (one RoPE offset per batch entry) as the engine's own, with the
    exclusive bound of the positions a forward from them reaches (host-side: no sync)."""
    key = id(offsets)
    _marked[key] = (weakref.ref(offsets, lambda _, k=key: _marked.pop(k, None)), limit)
    return offsets


def _limit(offset: Any, width: int) -> int | None:
    if type(offset) is RowStart:
        return int(offset) + width
    entry = _marked.get(id(offset))
    if entry is not None and entry[0]() is offset:
        return entry[1]
    return None


# --- RoPE ---------------------------------------------------------------------------


def _rotate(x1: mx.array, x2: mx.array, c: mx.array, s: mx.array) -> tuple[mx.array, mx.array]:
    # the fallback's arithmetic, in its order (mlx/fast.cpp apply_rope, forward)
    return x1 * c - x2 * s, x1 * s + x2 * c


_rotate_compiled = mx.compile(_rotate, shapeless=True)


class RopeTable:
    """Cosines and sines of one rotation (a module's outputs on a probe), by position."""

    def __init__(self, module: Any, dims: int, traditional: bool, dtype: mx.Dtype) -> None:
        self.module, self.dims, self.traditional, self.dtype = module, dims, traditional, dtype
        self.cos: mx.array | None = None
        self.sin: mx.array | None = None
        self.size = 0
        self.compiled = True  # the rotation compiled (False where that failed its check)
        # this forward's gathered (cos, sin), by (offset identity or value, width)
        self._memo: tuple[Any, tuple[mx.array, mx.array]] | None = None

    def probe(self, n: int) -> tuple[mx.array, mx.array]:
        half = self.dims // 2
        if self.traditional:  # pairs (x[2i], x[2i+1]) rotate: ones at even, zeros at odd
            x = mx.stack([mx.ones((n, half), self.dtype), mx.zeros((n, half), self.dtype)], axis=-1)
            out = self.module(x.reshape(1, 1, n, self.dims), offset=0)[0, 0]
            return out[:, 0::2], out[:, 1::2]
        x = mx.concatenate([mx.ones((n, half), self.dtype), mx.zeros((n, half), self.dtype)], axis=-1)
        out = self.module(x.reshape(1, 1, n, self.dims), offset=0)[0, 0]
        return out[:, :half], out[:, half:]

    def ensure(self, limit: int) -> None:
        if limit <= self.size:
            return
        n = max(MIN_TABLE, self.size)
        while n < limit:
            n *= 2
        self.cos, self.sin = self.probe(n)
        mx.eval(self.cos, self.sin)
        self.size = n
        self._memo = None

    def gathered(self, offset: Any, width: int, limit: int, ndim: int) -> tuple[mx.array, mx.array]:
        key = (offset if type(offset) is RowStart else id(offset), width, ndim)
        memo = self._memo
        if memo is not None and memo[0][0] == key and (type(offset) is RowStart or memo[0][1] is offset):
            return memo[1]
        self.ensure(limit)
        if type(offset) is RowStart:
            c, s = self.cos[offset : offset + width], self.sin[offset : offset + width]
        else:
            pos = offset[:, None] + mx.arange(width, dtype=mx.int32)[None, :]  # [B, T]
            shape = (offset.shape[0],) + (1,) * (ndim - 3) + (width, self.dims // 2)
            c, s = self.cos[pos].reshape(shape), self.sin[pos].reshape(shape)
        self._memo = ((key, offset), (c, s))
        return c, s


class _StandIn:
    """A module's stand-in: every attribute it does not own is the module's own (code
    that reads or sets a norm's `weight` or a RoPE's `dims` reaches the module)."""

    _own: frozenset[str] = frozenset()

    def __getattr__(self, name: str) -> Any:
        if name == "original":  # not yet set (during construction)
            raise AttributeError(name)
        return getattr(self.original, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._own:
            object.__setattr__(self, name, value)
        else:
            setattr(self.original, name, value)


class TableRope(_StandIn):
    """Stands in for a RoPE module: the table path inside the engine's forwards."""

    _own = frozenset({"original", "table", "rotate"})

    def __init__(self, original: Any, table: RopeTable) -> None:
        self.original = original
        self.table = table
        self.rotate = _rotate_compiled if table.compiled else _rotate

    def __call__(self, x: mx.array, offset: Any = 0) -> mx.array:
        width = x.shape[-2]
        limit = _limit(offset, width) if _is_active() and x.ndim >= 3 and x.dtype == self.table.dtype else None
        if limit is None:
            return self.original(x, offset=offset)
        return self.apply(x, offset, width, limit)

    def apply(self, x: mx.array, offset: Any, width: int, limit: int) -> mx.array:
        t = self.table
        c, s = t.gathered(offset, width, limit, x.ndim)
        dims, half = t.dims, t.dims // 2
        if t.traditional:
            x1, x2 = x[..., 0:dims:2], x[..., 1:dims:2]
            o1, o2 = self.rotate(x1, x2, c, s)
            out = mx.concatenate([o1[..., None], o2[..., None]], axis=-1).reshape(*x.shape[:-1], dims)
            parts = [out]
        else:
            o1, o2 = self.rotate(x[..., :half], x[..., half:dims], c, s)
            parts = [o1, o2]
        if dims < x.shape[-1]:
            parts.append(x[..., dims:])
        return mx.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]


def _rope_signature(module: Any) -> tuple | None:
    """(dims, traditional) of a RoPE module whose rotation depends on position alone
    (nn.RoPE and mlx-lm's Llama3RoPE: frequencies fixed at construction); None else."""
    from mlx_lm.models import rope_utils

    if type(module) not in (nn.RoPE, rope_utils.Llama3RoPE):
        return None
    return int(module.dims), bool(module.traditional)


def _verify_rope(fast: TableRope, original: Any, dtype: mx.Dtype) -> str | None:
    """None when the table path equals the module bit for bit, else why not."""
    dims = fast.table.dims
    key = mx.random.key(3)
    cases = [(1, 0, 1), (1, 7, 1), (2, 300, 1), (1, 40, 5), (3, 4095, 3)]
    for batch, start, width in cases:
        x = mx.random.normal((batch, 3, width, dims + 4), key=key).astype(dtype)
        for offset, limit in ((RowStart(start), start + width),
                              (mx.array([start + 11 * b for b in range(batch)], dtype=mx.int32),
                               start + 11 * (batch - 1) + width)):
            want = original(x[..., :dims], offset=offset)
            got = fast.apply(x[..., :dims], offset, width, limit)
            if got.shape != want.shape or not mx.array_equal(got, want).item():
                return f"rope table differs from the module at offset {start}, width {width}"
    return None


# --- RMSNorm ------------------------------------------------------------------------


def _rms_fn(eps: float) -> Callable[[mx.array, mx.array], mx.array]:
    def rms(x: mx.array, w: mx.array) -> mx.array:
        # mlx/fast.cpp rms_norm's fallback, op for op
        x32 = x.astype(mx.float32)
        y = x32 * mx.rsqrt(mx.mean(mx.square(x32), axis=-1, keepdims=True) + mx.array(eps, mx.float32))
        return y.astype(x.dtype) * w.astype(x.dtype)

    return mx.compile(rms, shapeless=True)


class FastRMSNorm(_StandIn):
    """Stands in for nn.RMSNorm: one compiled function inside the engine's forwards."""

    _own = frozenset({"original", "fn"})

    def __init__(self, original: nn.RMSNorm, fn: Callable) -> None:
        self.original = original
        self.fn = fn

    def __call__(self, x: mx.array) -> mx.array:
        if not _is_active():
            return self.original(x)
        return self.fn(x, self.original["weight"])


def _verify_norm(fast: FastRMSNorm, dtype: mx.Dtype) -> str | None:
    dim = fast.original["weight"].shape[-1]
    key = mx.random.key(5)
    for shape in ((1, 1, dim), (3, 5, dim), (1, 70, dim), (4, dim)):
        x = (mx.random.normal(shape, key=key) * 3).astype(dtype)
        with active():
            got = fast(x)
        want = fast.original(x)
        if got.dtype != want.dtype or not mx.array_equal(got, want).item():
            return f"compiled RMSNorm differs from the module at shape {shape}"
    return None


# --- installing -----------------------------------------------------------------------


def _children(model: nn.Module) -> Iterator[tuple[nn.Module, str, Any]]:
    """(parent, attribute, module) for every submodule held by a parent module."""
    for _, parent in model.named_modules():
        for name, child in list(parent.items()):
            if isinstance(child, nn.Module):
                yield parent, name, child


def install(model: nn.Module, dtype: mx.Dtype) -> dict[str, Any]:
    """Put the verified fast paths in place of the model's RoPE and RMSNorm modules.
    Returns what was done for /health: counts and the reasons for anything left."""
    report: dict[str, Any] = {"rope_modules": 0, "rms_norm_modules": 0, "left": []}
    if mx.default_device() != mx.cpu:  # fused kernels exist there
        report["left"].append("not on the CPU: mx.fast kernels are fused")
        return report
    tables: dict[tuple, RopeTable | None] = {}
    norms: dict[float, Callable | None] = {}
    for parent, name, child in list(_children(model)):
        if isinstance(child, (TableRope, FastRMSNorm)):
            continue
        sig = _rope_signature(child)
        if sig is not None:
            key = (type(child), sig, _rope_key(child))
            if key not in tables:
                tables[key] = _checked_table(child, sig, dtype, report)
            table = tables[key]
            if table is not None:
                object.__setattr__(parent, name, TableRope(child, table))
                report["rope_modules"] += 1
            continue
        if type(child) is nn.RMSNorm:
            eps = float(child.eps)
            if eps not in norms:
                norms[eps] = _checked_norm(child, dtype, report)
            if norms[eps] is not None:
                object.__setattr__(parent, name, FastRMSNorm(child, norms[eps]))
                report["rms_norm_modules"] += 1
    return report


def _rope_key(module: Any) -> tuple:
    """What makes two RoPE modules of a class rotate alike (their constructor values)."""
    freqs = getattr(module, "_freqs", None)
    return (getattr(module, "base", None), getattr(module, "scale", None),
            None if freqs is None else tuple(freqs.tolist()))


def _failure(check: Callable[[], str | None]) -> str | None:
    """Why a verification fails (its own reason, or what it raised: a compile failure
    where no C++ compiler is at hand); None when it passes."""
    try:
        return check()
    except Exception as exc:  # noqa: BLE001 (MLX's CPU compile invokes the system compiler)
        return f"{type(exc).__name__}: {exc}"


def _checked_table(module: Any, sig: tuple, dtype: mx.Dtype, report: dict) -> RopeTable | None:
    dims, traditional = sig
    table = RopeTable(module, dims, traditional, dtype)
    for compiled in (True, False):
        table.compiled = compiled
        why = _failure(lambda: _verify_rope(TableRope(module, table), module, dtype))
        if why is None:
            return table
        report["left"].append(f"{type(module).__name__}{' compiled' if compiled else ''}: {why}")
    return None


def _checked_norm(module: nn.RMSNorm, dtype: mx.Dtype, report: dict) -> Callable | None:
    fn = _rms_fn(float(module.eps))
    why = _failure(lambda: _verify_norm(FastRMSNorm(module, fn), dtype))
    if why is None:
        return fn
    report["left"].append(f"RMSNorm: {why}")
    return None
