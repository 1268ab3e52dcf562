"""A single decode row's linear layers through the bound BLAS's sgemv, on the CPU.

A decode step of one row multiplies one activation vector by every weight matrix:
reading the weights is the step (`jumpahead bench roofline`). MLX's CPU matmul calls
`cblas_sgemm`, and OpenBLAS's sgemm packs the weights before it multiplies, so at one
row it reads them at about half the rate of the same library's `cblas_sgemv` (12 vs 19
GB/s on a 2-core EPYC; 8 vs 18 on a Xeon). MLX has no way to call sgemv, nor to add a
CPU kernel from Python, so inside the engine's forwards (`fast_ops.active()`) a float32
`nn.Linear` (and a tied head, `Embedding.as_linear`) given exactly one row evaluates its
input, calls sgemv on the weights' own buffer (no copy) and hands the result back to
MLX. Wider inputs (prefill chunks, verifying rounds, batched rows) keep MLX's matmul.

What that gives up: sgemv sums each output in another order than sgemm, so a row
decoded alone differs from the same row in a batch at the last bits. sgemm already
does (engine/machine/blas_probe.py `row_consistency`: OpenBLAS's sgemm at M=1 is not
M=2's), so the engine's oracles are token-level with near-ties proved (tests/oracle.py).

Verified at load, never assumed (`install`): for every weight shape the result must lie
within the float32 error bound of MLX's own (|gemv - matmul| <= 2 K u |W||x|, any
summation order meets it; a wrong kernel does not), and the model's own linears, timed
one row at a time, must be faster this way than MLX's matmul over them in one graph.
Otherwise nothing is installed and `/health` (`layers.row_gemv`) says why.
`JUMPAHEAD_ROW_GEMV=off` keeps MLX's matmul; `=on` installs wherever verified, unmeasured.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterator

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..machine.cblas import Cblas, bound_cblas
from .fast_ops import _StandIn, _children, _is_active, active
from .held import Held

ENV = "JUMPAHEAD_ROW_GEMV"
# installed only where the one-row sgemv pass is at least this much faster (timings are noisy)
MIN_GAIN = 1.1
TIMING_ROUNDS = 3
U = 2.0 ** -24  # float32 unit roundoff

_off = Held()


def suspended() -> Held:
    """MLX's matmul for every row while held (`bench roofline` counts the graph a
    forward builds when nothing evaluates inside it)."""
    return _off


def _on() -> bool:
    return _is_active() and not _off.on


class RowWeights:
    """A weight matrix as the BLAS reads it: the numpy view of MLX's own buffer."""

    def __init__(self, cb: Cblas, weight: mx.array, bias: mx.array | None) -> None:
        self.cb = cb
        self.weight = weight  # held: the view's buffer is this array's
        self.bias = bias
        self.n, self.k = weight.shape[0], weight.shape[-1]
        self.w: np.ndarray | None = None
        self.b: np.ndarray | None = None
        self.why = self._view()

    def _view(self) -> str | None:
        """Views of the weights' (and bias') buffers; why sgemv cannot read them, or None."""
        weight, bias = self.weight, self.bias
        if weight.ndim != 2 or weight.dtype != mx.float32 or (bias is not None and bias.dtype != mx.float32):
            return f"{weight.dtype} weights (sgemv is float32)"
        mx.eval(weight) if bias is None else mx.eval(weight, bias)
        self.w = np.asarray(weight)
        self.b = None if bias is None else np.asarray(bias).reshape(-1)
        return None

    def usable(self) -> str | None:
        """Why sgemv cannot read these weights in place; None when it can."""
        if self.why is not None:
            return self.why
        if not self.w.flags.c_contiguous or self.w.flags.owndata:
            return "weights not one row-major buffer of MLX's"
        if self.b is not None and self.b.shape[0] != self.n:
            return "bias shape"
        return None

    def apply(self, x: mx.array) -> mx.array:
        """x [..., K] holding one row -> x @ W.T (+ bias), as a new MLX array."""
        mx.eval(x)
        h = np.asarray(x)
        if h.dtype != np.float32 or not h.flags.c_contiguous:
            h = np.ascontiguousarray(h, dtype=np.float32)
        out = np.empty(x.shape[:-1] + (self.n,), np.float32)
        beta = 0.0
        if self.b is not None:  # as addmm: bias + x @ W.T in the one call
            out.reshape(-1)[:] = self.b
            beta = 1.0
        self.cb.sgemv(self.w, h.reshape(-1), out.reshape(-1), beta)
        return mx.array(out)


def _one_row(x: mx.array, k: int) -> bool:
    return x.dtype == mx.float32 and x.ndim >= 1 and x.shape[-1] == k and x.size == k


class GemvLinear(_StandIn):
    """Stands in for a float32 nn.Linear: sgemv for one row inside the engine's forwards."""

    _own = frozenset({"original", "rows"})

    def __init__(self, original: nn.Linear, rows: RowWeights) -> None:
        self.original = original
        self.rows = rows

    def __call__(self, x: mx.array) -> mx.array:
        if _on() and _one_row(x, self.rows.k) and self.current():
            return self.rows.apply(x)
        return self.original(x)

    def current(self) -> bool:
        """The module still holds the weights the view reads (they can be replaced)."""
        o = self.original
        return o["weight"] is self.rows.weight and ("bias" in o) == (self.rows.bias is not None) and \
            ("bias" not in o or o["bias"] is self.rows.bias)


class GemvEmbedding(_StandIn):
    """Stands in for a float32 nn.Embedding whose table is also the head (tied): its
    `as_linear` uses sgemv for one row inside the engine's forwards; lookups are its own."""

    _own = frozenset({"original", "rows"})

    def __init__(self, original: nn.Embedding, rows: RowWeights) -> None:
        self.original = original
        self.rows = rows

    def __call__(self, x: mx.array) -> mx.array:
        return self.original(x)

    def as_linear(self, x: mx.array) -> mx.array:
        if _on() and _one_row(x, self.rows.k) and self.original["weight"] is self.rows.weight:
            return self.rows.apply(x)
        return self.original.as_linear(x)


def env_mode(env: str = ENV) -> str:
    """An `off`/`on`/`auto` switch from the environment (`auto` when unset)."""
    raw = (os.environ.get(env) or "auto").strip().lower()
    return {"0": "off", "false": "off", "no": "off", "1": "on", "true": "on", "yes": "on"}.get(raw, raw)


def _within_bound(stand_in: Any, original: Callable, k: int, w: mx.array) -> str | None:
    """None when sgemv's one-row result is MLX's own to float32 rounding, else why not."""
    key = mx.random.key(7)
    for scale in (1.0, 30.0):
        x = mx.random.normal((1, 1, k), key=key) * scale
        with active():
            got = stand_in(x)
        want = original(x)
        mx.eval(got, want)
        if got.shape != want.shape:
            return f"shape {got.shape} != {want.shape}"
        bound = 2 * k * U / (1 - k * U) * (mx.abs(x.reshape(1, k)) @ mx.abs(w).T).reshape(want.shape) + 1e-30
        excess = (mx.abs(got - want) / bound).max().item()
        if not excess <= 1.0:  # NaN fails too
            return f"sgemv differs from MLX's matmul by {excess:.3g}x the float32 bound ({tuple(w.shape)})"
    return None


def _best(fn: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(TIMING_ROUNDS):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _timed(subs: list[tuple[Any, Callable, int]]) -> tuple[float, float]:
    """(MLX matmul, sgemv) seconds for one row through every substituted layer: MLX's
    as one graph (its best case), sgemv one synchronized call each (as in a forward)."""
    xs = [mx.random.normal((1, 1, k)) for _, _, k in subs]
    mx.eval(xs)

    def matmul() -> None:
        mx.eval([orig(x) for (_, orig, _), x in zip(subs, xs)])

    def gemv() -> None:
        with active():
            mx.eval([fast(x) for (fast, _, _), x in zip(subs, xs)])

    matmul(), gemv()  # warm
    m = g = float("inf")
    for _ in range(2):  # interleaved, so load from elsewhere hits both alike
        m, g = min(m, _best(matmul)), min(g, _best(gemv))
    return m, g


def install(model: nn.Module, head: Any = None, quantized_kv: bool = False) -> tuple[dict[str, Any], Any]:
    """Put sgemv stand-ins in place of the model's float32 Linear layers (and its tied
    embedding) where verified and measured faster. Returns /health's account and the
    head to call from now on (`head`, or its stand-in's)."""
    report: dict[str, Any] = {"installed": False, "modules": 0, "left": []}
    mode = env_mode()
    if mode == "off":
        report["left"].append(f"{ENV}=off")
        return report, head
    if quantized_kv:
        # A key or value whose last bits differ between a row alone (sgemv) and the row in a
        # batch (sgemm) can round to another 4- or 8-bit step: measured on the default model at
        # K8/V4, rows batched then differ from the rows alone beyond the load-time check's
        # tolerance, which would cost batching and verified proposals. sgemm keeps them closer.
        report["left"].append("quantized KV cache: one row keeps MLX's matmul (see engine/kv/row_gemv.py)")
        return report, head
    if mx.default_device() != mx.cpu:
        report["left"].append("not on the CPU")
        return report, head
    cb = bound_cblas()
    if cb is None:
        report["left"].append("no optimized BLAS bound (MLX's reference BLAS has no sgemv to call)")
        return report, head
    plan: list[tuple[nn.Module, str, Any, Callable, Callable, int]] = []
    checked: dict[tuple, str | None] = {}
    for parent, name, child in list(_children(model)):
        if type(child) is nn.Linear:
            rows = RowWeights(cb, child["weight"], child["bias"] if "bias" in child else None)
            fast, original = GemvLinear(child, rows), child
        elif type(child) is nn.Embedding and _tied(child, head):
            rows = RowWeights(cb, child["weight"], None)
            fast, original = GemvEmbedding(child, rows), child.as_linear
        else:
            continue
        call = fast.as_linear if isinstance(fast, GemvEmbedding) else fast
        why = rows.usable()
        shape = (rows.n, rows.k, rows.b is not None)
        if why is None:
            if shape not in checked:
                checked[shape] = _within_bound(call, original, rows.k, child["weight"])
            why = checked[shape]
        if why is not None:
            if why not in report["left"]:
                report["left"].append(why)
            continue
        plan.append((parent, name, fast, call, original, rows.k))
    if not plan:
        report["left"].append("no float32 linear layer to substitute")
        return report, head
    if mode != "on":
        matmul_s, gemv_s = _timed([(call, original, k) for _, _, _, call, original, k in plan])
        report["matmul_ms"], report["gemv_ms"] = round(matmul_s * 1e3, 2), round(gemv_s * 1e3, 2)
        if gemv_s * MIN_GAIN > matmul_s:
            report["left"].append(f"one row through sgemv measured {gemv_s * 1e3:.1f} ms against "
                                  f"{matmul_s * 1e3:.1f} ms by MLX's matmul: not installed")
            return report, head
    for parent, name, fast, _, original, _ in plan:
        object.__setattr__(parent, name, fast)
        if original is head:  # an lm_head Linear
            head = fast
        elif isinstance(fast, GemvEmbedding) and _tied(fast.original, head):
            head = fast.as_linear
    report["installed"], report["modules"] = True, len(plan)
    return report, head


def _held(model: nn.Module) -> Iterator[tuple[nn.Module, str, nn.Module, Any]]:
    """(parent, attribute, module, its stand-in) for every stand-in the model holds."""
    for _, parent in model.named_modules():
        for name, child in list(parent.items()):
            held = parent.__dict__.get(name) if isinstance(child, nn.Module) else None
            if isinstance(held, (GemvLinear, GemvEmbedding)):
                yield parent, name, child, held


def uninstall(model: nn.Module) -> None:
    """Take earlier stand-ins out (a model served again starts from its own modules:
    ModelRunner finds its head among them before `install`)."""
    for parent, name, _, _ in list(_held(model)):
        del parent.__dict__[name]


def _tied(embedding: nn.Embedding, head: Any) -> bool:
    """The embedding's `as_linear` is the model's head (found at load by ModelRunner)."""
    return head is not None and getattr(head, "__self__", None) is embedding and \
        getattr(head, "__func__", None) is type(embedding).as_linear


def stand_ins(model: nn.Module) -> dict[int, Any]:
    """id(module) -> the stand-in the model calls in its place (`bench roofline` times
    the linears as the engine runs them)."""
    return {id(child): held for _, _, child, held in _held(model)}
