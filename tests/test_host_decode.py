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


def _greedy_rows(runner: ModelRunner, prompts: list[list[int]], n: int, host: bool) -> tuple[list[list[int]], list[mx.array]]:
    """Rows of different lengths in one group, decoded together n steps."""
    cache = host_decode._group(runner, prompts)
    logits = mx.stack([runner.fresh_logits(p) for p in prompts])[:, None, :]
    out: list[list[int]] = [[] for _ in prompts]
    steps = []
    for _ in range(n):
        toks = mx.argmax(logits[:, -1], axis=-1).tolist()
        for row, t in zip(out, toks):
            row.append(t)
        logits = runner.forward([[t] for t in toks], cache, host=host)
        mx.eval(logits)
        steps.append(logits)
        cache.advance([1] * len(prompts))
    return out, steps


def test_tiny_model_rows_decode_as_through_mlx(tiny_model_dir, monkeypatch) -> None:
    """Several rows at their own positions in one host step (the columns past a shorter
    row's end masked): each row's greedy tokens as MLX's batched step gives them, logits
    within float noise at every step, and each row as the same row decoded alone."""
    model, _, _ = load_model(str(tiny_model_dir), progress=lambda s: None)
    monkeypatch.setenv(host_decode.ENV, "on")
    runner = ModelRunner(model)
    report = runner.describe()["host_decode"]
    assert report["installed"] and report["max_rows"] == host_decode.ROWS, report
    prompts = [[3, 17, 250, 9, 41, 7, 1000, 5, 12, 99], [44, 8, 301], [5, 6, 7, 8, 9, 10], [77] * 5]
    want, want_logits = _greedy_rows(runner, prompts, 12, host=False)
    # each linear through one sgemm of the rows, and through sgemv a row (install picks by shape)
    for per_row in (set(), set(runner.host.weights_by_shape())):
        runner.host.per_row = per_row
        steps_before = runner.host.steps
        got, got_logits = _greedy_rows(runner, prompts, 12, host=True)
        assert runner.host.steps - steps_before == 12  # every step was the host's, all rows in one
        for b, prompt in enumerate(prompts):
            assert_same_or_near_tie(model, prompt, got[b], want[b])
            alone, _, _ = _greedy(runner, prompt, 12, host=True)  # a row in the batch equals the row alone
            assert_same_or_near_tie(model, prompt, got[b], alone)
        same = min(next((i for i, (a, c) in enumerate(zip(g, w)) if a != c), len(g)) for g, w in zip(got, want))
        for a, b in zip(got_logits[:same], want_logits[:same]):
            assert a.shape == b.shape == (len(prompts), 1, model.args.vocab_size)
            assert mx.abs(a - b).max().item() <= 1e-4 * mx.abs(b).max().item()


def test_rows_calibration_times_every_weight_shape(tiny_model_dir, monkeypatch) -> None:
    """Which way rows read each weight shape is measured on the model's own weights: every
    shape timed both ways, the faster one chosen."""
    model, _, _ = load_model(str(tiny_model_dir), progress=lambda s: None)
    monkeypatch.setenv(host_decode.ENV, "on")
    decoder = ModelRunner(model).host
    report = decoder.calibrate(host_decode.ROWS)
    shapes = decoder.weights_by_shape()
    assert set(report) == {f"{n}x{k}" for n, k in shapes}
    for (n, k) in shapes:
        times = report[f"{n}x{k}"]
        chosen = "sgemv" if (n, k) in decoder.per_row else "sgemm"
        other = "sgemm" if chosen == "sgemv" else "sgemv"
        assert times["chosen"] == chosen and 0 < times[chosen] <= times[other], times


def test_the_served_path_takes_the_host_step(tiny_model_dir, monkeypatch) -> None:
    """The scheduler's decode rounds (one row, and rows together) reach the host step, as
    served: not only a direct call of the runner."""
    import asyncio

    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.types import GenerationRequest

    monkeypatch.setenv(host_decode.ENV, "on")
    engine = Engine.load(str(tiny_model_dir), EngineConfig(prefix_cache=False), progress=lambda s: None)
    try:
        host = engine.runner.host
        assert host is not None, engine.runner.describe()["host_decode"]

        async def run(prompts: list[list[int]]) -> list[list[int]]:
            async def one(p: list[int]) -> list[int]:
                out = []
                async for chunk in engine.stream(GenerationRequest(prompt=p, max_tokens=32, stop_token_ids=[])):
                    out += chunk.tokens
                return out
            return await asyncio.gather(*[one(p) for p in prompts])

        before = host.steps
        (alone,) = asyncio.run(run([[3, 17, 250, 9]]))
        assert host.steps - before >= len(alone) - 1 > 0, "a served row's decode steps did not reach the host step"
        before, rows_before = host.steps, host.row_steps
        rows = asyncio.run(run([[3, 17, 250, 9], [5, 6, 7], [8, 9, 10, 11, 12]]))
        assert host.steps - before >= max(len(r) for r in rows) - 2 > 0
        assert host.row_steps > rows_before, "rows decoded together missed the host step"
    finally:
        engine.close()


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


def test_rows_that_compute_wrong_are_left_to_mlx(tiny_model_dir, monkeypatch) -> None:
    """The rows' step is verified apart from one row's: rows computed wrong (here a norm
    that does not normalize) leave rows to MLX's step with the measured difference, while
    one row keeps the host step."""
    model, _, _ = load_model(str(tiny_model_dir), progress=lambda s: None)
    monkeypatch.setenv(host_decode.ENV, "on")
    monkeypatch.setattr(host_decode, "_rms_rows", lambda x, w, eps: x * w)
    runner = ModelRunner(model)
    report = runner.describe()["host_decode"]
    assert report["installed"] and report["max_rows"] == 1, report
    assert "from MLX's" in report["rows_left"] and report["rows_left"].startswith(f"{host_decode.ROWS} row(s)"), report
