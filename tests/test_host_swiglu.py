"""engine/kv/host_swiglu.py: mlx-lm's swiglu through numpy inside the engine's forwards,
and engine/memory.py's buffer cache sized for a forward's transients.

The oracle is ordinary decoding with MLX's own swiglu: the same greedy tokens, or a
divergence proved a near-tie (the two exps differ by a few ulps: tests/oracle.py).
Outside the engine's forwards mlx-lm's own function runs, bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import activations, gemma3_text, llama

from jumpahead.bench.load import memory_report
from jumpahead.engine.kv import fast_ops, host_swiglu
from jumpahead.engine.kv.attention import model_modules
from jumpahead.engine.kv.model_runner import ModelRunner
from jumpahead.engine.model.loader import load_model

from .oracle import assert_same_or_near_tie
from .test_row_gemv import _greedy

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _routed_again_after(monkeypatch):
    """These tests route and unroute mlx-lm's llama module, which the session's default
    engine also runs: it is routed again after each, as that engine's load left it."""
    yield
    monkeypatch.undo()
    host_swiglu.install([llama])


def test_tiny_model_decodes_as_with_mlx_swiglu(tiny_model_dir, monkeypatch) -> None:
    model, _, _ = load_model(str(tiny_model_dir), progress=lambda s: None)
    monkeypatch.setenv(host_swiglu.ENV, "off")
    plain = ModelRunner(model)
    assert not plain.describe()["swiglu"]["routed"] and llama.swiglu is activations.swiglu
    prompt = [3, 17, 250, 9, 41, 7, 1000, 5]
    want = _greedy(plain, prompt, 24)

    monkeypatch.delenv(host_swiglu.ENV)
    runner = ModelRunner(model)
    report = runner.describe()["swiglu"]
    assert report["routed"] == ["llama"] and not report["left"], report
    assert llama.swiglu is not activations.swiglu and llama.swiglu._original is activations.swiglu
    got = _greedy(runner, prompt, 24)
    assert_same_or_near_tie(model, prompt, got, want)

    # outside the engine's forwards (mlx-lm's own generation): mlx-lm's bits
    gate, up = mx.random.normal((2, 5, 64)) * 4, mx.random.normal((2, 5, 64))
    assert mx.array_equal(llama.swiglu(gate, up), activations.swiglu(gate, up)).item()
    with fast_ops.active():
        inside = llama.swiglu(gate, up)
        with host_swiglu.suspended():
            assert mx.array_equal(llama.swiglu(gate, up), activations.swiglu(gate, up)).item()
        # bfloat16 stays with MLX (numpy has no bfloat16)
        g16, u16 = gate.astype(mx.bfloat16), up.astype(mx.bfloat16)
        assert mx.array_equal(llama.swiglu(g16, u16), activations.swiglu(g16, u16)).item()
    assert mx.array_equal(inside, host_swiglu.host_swiglu(gate, up)).item()
    assert not mx.array_equal(inside, activations.swiglu(gate, up)).item()  # numpy's, not MLX's
    assert mx.allclose(inside, activations.swiglu(gate, up), rtol=1e-5, atol=1e-30).item()

    monkeypatch.setenv(host_swiglu.ENV, "off")  # a runner made again over the model restores it
    ModelRunner(model)
    assert llama.swiglu is activations.swiglu


def test_a_row_gets_the_same_bits_alone_and_batched() -> None:
    """Elementwise: a row's result does not depend on the rows beside it (sgemm's does);
    and a result is its own copy, not the scratch array the next call reuses."""
    gate, up = mx.random.normal((4, 7, 96)) * 3, mx.random.normal((4, 7, 96))
    batched = host_swiglu.host_swiglu(gate, up)
    kept = np.array(batched)
    for b in range(4):
        alone = host_swiglu.host_swiglu(gate[b : b + 1, -1:], up[b : b + 1, -1:])
        assert mx.array_equal(alone, batched[b : b + 1, -1:]).item()
    assert np.array_equal(np.array(batched), kept)


def test_verification_refuses_a_result_off_by_more_than_the_allowed_ulps(monkeypatch) -> None:
    assert host_swiglu._verify(activations.swiglu) is None
    exact = host_swiglu.host_swiglu
    # a kernel 1e-5 off (84 ulps): still "close", and refused
    monkeypatch.setattr(host_swiglu, "host_swiglu", lambda g, u: exact(g, u) * (1 + 1e-5))
    why = host_swiglu._verify(activations.swiglu)
    assert why is not None and "ulps" in why, why
    # NaN where MLX has a number
    monkeypatch.setattr(host_swiglu, "host_swiglu", lambda g, u: mx.where(g > 50, mx.array(np.nan), exact(g, u)))
    why = host_swiglu._verify(activations.swiglu)
    assert why is not None and "NaN" in why, why
    report = host_swiglu.install([llama])
    assert not report["routed"] and report["left"] and llama.swiglu is activations.swiglu, report


def test_a_model_without_mlx_lms_swiglu_is_left_with_the_reason() -> None:
    """gemma3_text's MLP is GELU: nothing of it is routed, and the report says why."""
    report = host_swiglu.install([gemma3_text])
    assert report["routed"] == [] and report["left"] == ["the model's classes call no mlx-lm swiglu"], report


def test_activations_keeps_its_definition() -> None:
    """A model whose classes live in mlx_lm.models.activations (its SwiGLU modules) lists
    that module among its own: the model files that imported swiglu are routed, the
    definition stays, so files imported later bind mlx-lm's function."""
    original = activations.swiglu
    report = host_swiglu.install([activations, llama])
    assert report["routed"] == ["llama"] and activations.swiglu is original, report
    assert llama.swiglu._original is original


def test_default_model_routes_its_swiglu(engine) -> None:
    report = engine.runner.describe()["swiglu"]
    assert report["routed"] == ["llama"], report
    assert [m.__name__ for m in model_modules(engine.model) if m.__name__.endswith("llama")]


def _limit_in_new_process(env: dict[str, str]) -> tuple[dict, str]:
    """The buffer-cache limit a fresh process sets (it is sized once per process)."""
    code = ("import jumpahead.engine, json, mlx.core as mx\n"
            "from jumpahead.engine import memory\n"
            "limit = memory.size_buffer_cache()\n"
            "print(json.dumps({'limit': limit, 'mlx': mx.set_cache_limit(0),"
            " 'default': memory.MLX_DEFAULT_CACHE[:1],"
            " 'ram': __import__('os').sysconf('SC_PAGE_SIZE') * __import__('os').sysconf('SC_PHYS_PAGES')}))\n")
    full = {k: v for k, v in os.environ.items() if k != memory_env()}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def memory_env() -> str:
    from jumpahead.engine import memory

    return memory.CACHE_ENV


def test_buffer_cache_sized_from_ram_or_as_asked() -> None:
    got, _ = _limit_in_new_process({})
    assert got["limit"] == min(1 << 30, got["ram"] // 16) and got["mlx"] == got["limit"], got
    assert got["default"] and got["default"][0] < got["limit"]  # MLX's own was smaller
    got, _ = _limit_in_new_process({memory_env(): "64"})
    assert got["limit"] == got["mlx"] == 64 << 20, got
    got, _ = _limit_in_new_process({memory_env(): "0"})
    assert got["limit"] == 0 and got["default"] == [], got  # MLX's default kept
    got, err = _limit_in_new_process({memory_env(): "lots"})
    assert got["limit"] == min(1 << 30, got["ram"] // 16) and "lots" in err, err


def test_rss_allowance_counts_the_buffer_cache_once() -> None:
    """`bench load`'s RSS bound: what the buffer cache may still grow by is allowed, once;
    a process that holds more than that is still caught."""
    mb = 1 << 20
    warm = {"rss_bytes": 1000 * mb, "mlx_cache_limit_bytes": 300 * mb, "mlx_cache_bytes": 100 * mb}
    budget, per_token, batch = 50 * mb, 1000.0, 2

    def report(peak_mb: float) -> dict:
        samples = [{"t": i, "rss": int(v * mb), "prefix_ram": 0} for i, v in enumerate([1000, peak_mb, 1010])]
        return memory_report(samples, warm, budget, per_token, batch)

    base = report(1000)
    rows_kv = base["rows_kv_allowance_mb"]
    assert base["mlx_buffer_cache_allowance_mb"] == 200.0  # 300 limit - 100 already in the warm RSS
    assert base["rss_allowed_mb"] == pytest.approx(1000 + 50 + rows_kv + 200, abs=0.2)
    assert report(1000 + 50 + rows_kv + 199)["rss_bounded"]
    assert not report(1000 + 50 + rows_kv + 201)["rss_bounded"]


def test_a_quantized_kv_cache_keeps_mlx_swiglu_in_its_own_forwards() -> None:
    """With K4/V4, a few ulps in a key or value land in another 4-bit step: measured, 7 of 28
    batched rows of qwen3_5 then left mlx-lm's once-quantized reference (tests/test_kv_quant.py),
    against at most 3 allowed. A quantized runner runs MLX's swiglu in its forwards and says
    so, while a full-precision runner over the same model file in the process keeps numpy's."""
    from jumpahead.engine.kv.kv_format import KVFormat

    model, _, _ = load_model(None, progress=lambda s: None)  # head dim 64: a group size fits
    full = ModelRunner(model)
    quantized = ModelRunner(model, KVFormat(4, 4))
    report = quantized.describe()["swiglu"]
    assert report["routed"] == [] and any("quantized KV" in why for why in report["left"]), report
    assert full.describe()["swiglu"]["routed"] == ["llama"]
    calls = []
    real = host_swiglu.host_swiglu

    def counted(g, u):
        calls.append(g.shape)
        return real(g, u)

    import unittest.mock

    with unittest.mock.patch.object(host_swiglu, "host_swiglu", counted):
        _greedy(quantized, [3, 17, 250, 9], 2)
        assert calls == []  # the quantized runner's forwards: MLX's swiglu
        _greedy(full, [3, 17, 250, 9], 2)
        assert calls  # the full-precision runner's: numpy's
