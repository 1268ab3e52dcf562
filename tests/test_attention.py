"""engine/kv/attention.py: the CPU attention (numpy softmax) against MLX's own kernel.

Oracle: `mx.fast.scaled_dot_product_attention` on the same inputs, for every mask kind
our caches and mlx-lm hand it; and the default model's logits through our cache
(numpy softmax in every layer) against mlx-lm's own forward with its own cache. The
two exps differ in the last bits (numpy's is the more accurate), so outputs agree to
float32 rounding, not bitwise; decoding oracles allow such near-ties (tests/oracle.py).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from jumpahead.engine.kv import attention as att
from jumpahead.engine.kv import prefill_attention as pa
from jumpahead.engine.kv import host_work
from jumpahead.engine.machine import blas


def _inputs(B: int, Hq: int, Hkv: int, L: int, S: int, seed: int = 0):
    mx.random.seed(seed)
    q = mx.random.normal((B, Hq, L, 64))
    k = mx.random.normal((B, Hkv, S, 64))
    v = mx.random.normal((B, Hkv, S, 64))
    return q, k, v


def _row_mask(B: int, L: int, S: int) -> mx.array:
    """Per-row ends, as RowKVCache's explicit plan builds it: [B, 1, L, S] bool."""
    pos = mx.array([S - L - 3 * b for b in range(B)])[:, None] + mx.arange(L)[None, :]
    return (mx.arange(S)[None, None, :] <= pos[:, :, None])[:, None]


@pytest.mark.parametrize(
    "B,Hq,Hkv,L,S,mask",
    [
        (1, 9, 3, 1, 700, None),  # decoding one row
        (4, 9, 3, 9, 420, "rows"),  # a verifying round: per-row ends
        (1, 9, 3, 64, 300, "causal"),  # a prefill chunk after cached tokens
        (2, 9, 3, 5, 100, "additive"),
        (2, 4, 4, 3, 50, "rows"),  # no grouped heads
        (3, 8, 2, 1, 33, "rows"),  # four query heads per key head
    ],
)
def test_numpy_softmax_attention_equals_mlx_kernel(monkeypatch, B, Hq, Hkv, L, S, mask):
    monkeypatch.setattr(att, "NUMPY_MIN", 0)  # every case takes the numpy path
    q, k, v = _inputs(B, Hq, Hkv, L, S)
    if mask == "rows":
        m = _row_mask(B, L, S)
    elif mask == "additive":
        m = mx.random.normal((B, 1, L, S))
    else:
        m = mask
    got = att.attention(q, k, v, 0.125, m)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=m)
    assert got.shape == want.shape
    assert mx.abs(got - want).max().item() < 2e-5


@pytest.mark.parametrize(
    "B,Hq,Hkv,L,S",
    [
        (1, 9, 3, 512, 2048),  # a prefill chunk at 2k context, the default model's heads
        (1, 9, 3, 100, 100),  # a first chunk: the whole score tensor is the causal block
        (2, 8, 2, 70, 300),  # two rows (a padded verifying round of uniform rows)
        (1, 4, 4, 64, 90),  # no grouped heads
    ],
)
def test_per_head_path_is_bit_identical_to_the_batched_one(monkeypatch, B, Hq, Hkv, L, S):
    """The prefill path through MLX (2D matmuls per key head; where the blocked path
    does not serve) gives the very bits of the batched path, and both match MLX's kernel."""
    monkeypatch.setattr(att, "NUMPY_MIN", 0)
    q, k, v = _inputs(B, Hq, Hkv, L, S, seed=L)
    with pa.suspended():  # the blocked path held off on this thread
        monkeypatch.setattr(att, "PER_HEAD_MIN_ROWS", 10**9)
        batched = att.attention(q, k, v, 0.125, "causal")
        monkeypatch.setattr(att, "PER_HEAD_MIN_ROWS", 1)
        per_head = att._per_head(q, k, v, 0.125, True, Hq // Hkv)
        assert per_head is not None  # the path ran (its buffers were writable in place)
        got = att.attention(q, k, v, 0.125, "causal")
    assert mx.array_equal(per_head, batched).item() and mx.array_equal(got, batched).item()
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    assert mx.abs(got - want).max().item() < 2e-5


needs_blocked = pytest.mark.skipif(
    not (pa.bound_cblas() and blas.threads_settable()),
    reason="no bound BLAS whose threads can be set (the blocked prefill attention does not serve here)")


@needs_blocked
@pytest.mark.parametrize(
    "B,Hq,Hkv,L,S,causal",
    [
        (1, 9, 3, 512, 2048, True),  # a prefill chunk at 2k context, the default model's heads
        (1, 9, 3, 300, 300, True),  # a first chunk, not a multiple of the block
        (3, 8, 2, 70, 333, True),  # three uniform rows
        (1, 4, 1, 130, 1000, True),  # Gemma 3 270M's grouping: four query heads a key head
        (2, 4, 4, 64, 90, False),  # no mask, no grouped heads
    ],
)
def test_blocked_prefill_attention(monkeypatch, B, Hq, Hkv, L, S, causal):
    """The blocked path (engine/kv/prefill_attention.py) runs where a prefill chunk's
    attention goes, matches MLX's kernel to float32 rounding, gives each batched row the
    bits of the same row alone and the same bits on one thread as on several, over keys
    that are slices of a larger cache buffer, and leaves the BLAS's threads as it found them."""
    q, k, v = _inputs(B, Hq, Hkv, L, S, seed=L + S)
    k, v = (mx.concatenate([x, mx.zeros((B, Hkv, 40, 64))], axis=2)[:, :, :S] for x in (k, v))  # cache slices
    mask = "causal" if causal else None
    threads = blas.blas_info()["threads"]
    calls = []
    real = pa._run
    monkeypatch.setattr(pa, "_run", lambda *a: (calls.append(1), real(*a)))
    got = att.attention(q, k, v, 0.125, mask)
    assert calls, "the blocked path did not run"
    assert blas.blas_info()["threads"] == threads
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)
    assert mx.abs(got - want).max().item() < 2e-5
    with monkeypatch.context() as three:
        three.setattr(pa, "workers", lambda: 3)  # more threads than this machine's cores
        assert mx.array_equal(att.attention(q, k, v, 0.125, mask), got).item()
    with host_work.one_thread():
        assert pa.workers() == 1
        assert mx.array_equal(att.attention(q, k, v, 0.125, mask), got).item()
    for b in range(B):
        alone = att.attention(q[b : b + 1], k[b : b + 1], v[b : b + 1], 0.125, mask)
        assert mx.array_equal(alone, got[b : b + 1]).item(), f"row {b} alone differs from the batch"
    kept = np.array(got)
    att.attention(-q, k, v, 0.125, mask)  # the next call reuses the host scratch arrays
    assert np.array_equal(np.array(got), kept), "a result still shared the scratch array it was computed in"


@needs_blocked
def test_blocked_prefill_attention_skips_what_it_cannot_serve(monkeypatch):
    """Half precision and held-off calls take the MLX path; the blocked path's blocks see
    only the columns some row of theirs can see."""
    q, k, v = _inputs(1, 9, 3, 200, 500)
    assert pa.blocked_attention(q.astype(mx.float16), k.astype(mx.float16), v.astype(mx.float16), 0.125, True, 3) is None
    with pa.suspended():
        assert pa.blocked_attention(q, k, v, 0.125, True, 3) is None
    blocks = pa._blocks(1, 3, 3, 200, 500, True)
    assert len(blocks) == 3 * 3 * 2 and {(m, w) for *_, m, p0, w in blocks} == {(128, 428), (72, 500)}
    assert {w for *_, w in pa._blocks(1, 3, 3, 200, 500, False)} == {500}


@pytest.mark.parametrize(
    "B,Hq,Hkv,L,S,mask",
    [
        (1, 9, 3, 1, 700, None),  # one row decoding, the default model's heads
        (4, 9, 3, 1, 2048, "rows"),  # four rows at per-row ends
        (3, 4, 1, 1, 999, "rows"),  # four query rows per key head (Gemma 3 270M's grouping)
        (2, 8, 2, 1, 4097, "additive"),
    ],
)
def test_decode_scores_with_the_keys_left_are_the_same_bits(monkeypatch, B, Hq, Hkv, L, S, mask):
    """A decode step's scores as K @ Q^T (faster in OpenBLAS's sgemm) give the bits of
    Q @ K^T, a batched row the bits of the same row alone, and both match MLX's kernel."""
    monkeypatch.setattr(att, "NUMPY_MIN", 0)
    q, k, v = _inputs(B, Hq, Hkv, L, S, seed=S)
    k, v = (mx.concatenate([x, mx.zeros((B, Hkv, 50, 64))], axis=2)[:, :, :S] for x in (k, v))  # cache slices
    m = _row_mask(B, L, S) if mask == "rows" else mx.random.normal((B, 1, L, S)) if mask == "additive" else None
    assert (Hq // Hkv) * L <= att.KEYS_LEFT_MAX_ROWS and q.shape[-1] <= att.KEYS_LEFT_MAX_DIM  # the keys-left path
    got = att.attention(q, k, v, 0.125, m)
    with monkeypatch.context() as queries_left_only:
        queries_left_only.setattr(att, "KEYS_LEFT_MAX_ROWS", 0)
        queries_left = att.attention(q, k, v, 0.125, m)
    assert mx.array_equal(got, queries_left).item()
    for b in range(B):
        alone = att.attention(q[b : b + 1], k[b : b + 1], v[b : b + 1], 0.125, None if m is None else m[b : b + 1])
        assert mx.array_equal(alone, got[b : b + 1]).item(), f"row {b} alone differs from the batch"
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=m)
    assert mx.abs(got - want).max().item() < 2e-5


@pytest.mark.parametrize("shape", [(3, 1536, 2048), (1, 9, 7, 300), (5, 33)])
def test_softmax_split_over_threads_gives_the_same_bits(monkeypatch, shape):
    """Each row gets the same operations whichever thread takes it: the threaded softmax
    (large score tensors) is the one-thread softmax bit for bit, odd row counts too."""
    import numpy as np

    monkeypatch.setattr(att, "SPLIT_MIN", 0)
    monkeypatch.setattr(host_work, "_pools", {})  # this case's own: the assert below sees its split
    monkeypatch.setattr(host_work, "workers", lambda: 3)  # three threads even on a 2-core machine
    rng = np.random.default_rng(0)
    hosts = [(rng.standard_normal(shape) * 4).astype(np.float32) for _ in range(2)]
    hosts[0].reshape(-1)[:7] = -np.inf  # hidden positions, as the causal tail writes them
    want = [h.copy() for h in hosts]
    with host_work.one_thread():
        att.softmax_in_place(want)
    att.softmax_in_place(hosts)
    assert 3 in host_work._pools  # the split path ran
    for got, exp in zip(hosts, want):
        assert np.array_equal(got, exp)
    assert np.allclose(want[1].sum(axis=-1), 1, atol=1e-5)


def test_small_scores_keep_the_mlx_kernel(monkeypatch):
    q, k, v = _inputs(1, 9, 3, 1, 40)
    assert 9 * 40 < att.NUMPY_MIN
    assert mx.array_equal(
        att.attention(q, k, v, 0.125, None), mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125)
    )


def test_unknown_mask_string_is_refused(monkeypatch):
    monkeypatch.setattr(att, "NUMPY_MIN", 0)
    q, k, v = _inputs(1, 9, 3, 4, 64)
    with pytest.raises(ValueError, match="unsupported attention mask"):
        att.attention(q, k, v, 0.125, "sliding")


def test_model_routes_only_our_cache_through_it(loaded_model, monkeypatch):
    """After install, our RowKVCache layers use attention(); mlx-lm's own caches (its
    generate, the tests' references) still get mlx-lm's function; and the logits of a
    long prompt through our cache equal mlx-lm's own forward to float32 rounding."""
    from mlx_lm.models.cache import make_prompt_cache

    from jumpahead.engine.kv.model_runner import ModelRunner

    model, _, _ = loaded_model
    runner = ModelRunner(model)  # installs the routing
    calls = []
    real = att.attention

    def counting(*a, **kw):
        calls.append(a[0].shape)
        return real(*a, **kw)

    monkeypatch.setattr(att, "attention", counting)
    prompt = [(i * 7919) % 30000 + 100 for i in range(700)]

    want = model(mx.array([prompt]), cache=make_prompt_cache(model))[0, -1]
    mx.eval(want)
    assert calls == [], "mlx-lm's own cache must not be routed"

    cache = runner.new_cache()
    cache.ends = [0]
    runner.forward([prompt[:512]], cache, None)  # chunked as the scheduler prefills
    cache.advance([512])
    got = runner.forward([prompt[512:]], cache)[0, -1]
    mx.eval(got)
    assert len(calls) == 2 * runner.n_layers
    assert all(s[1] * s[2] * s[2] >= att.NUMPY_MIN for s in calls)  # numpy path (S >= L)
    assert mx.abs(got - want).max().item() < 1e-3  # logits are O(10)
    assert mx.argmax(got).item() == mx.argmax(want).item()
