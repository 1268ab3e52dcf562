"""engine/kv/fast_ops.py: the table RoPE and the compiled RMSNorm are bit-identical to the
modules they stand in for, are taken only inside the engine's forwards, and cut the
decode graph of the default model."""

from __future__ import annotations

import io
import re

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.models.rope_utils import Llama3RoPE

from jumpahead.engine.kv import fast_ops, host_swiglu, row_gemv

pytestmark = pytest.mark.skipif(mx.default_device() != mx.cpu, reason="the substitutions are CPU-only")

LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192, "rope_type": "llama3"}


class Holder(nn.Module):
    def __init__(self, rope=None, norm=None) -> None:
        super().__init__()
        if rope is not None:
            self.rope = rope
        if norm is not None:
            self.norm = norm


def _labels(y: mx.array) -> list[str]:
    s = io.StringIO()
    mx.export_to_dot(s, y)
    return re.findall(r'label ="([A-Za-z]+)', s.getvalue())


ROPES = [
    lambda: nn.RoPE(64, base=10000),
    lambda: nn.RoPE(32, traditional=True, base=500000),
    lambda: nn.RoPE(16, base=10000, scale=0.25),
    lambda: Llama3RoPE(64, max_position_embeddings=131072, base=500000, scaling_config=LLAMA3),
]


@pytest.mark.parametrize("make", ROPES, ids=["plain", "traditional", "scaled", "llama3"])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=["f32", "bf16"])
def test_table_rope_equals_the_module(make, dtype) -> None:
    module = make()
    holder = Holder(rope=module)
    report = fast_ops.install(holder, dtype)
    assert report["rope_modules"] == 1, report
    fast = holder.rope
    assert isinstance(fast, fast_ops.TableRope)
    key = mx.random.key(11)
    tail = 8  # partial rotary: the head is wider than the rotated dims
    # widths of decode, verify and prefill rounds; starts past the first table (growth)
    for batch, start, width in [(1, 0, 1), (1, 123, 1), (4, 9000, 1), (2, 17, 6), (1, 5000, 64), (3, 70000, 2)]:
        x = mx.random.normal((batch, 3, width, module.dims + tail), key=key).astype(dtype)
        starts = [start + 37 * b for b in range(batch)]
        cases = [(fast_ops.RowStart(start), start)]
        offsets = mx.array(starts, dtype=mx.int32)
        cases.append((fast_ops.mark(offsets, max(starts) + width), offsets))
        for ours, theirs in cases:
            with fast_ops.active():
                got = fast(x, offset=ours)
            want = module(x, offset=theirs)
            assert got.dtype == want.dtype and got.shape == want.shape
            assert mx.array_equal(got, want).item(), (batch, start, width)
    assert fast.table.size >= 70000 + 2  # grew to the positions asked for


def test_rope_outside_the_engines_forwards_runs_the_module() -> None:
    module = nn.RoPE(64, base=10000)
    holder = Holder(rope=module)
    fast_ops.install(holder, mx.float32)
    x = mx.random.normal((1, 3, 1, 64))
    # mlx-lm's own generation over the same model object: a plain int offset, not active
    assert "Cos" in _labels(holder.rope(x, offset=5))
    # active, but an offset that is not the engine's: the module too
    with fast_ops.active():
        assert "Cos" in _labels(holder.rope(x, offset=5))
        assert "Cos" not in _labels(holder.rope(x, offset=fast_ops.RowStart(5)))


def test_stand_ins_pass_attributes_to_their_modules() -> None:
    """Code that reads or sets a norm's weight or a RoPE's dims (a drafter copying the
    target's final norm) reaches the module itself."""
    norm, rope = nn.RMSNorm(8), nn.RoPE(16)
    holder = Holder(rope=rope, norm=norm)
    fast_ops.install(holder, mx.float32)
    assert isinstance(holder.norm, fast_ops.FastRMSNorm) and isinstance(holder.rope, fast_ops.TableRope)
    assert holder.norm.weight is norm.weight and holder.norm.eps == norm.eps and holder.rope.dims == 16
    holder.norm.weight = mx.full((8,), 2.0)
    assert norm.weight is holder.norm.weight  # set on the module, which the stand-in runs
    x = mx.random.normal((1, 2, 8))
    with fast_ops.active():
        assert mx.array_equal(holder.norm(x), norm(x)).item()


def test_rope_verification_refuses_a_table_of_another_rotation() -> None:
    a, b = nn.RoPE(64, base=10000), nn.RoPE(64, base=500000)
    table = fast_ops.RopeTable(b, 64, False, mx.float32)
    why = fast_ops._verify_rope(fast_ops.TableRope(a, table), a, mx.float32)
    assert why is not None and "differs" in why


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16], ids=["f32", "bf16", "f16"])
def test_compiled_rms_norm_equals_the_module(dtype) -> None:
    module = nn.RMSNorm(576, eps=1e-5)
    module.weight = mx.random.normal((576,), key=mx.random.key(2)).astype(dtype)
    holder = Holder(norm=module)
    report = fast_ops.install(holder, dtype)
    assert report["rms_norm_modules"] == 1, report
    for shape in [(1, 1, 576), (4, 1, 576), (2, 33, 576), (1, 512, 576)]:
        x = (mx.random.normal(shape, key=mx.random.key(sum(shape))) * 7).astype(dtype)
        with fast_ops.active():
            got = holder.norm(x)
        assert mx.array_equal(got, module(x)).item(), shape
    assert len(_labels(module(x))) > 2 * len(_labels_active(holder.norm, x))  # 11 nodes vs 4


def _labels_active(fn, x) -> list[str]:
    with fast_ops.active():
        return _labels(fn(x))


def test_default_model_decode_graph_is_cut(engine) -> None:
    """The engine's decode step of the default model: no RoPE frequencies recomputed
    (no Cos/Sin nodes) and under 60% of the nodes of the same step through mlx-lm's own
    cache and the original modules (~4,070 vs ~2,200 with MLX 0.32)."""
    runner = engine.runner
    assert runner.describe()["fast_ops"]["rope_modules"] == runner.n_layers
    prompt = list(range(1, 120))
    cache = runner.new_cache()
    cache.ends = [0]
    runner.forward([prompt], cache, None)
    mx.eval(cache.arrays())
    cache.advance([len(prompt)])
    # the whole step as one graph (sgemv and numpy's swiglu evaluate inside it)
    with row_gemv.suspended(), host_swiglu.suspended():
        ours = _labels(mx.argmax(runner.forward([[5]], cache)[:, -1, :], axis=-1))
    theirs_cache = make_prompt_cache(runner.model)
    mx.eval(runner.model(mx.array([prompt]), cache=theirs_cache))
    theirs = _labels(mx.argmax(runner.model(mx.array([[5]]), cache=theirs_cache)[:, -1, :], axis=-1))
    assert "Cos" not in ours and "Sin" not in ours
    assert "Cos" in theirs
    assert len(ours) < 0.6 * len(theirs), (len(ours), len(theirs))
