"""engine/kv/host_decode.py: one decode row of a Llama-shaped model outside MLX's graph.

The oracle is the engine's own step through MLX: the same greedy tokens, or a divergence
proved a near-tie (numpy and sgemv sum in other orders: tests/oracle.py), logits within
float noise at every step, and the cache the host step writes equal to the one MLX's
step writes. What the step cannot run is refused at load, with the reason."""

from __future__ import annotations

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
import pytest

from jumpahead.engine.kv import host_decode
from jumpahead.engine.kv.model_runner import ModelRunner
from jumpahead.engine.machine.cblas import bound_cblas
from jumpahead.engine.model.loader import load_model

from .oracle import assert_same_or_near_tie

pytestmark = pytest.mark.skipif(bound_cblas() is None, reason="no optimized BLAS bound: no sgemv to run the step")


def _greedy(runner: ModelRunner, prompt: list[int], n: int, host: bool) -> tuple[list[int], list[mx.array], object]:
    cache = runner.new_cache()
    cache.ends = [0]
    logits = runner.forward([prompt], cache)
    cache.advance([len(prompt)])
    out, steps = [], []
    for _ in range(n):
        tok = int(mx.argmax(logits[0, -1]).item())
        out.append(tok)
        logits = runner.forward([[tok]], cache, host=host)
        mx.eval(logits)
        steps.append(logits)
        cache.advance([1])
    return out, steps, cache


def test_tiny_model_decodes_as_through_mlx(tiny_model_dir, monkeypatch) -> None:
    model, _, _ = load_model(str(tiny_model_dir), progress=lambda s: None)
    monkeypatch.setenv(host_decode.ENV, "on")  # verified, not timed: the tiny model's step is all overhead
    runner = ModelRunner(model)
    report = runner.describe()["host_decode"]
    assert report["installed"] and runner.host is not None, report
    prompt = [3, 17, 250, 9, 41, 7, 1000, 5]
    want, want_logits, want_cache = _greedy(runner, prompt, 20, host=False)
    got, got_logits, got_cache = _greedy(runner, prompt, 20, host=True)
    assert_same_or_near_tie(model, prompt, got, want)
    same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(got))
    for a, b in zip(got_logits[:same], want_logits[:same]):  # over the same inputs: float noise apart
        assert a.shape == b.shape == (1, 1, model.args.vocab_size)
        assert mx.abs(a - b).max().item() <= 1e-4 * mx.abs(b).max().item()
    # the keys and values the host step wrote are the cache's own, where MLX's step writes them
    end = len(prompt) + same
    for lh, lm in zip(got_cache.layers, want_cache.layers):
        for h, m in ((lh.keys, lm.keys), (lh.values, lm.values)):
            assert mx.abs(h[..., :end, :] - m[..., :end, :]).max().item() <= 1e-4 * (mx.abs(m).max().item() + 1e-6)


def test_default_model_is_served_with_its_verdict(engine, monkeypatch) -> None:
    """The default model: verified here, installed where measured faster, the reason in
    /health's layers.host_decode otherwise; greedy decoding through the served runner
    equals MLX's step (or a proved near-tie)."""
    runner = ModelRunner(engine.model)
    report = runner.describe()["host_decode"]
    if report["installed"]:
        assert report["host_ms"] * host_decode.MIN_GAIN <= report["mlx_ms"], report
    else:
        assert "measured" in report["left"], report  # the default model is Llama-shaped: only timing keeps it out
    if runner.host is None:  # the step itself, verified but not timed
        monkeypatch.setenv(host_decode.ENV, "on")
        runner.host_decode, runner.host = host_decode.install(runner)
        assert runner.host is not None, runner.host_decode
    prompt = [1, 504, 3458, 28, 2683, 314, 253, 5356, 30, 198]
    want, _, _ = _greedy(runner, prompt, 16, host=False)
    got, _, _ = _greedy(runner, prompt, 16, host=True)
    assert_same_or_near_tie(engine.model, prompt, got, want)


def test_a_wrong_activation_is_refused_at_load(tiny_model_dir, monkeypatch) -> None:
    """Verified by running, not by the modules' names: an MLP that computes gelu where the
    step computes silu has the same parts and is refused with the measured difference."""
    model, _, _ = load_model(str(tiny_model_dir), progress=lambda s: None)
    mlp = model.model.layers[1].mlp
    monkeypatch.setattr(type(mlp), "__call__", lambda self, x: self.down_proj(nn.gelu(self.gate_proj(x)) * self.up_proj(x)))
    monkeypatch.setenv(host_decode.ENV, "on")
    report = ModelRunner(model).describe()["host_decode"]
    assert not report["installed"] and "from MLX's" in report["left"], report


def test_refused_where_the_shape_is_not_llamas(tiny_model_dir, monkeypatch) -> None:
    model, _, _ = load_model(str(tiny_model_dir), progress=lambda s: None)
    monkeypatch.setenv(host_decode.ENV, "on")
    model.model.layers[0].self_attn.q_proj = nn.Linear(*reversed(model.model.layers[0].self_attn.q_proj.weight.shape),
                                                       bias=True)
    report = ModelRunner(model).describe()["host_decode"]
    assert not report["installed"] and "bias" in report["left"], report


def test_off_keeps_mlxs_step(tiny_model_dir, monkeypatch) -> None:
    model, _, _ = load_model(str(tiny_model_dir), progress=lambda s: None)
    monkeypatch.setenv(host_decode.ENV, "off")
    runner = ModelRunner(model)
    assert runner.host is None and runner.describe()["host_decode"]["left"] == f"{host_decode.ENV}=off"
