"""SwiGLU (`silu(gate) * up`) computed in numpy inside the engine's forwards, on the CPU.

MLX's CPU `sigmoid` (so `nn.silu`, so mlx-lm's compiled `swiglu`) runs its exp one
element at a time: ~60 M elements/s on a 2-core EPYC, against ~1 G for numpy's SIMD exp.
A 512-token prefill chunk of the default model spends 13.0 ms a layer in `swiglu`
through MLX and 0.74 ms through numpy (~370 ms of a ~3 s chunk at 2k context); one
decode row 41 against 7 µs a layer (BENCHMARKS.md, issue 42). The same reason and the
same remedy as attention's softmax (engine/kv/attention.py).

mlx-lm's model files call the `swiglu` they import from `mlx_lm.models.activations`;
`install(model)` points that name, in every module whose classes make up the model,
at a function that inside `fast_ops.active()` (the engine's forwards), for float32
inputs on the CPU, evaluates `gate` and `up`, takes `gate / (1 + exp(-gate)) * up` in
numpy and hands the result back to MLX. Everywhere else (mlx-lm's own generation, the
tests' oracle, other dtypes) the original runs.

Elementwise, so a row's result does not depend on the rows beside it (a batched row
and the same row alone get the same bits here). Not MLX's bits: the two exps differ by
a few units in the last place. Verified at load (`_verify`): over random inputs from
-100 to 100 the result must lie within `MAX_ULPS` of MLX's own, NaN and infinities
where MLX has them; otherwise nothing is routed and `/health` (`layers.swiglu`) says why.
`JUMPAHEAD_HOST_SWIGLU=off` keeps MLX's.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import mlx.core as mx
import numpy as np

from . import host_work
from .held import Held
from .fast_ops import _is_active

ENV = "JUMPAHEAD_HOST_SWIGLU"
# Measured (2-core EPYC): <= 3.5 ulps apart for |gate| < 5, <= 10 above -20, <= 31 below, where
# silu is under 1e-7 |gate| and MLX's exp approximation drifts; allowed: 64 (7.6e-6 relative).
MAX_ULPS = 64
TINY = 1e-30


_off = Held()


def suspended() -> Held:
    """MLX's own swiglu while held (`bench roofline` times a prefill chunk both ways)."""
    return _off


def host_swiglu(gate: mx.array, up: mx.array) -> mx.array:
    """silu(gate) * up through numpy (float32, the same shape)."""
    mx.eval(gate, up)
    g = np.asarray(gate)
    u = np.asarray(up)
    out = host_work.scratch("swiglu", g.shape)  # mx.array copies it out below
    np.negative(g, out=out)
    with np.errstate(over="ignore", invalid="ignore"):  # exp(-gate) is inf below -88 (silu -0 there);
        np.exp(out, out=out)                             # gate = -inf gives NaN, as MLX's does
        out += 1
        np.divide(g, out, out=out)
    out *= u
    return mx.array(out)


def _host_ok(gate: Any, up: Any) -> bool:
    return isinstance(gate, mx.array) and isinstance(up, mx.array) and gate.dtype == mx.float32 \
        and up.dtype == mx.float32 and gate.shape == up.shape


def _routed(original: Callable) -> Callable:
    def swiglu(gate: mx.array, up: mx.array) -> mx.array:
        if _is_active() and not _off.on and _host_ok(gate, up):
            try:
                return host_swiglu(gate, up)
            except ValueError:  # inside a function transformation (mx.compile, vmap): no eval there
                pass
        return original(gate, up)

    swiglu._original = original  # type: ignore[attr-defined]
    return swiglu


def _verify(original: Callable) -> str | None:
    """None when numpy's result is MLX's own within MAX_ULPS on every element (special
    values where MLX has them), else why not."""
    key = mx.random.key(11)
    gate = mx.concatenate([mx.random.uniform(-100, 100, (4096,), key=key),
                           mx.random.normal((4096,), key=mx.random.key(12)) * 4,
                           mx.array([0.0, -0.0, 88.0, -88.0, 89.0, -89.0, 1e-30, -1e-30, np.inf, -np.inf, np.nan])])
    up = mx.random.normal(gate.shape, key=mx.random.key(13))
    gate, up = gate.reshape(1, -1, 1), up.reshape(1, -1, 1)
    want = np.asarray(original(gate, up)).reshape(-1)
    got = np.asarray(host_swiglu(gate, up)).reshape(-1)
    if not np.array_equal(np.isnan(got), np.isnan(want)) or not np.array_equal(np.isinf(got), np.isinf(want)):
        return "numpy's swiglu puts NaN or infinities where MLX's does not"
    fin = np.isfinite(want)
    # ulps of |want|; below TINY (silu of gate < -80: exp's overflow edge, where MLX flushes
    # to zero and numpy keeps a subnormal) an absolute TINY: no model reads such a value
    scale = np.maximum(np.abs(want[fin]), TINY)
    worst = float((np.abs(got[fin] - want[fin]) / (scale * np.finfo(np.float32).eps)).max())
    if not worst <= MAX_ULPS:
        return f"numpy's swiglu differs from MLX's by {worst:.1f} ulps (allowed {MAX_ULPS})"
    return None


def install(modules: list[Any], quantized_kv: bool = False) -> dict[str, Any]:
    """Route `swiglu` in the given model modules (attention.model_modules). Returns
    /health's account: the modules routed and the reasons for anything left."""
    report: dict[str, Any] = {"routed": [], "left": []}
    from mlx_lm.models import activations

    # only mlx-lm's own function (a model file's namesake may mean another thing), and only
    # where model files imported it: activations itself keeps its definition
    own = getattr(activations.swiglu, "_original", activations.swiglu)
    targets = [m for m in modules if m is not activations and
               getattr(getattr(m, "swiglu", None), "_original", getattr(m, "swiglu", None)) is own]
    if not targets:
        report["left"].append("the model's classes call no mlx-lm swiglu")
        return report
    if quantized_kv:
        # As for engine/kv/row_gemv.py: a key or value a few ulps off lands in another 4-bit
        # step often enough to matter: measured (tests/test_kv_quant.py, qwen3_5 at K4/V4), 7 of
        # 28 batched rows then differed from mlx-lm's once-quantized reference beyond float
        # noise, against at most 3 with MLX's swiglu. This runner's forwards hold the numpy
        # path off (ModelRunner); the modules stay as other runners in the process left them.
        report["left"].append("quantized KV cache: MLX's swiglu kept (see engine/kv/host_swiglu.py)")
        return report
    for m in targets:  # a model served before in this process may have routed them
        m.swiglu = own
    if (os.environ.get(ENV) or "").strip().lower() in ("off", "0", "false", "no"):
        report["left"].append(f"{ENV}=off")
        return report
    if mx.default_device() != mx.cpu:
        report["left"].append("not on the CPU: MLX's kernels are fused there")
        return report
    why = _verify(own)
    if why is not None:
        report["left"].append(why)
        return report
    routed = _routed(own)
    for m in targets:
        m.swiglu = routed
        report["routed"].append(m.__name__.rsplit(".", 1)[-1])
    return report

