"""engine/kv/row_gemv.py: one decode row's linears through the bound BLAS's sgemv.

The oracle is ordinary decoding through MLX's matmul: the same greedy tokens, or a
divergence proved a near-tie (sgemv sums in another order than sgemm: tests/oracle.py).
The stand-ins act only on one row inside the engine's forwards; everywhere else the
module's own result comes back bit for bit."""

from __future__ import annotations

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
import pytest

from jumpahead.engine.kv import fast_ops, row_gemv
from jumpahead.engine.kv.model_runner import ModelRunner
from jumpahead.engine.machine.cblas import bound_cblas
from jumpahead.engine.methods.drafter import input_embedding
from jumpahead.engine.model.loader import load_model

from .oracle import assert_same_or_near_tie

pytestmark = pytest.mark.skipif(bound_cblas() is None, reason="no optimized BLAS bound: no sgemv path to test")


def _greedy(runner: ModelRunner, prompt: list[int], n: int) -> list[int]:
    cache = runner.new_cache()
    cache.ends = [0]
    logits = runner.forward([prompt], cache)
    cache.advance([len(prompt)])
    out = []
    for _ in range(n):
        tok = int(mx.argmax(logits[0, -1]).item())
        out.append(tok)
        logits = runner.forward([[tok]], cache)
        cache.advance([1])
    return out


def _linears(model: nn.Module) -> list[nn.Module]:
    return [m for _, m in model.named_modules() if type(m) is nn.Linear]


def test_tiny_model_decodes_as_through_matmul(tiny_model_dir, monkeypatch) -> None:
    model, _, _ = load_model(str(tiny_model_dir), progress=lambda s: None)
    monkeypatch.setenv(row_gemv.ENV, "off")
    plain = ModelRunner(model)
    assert not plain.describe()["row_gemv"]["installed"]
    prompt = [3, 17, 250, 9, 41, 7, 1000, 5]
    want = _greedy(plain, prompt, 24)

    monkeypatch.setenv(row_gemv.ENV, "on")
    runner = ModelRunner(model)
    report = runner.describe()["row_gemv"]
    tied = runner.head is not None and not isinstance(runner.head, (nn.Module, row_gemv.GemvLinear))
    assert report["installed"] and report["modules"] == len(_linears(model)) + (1 if tied else 0), report
    q = model.model.layers[0].self_attn.q_proj
    assert isinstance(q, row_gemv.GemvLinear)  # what the layer calls now
    if tied:
        assert isinstance(runner.head.__self__, row_gemv.GemvEmbedding)
    got = _greedy(runner, prompt, 24)
    assert_same_or_near_tie(model, prompt, got, want)
    # mlx-lm's own forward over the same model object runs the modules themselves
    x = mx.random.normal((1, 1, q.weight.shape[1]))
    assert mx.array_equal(q(x), q.original(x)).item()

    monkeypatch.setenv(row_gemv.ENV, "off")  # a runner made again over the model takes them out
    again = ModelRunner(model)
    assert not again.describe()["row_gemv"]["installed"]
    assert type(model.model.layers[0].self_attn.q_proj) is nn.Linear


def test_default_model_is_served_with_its_verdict(engine) -> None:
    """The default model (float32, tied head): installed where measured faster here, or
    the measurement that kept it out, in /health's layers.row_gemv."""
    # Other tests make runners over the session's model object, and each runner takes the
    # stand-ins out and puts them back per its own load-time timing: the verdict checked is
    # that of a runner made here, against the model as that runner left it.
    runner = ModelRunner(engine.model)
    report = runner.describe()["row_gemv"]
    assert isinstance(report["installed"], bool)
    if report["installed"]:
        assert report["modules"] == 211  # 30 layers x 7 linears + the tied head
        assert report["gemv_ms"] * row_gemv.MIN_GAIN <= report["matmul_ms"]
        assert isinstance(runner.head.__self__, row_gemv.GemvEmbedding)
        assert isinstance(engine.model.model.embed_tokens, row_gemv.GemvEmbedding)
    else:
        assert report["left"], report
        assert type(engine.model.model.embed_tokens) is nn.Embedding
    # what ties a drafter to its target finds the embedding module behind a stand-in
    assert type(input_embedding(engine.model)) is nn.Embedding


class _Holder(nn.Module):
    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.proj = nn.Linear(96, 40, bias=bias)


@pytest.mark.parametrize("bias", [False, True])
def test_one_row_only_inside_the_engines_forwards(bias: bool, monkeypatch) -> None:
    monkeypatch.setenv(row_gemv.ENV, "on")
    holder = _Holder(bias)
    if bias:
        holder.proj.bias = mx.random.normal((40,)) * 3
    report, _ = row_gemv.install(holder)
    assert report["installed"] and report["modules"] == 1, report
    fast, original = holder.proj, holder.proj.original
    one = mx.random.normal((1, 1, 96))
    many = mx.random.normal((3, 2, 96))
    # outside the engine's forwards, and for more than one row: the module's own bits
    assert mx.array_equal(fast(one), original(one)).item()
    with fast_ops.active():
        assert mx.array_equal(fast(many), original(many)).item()
        got = fast(one)
        with row_gemv.suspended():
            assert mx.array_equal(fast(one), original(one)).item()
    want = original(one)
    bound = 2 * 96 * row_gemv.U * (mx.abs(one.reshape(1, 96)) @ mx.abs(original.weight).T).reshape(want.shape)
    assert (mx.abs(got - want) <= bound + 1e-30).all().item()
    # weights replaced after install: the stand-in no longer reads the old buffer
    original.weight = original.weight * 2
    with fast_ops.active():
        assert mx.array_equal(fast(one), original(one)).item()


def test_verification_refuses_a_result_outside_the_float32_bound() -> None:
    """The load-time check compares sgemv with MLX's matmul against the rigorous float32
    bound of any summation order: a kernel that drops one of the 256 terms of each sum
    (an off-by-one in K, 0.4% of the sum's magnitude) is refused."""
    linear = nn.Linear(256, 64, bias=False)
    cb = bound_cblas()
    right = row_gemv.GemvLinear(linear, row_gemv.RowWeights(cb, linear.weight, None))
    assert row_gemv._within_bound(right, linear, 256, linear.weight) is None
    faulty = nn.Linear(256, 64, bias=False)  # answers as a kernel that skips the last term would
    faulty.weight = mx.concatenate([linear.weight[:, :-1], mx.zeros((64, 1))], axis=1)
    wrong = row_gemv.GemvLinear(faulty, row_gemv.RowWeights(cb, faulty.weight, None))
    why = row_gemv._within_bound(wrong, linear, 256, linear.weight)
    assert why is not None and "float32 bound" in why


def test_not_installed_for_weights_sgemv_cannot_read(monkeypatch) -> None:
    monkeypatch.setenv(row_gemv.ENV, "on")
    holder = _Holder(False)
    holder.proj.weight = holder.proj.weight.astype(mx.bfloat16)
    report, _ = row_gemv.install(holder)
    assert not report["installed"] and any("bfloat16" in why for why in report["left"]), report
    assert type(holder.proj) is nn.Linear


def test_not_installed_over_a_quantized_kv_cache(monkeypatch) -> None:
    """With K8/V4 the default model's rows batched differed from the rows alone beyond
    the load-time check's tolerance once one row went through sgemv (last-bit differences
    land in other 4-bit steps), which cost batching and verified proposals: a quantized
    cache keeps MLX's matmul, and says so."""
    from jumpahead.engine.kv.kv_format import KVFormat

    model, _, _ = load_model(None, progress=lambda s: None)  # its own object: the session engine's keeps its path
    monkeypatch.setenv(row_gemv.ENV, "on")
    runner = ModelRunner(model, KVFormat(8, 4))
    report = runner.describe()["row_gemv"]
    assert not report["installed"] and any("quantized KV" in why for why in report["left"]), report
    assert type(model.model.layers[0].self_attn.q_proj) is nn.Linear
    assert runner.serving.verifies and runner.serving.padded, runner.serving.reasons
