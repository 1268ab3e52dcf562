"""The ragged verifying forward and the cost-aware width policy, on the real default model.

Oracle for the ragged forward: the same rows run padded to the widest row (mlx-lm's
own decoder layers over our RowKVCache) give the same logits at every real position,
and leave caches that give the same logits on the next forward. Float32 rounding may
differ where attention runs per row group; the bound below is far under the
near-tie tolerance the decoding oracles use (tests/oracle.py).
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from jumpahead.engine.kv import ragged
from jumpahead.engine.schedule.width_policy import Acceptance, WidthPolicy, expected_accepted, prior_rate

TOL = 1e-3  # logits are O(10); observed differences are 0 (one call) to ~3e-5 (per run)


def _prompts(lengths: list[int]) -> list[list[int]]:
    return [[(i * 7919 + b * 13) % 30000 + 100 for i in range(n)] for b, n in enumerate(lengths)]


def _group_cache(runner, prompts):
    cache = runner.new_cache()
    for p in prompts:
        one = runner.new_cache()
        one.ends = [0]
        runner.forward([p], one, None)
        one.advance([len(p)])
        mx.eval(one.arrays())
        cache.append_rows(one)
    return cache


@pytest.fixture(scope="module")
def runner(loaded_model):
    from jumpahead.engine.kv.model_runner import ModelRunner

    model, _, _ = loaded_model
    r = ModelRunner(model)
    assert r.ragged, "the default model (llama) must take the ragged path"
    return r


@pytest.mark.parametrize(
    "widths",
    [
        [9, 1, 9, 1],  # one attention call
        [17, 1, 1, 1],  # attention per run: a run of three width-1 rows
        [1, 1, 9, 1, 1, 1, 1, 1, 1, 1, 1, 1],  # per run, the wide row in the middle
        [2, 1, 2, 1, 2, 1, 2, 1],  # one padded attention call
        [1, 5, 1, 1, 3, 1, 1, 1, 1, 12],
        [5, 5, 1],  # one attention call, the narrow row last
    ],
)
def test_ragged_equals_padded(runner, widths):
    _check_ragged_equals_padded(runner, widths, vocab=30000)


def _check_ragged_equals_padded(runner, widths: list[int], vocab: int) -> None:
    # every case must really take the ragged path (below MIN_PADS both arms are padded)
    assert len(widths) * max(widths) - sum(widths) >= ragged.MIN_PADS
    prompts = [[t % vocab for t in p] for p in _prompts([60 + 7 * b for b in range(len(widths))])]
    rows = [[(b * 31 + i * 17) % (min(vocab, 20000) - 5) + 5 for i in range(w)] for b, w in enumerate(widths)]
    counts = [w if b % 2 == 0 else 1 for b, w in enumerate(widths)]  # all positions or the last
    caches, outs = [], []
    for use_ragged in (True, False):
        runner.ragged = use_ragged
        try:
            cache = _group_cache(runner, prompts)
            logits, offsets = runner.forward_ragged(rows, cache, counts)
            keep = [max(1, w - b % 3) for b, w in enumerate(widths)]  # roll some tokens back
            cache.advance(keep)
            nxt, _ = runner.forward_ragged([[7]] * len(widths), cache, [1] * len(widths))
            mx.eval(logits, nxt)
        finally:
            runner.ragged = True
        caches.append(cache)
        outs.append((logits, offsets, nxt))
    (a, oa, na), (b, ob, nb) = outs
    assert oa == ob
    assert a.shape == b.shape == (sum(counts), a.shape[-1])
    assert float(mx.abs(a - b).max()) < TOL
    assert float(mx.abs(na - nb).max()) < TOL
    assert caches[0].ends == caches[1].ends


TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
            rms_norm_eps=1e-5, vocab_size=256, num_key_value_heads=2)


def _tiny(model_type: str):
    """A randomly initialized small model of an mlx-lm class the ragged path re-states
    (qwen3: per-head q/k norms; qwen2: q/k/v biases; mistral: llama's block)."""
    import importlib

    # mlx-lm serves mistral checkpoints with its llama class (MODEL_REMAPPING)
    module = importlib.import_module(f"mlx_lm.models.{'llama' if model_type == 'mistral' else model_type}")
    extra = {"head_dim": 16, "max_position_embeddings": 4096, "tie_word_embeddings": True,
             "rope_theta": 10000.0} if model_type == "qwen3" else {}
    mx.random.seed(7)
    model = module.Model(module.ModelArgs(model_type=model_type, **TINY, **extra))
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("model_type", ["qwen3", "qwen2", "mistral"])
@pytest.mark.parametrize("widths", [[9, 1, 9, 1], [17, 1, 1, 1], [1, 5, 1, 1, 3, 1]])
def test_ragged_equals_padded_on_other_model_classes(model_type, widths):
    from jumpahead.engine.kv.model_runner import ModelRunner

    runner = ModelRunner(_tiny(model_type))
    assert runner.ragged, f"{model_type} must take the ragged path"
    _check_ragged_equals_padded(runner, widths, vocab=TINY["vocab_size"])


@pytest.mark.parametrize("use_ragged", [True, False])
def test_rounds_without_logits_skip_the_head_and_keep_the_cache(runner, use_ragged):
    prompts = _prompts([40, 55])
    rows = [[11, 12, 13, 15, 16], [14]]  # 4 padded slots: the ragged path when use_ragged
    assert 2 * 5 - 6 >= ragged.MIN_PADS
    outs = []
    runner.ragged = use_ragged
    try:
        for counts in ([0, 0], [5, 1]):
            cache = _group_cache(runner, prompts)
            logits, offsets = runner.forward_ragged(rows, cache, counts)
            assert (logits is None) == (counts == [0, 0])
            mx.eval(cache.arrays())
            cache.advance([5, 1])
            nxt, _ = runner.forward_ragged([[7], [7]], cache, [1, 1])
            outs.append(nxt)
    finally:
        runner.ragged = True
    assert float(mx.abs(outs[0] - outs[1]).max()) < TOL


def test_attention_runs_split_only_when_worth_it():
    assert ragged.RaggedLayout([3, 3, 3, 3]).runs is None  # nothing padded
    assert ragged.RaggedLayout([2, 1, 2, 1, 2, 1, 2, 1]).runs is None  # 4 pads < 7 more runs
    assert ragged.RaggedLayout([9, 1, 9, 1]).runs is None  # 16 pads < 3 more runs
    lay = ragged.RaggedLayout([17, 1, 1, 1])
    assert [(r.start, r.stop, r.width) for r in lay.runs] == [(0, 1, 17), (1, 4, 1)]
    lay = ragged.RaggedLayout([1, 1, 9, 1, 1, 1, 1, 1, 1, 1, 1, 1])
    assert [r.width for r in lay.runs] == [1, 9, 1]
    lay = ragged.RaggedLayout([9, 1, 9, 1])
    assert lay.T == 20 and lay.offsets == [0, 9, 10, 19]
    # pack and spread are inverse on real tokens
    assert [lay.spread.tolist()[i] for i in lay.pack.tolist()] == list(range(lay.T))


def test_width_policy_fits_cost_and_caps_by_acceptance():
    policy = WidthPolicy()
    assert policy.costs() == (policy.fixed, policy.per_token, policy.surcharge)  # nothing seen yet
    fixed, per_token, surcharge = 0.060, 0.005, 0.020
    for i in range(40):
        rows = 2 + i % 3  # plain rounds of 2..4 rows
        policy.observe_round(rows, 1, fixed + per_token * rows)
        tokens = 4 + (i * 7) % 21  # rounds with proposals: 4..24 tokens
        policy.observe_round(tokens, 9, fixed + surcharge + per_token * tokens)
    got = policy.costs()
    assert got == pytest.approx((fixed, per_token, surcharge), rel=1e-3)
    assert policy.rho == pytest.approx(per_token / fixed, rel=1e-3)
    # a likelier row carries more; a bigger batch raises the bar
    assert policy.cap(0.9, 16, 4) > policy.cap(0.6, 16, 4) >= policy.cap(0.3, 16, 4)
    assert policy.cap(0.6, 16, 1) >= policy.cap(0.6, 16, 8)
    assert policy.cap(0.2, 16, 8) == 0
    assert policy.cap(1.0, 16, 8) == 16
    # the cap keeps exactly the positions whose cumulative acceptance pays
    theta = policy.threshold(4)
    k = policy.cap(0.8, 16, 4)
    assert 0.8**k >= theta > 0.8 ** (k + 1)
    # a round pays for leaving width 1 only with enough expected tokens
    assert expected_accepted(1.0, 5) == 5 and expected_accepted(0.5, 2) == pytest.approx(0.75)
    share = policy.share(4)
    assert share == pytest.approx((fixed + 4 * per_token) / 4)
    assert not policy.round_pays(0.4 * share, 1)  # one short copy: 8 ms of value, 25 ms of cost
    assert policy.round_pays(4.0 * share, 6)
    # a token worth only a row's cost of the remaining rounds (throughput objective,
    # nothing waiting) is not worth verifying unless certain
    assert policy.cap(0.95, 16, 4, value=per_token) == 0
    assert policy.cap(1.0, 16, 4, value=per_token) == 16
    assert policy.cap(0.8, 16, 4, value=fixed + 4 * per_token) > policy.cap(0.8, 16, 4)


def test_acceptance_follows_the_row_and_recovers():
    acc = Acceptance(prior_rate=prior_rate(2))
    short = acc.rate
    assert prior_rate(8) > short
    for _ in range(5):
        acc.observe(4, 0)
    low = acc.rate
    assert low < short
    for _ in range(30):
        acc.forget()
    assert low < acc.rate <= short + 1e-9
    for _ in range(10):
        acc.observe(4, 4)
    assert acc.rate > 0.8
