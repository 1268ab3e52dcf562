"""A prefill chunk's attention in cache-sized blocks of query rows, outside MLX's graph.

Measured on a 2-core EPYC (BENCHMARKS.md, issue 42): a 512-token chunk at 2k context
spent ~26 ms a layer in attention through MLX's matmuls and a numpy softmax
(engine/kv/attention.py `_per_head`), half of the chunk, against ~12 ms of sgemm
arithmetic. Two things in it were not arithmetic: each layer's 38 MB of scores went
through memory five times (matmul out, max, exp, sum, divide), and the causal half
of the last L x L block was computed, exponentiated and multiplied by the values
only to be masked to zero.

Here each block of `BLOCK` query rows of one key head runs start to end while its
scores stay in the core's cache: one `cblas_sgemm` for its scores over only the
columns some row of the block can see (the bound BLAS MLX itself calls;
engine/machine/cblas.py), the causal triangle of that block set to -inf, the same
numpy softmax's max and exp (attention.py `_softmax_rows`), one `cblas_sgemm` by the
values with a column of ones joined (so their weighted sums and the weights' totals
come out together), the sums divided by the totals. The blocks are split over the
cores, the BLAS on one thread each while they run (engine/machine/blas.py
`one_thread_each`). MLX has no fused CPU
attention to call instead (mx.fast.scaled_dot_product_attention composes the same
ops on the CPU), and its graph cannot express "only these columns for these rows"
without a slice and a copy per block.

Each query row's arithmetic depends only on the chunk's width, its position and the
keys it sees, never on the batch, the thread or the order of the blocks: a batched
row equals the same row alone, bit for bit (tests/test_attention.py). Against the
full-width path the sums cover fewer (masked, zero) terms, so results agree to
float32 rounding, not bitwise.

Serves float32 q/k/v on the CPU with a bound BLAS whose threads can be set; anything
else returns None and the caller takes its own path.
"""

from __future__ import annotations

import functools
import itertools
from concurrent.futures import wait
from typing import Iterator

import mlx.core as mx
import numpy as np

from ..machine import blas
from ..machine.cblas import NoTrans, RowMajor, Trans, bound_cblas
from . import host_work
from .held import Held

# Query rows per block: 128 rows x 2048 keys is 1 MB of scores, one core's L2 here.
# Measured at 2k context, one layer (9 query / 3 key heads, 512-token chunk), two
# threads: 64 rows 21.9-22.5 ms, 128 19.8-20.4, 256 19.3-20.1, MLX's path 26-43 (noisy
# host); 128 keeps the scores in L2 at 2k and in L3 to ~16k keys.
BLOCK = 128

_off = Held()


def suspended() -> Held:
    """MLX's composed path while held, on this thread (`bench roofline` times a chunk both ways)."""
    return _off


@functools.lru_cache(maxsize=8)
def _hidden(L: int) -> np.ndarray:
    """[L, L] True above the diagonal: the chunk's own keys a causal query does not see."""
    return np.triu(np.ones((L, L), dtype=bool), 1)


def _blocks(B: int, Hkv: int, rep: int, L: int, S: int, causal: bool) -> list[tuple[int, int, int, int, int, int]]:
    """(b, h, first query row, rows, first position, visible columns) of every block; a
    block holds positions of one query head (rows r*L + p of its key head's rep*L)."""
    out = []
    for b in range(B):
        for h in range(Hkv):
            for r in range(rep):
                for p0 in range(0, L, BLOCK):
                    m = min(BLOCK, L - p0)
                    out.append((b, h, r * L + p0, m, p0, S - L + p0 + m if causal else S))
    return out


def _run(jobs: list, taken: Iterator[int], q: np.ndarray, k: np.ndarray, v1: np.ndarray, out: np.ndarray,
         L: int, S: int, causal: bool, hidden: np.ndarray | None) -> None:
    """Run blocks from `jobs` until none is left, each taken once from the shared counter
    (a worker on a core the host slows takes fewer)."""
    cb = bound_cblas()
    D, Dv = q.shape[-1], v1.shape[-1] - 1
    for i in taken:
        if i >= len(jobs):
            return
        b, h, row, m, p0, w = jobs[i]
        s = host_work.scratch("attention_scores", (m, w))  # this worker's own, in its cache
        qh, kh, vh = q[b, h, row:], k[b, h], v1[b, h]
        cb.gemm(RowMajor, NoTrans, Trans, m, w, D, 1.0, qh.ctypes.data, D, kh.ctypes.data, D, 0.0, s.ctypes.data, w)
        if causal:  # position p0 + i sees columns <= S - L + p0 + i; the block's last sees all w
            np.copyto(s[:, S - L + p0 :], -np.inf, where=hidden[p0 : p0 + m, p0 : p0 + m])
        np.subtract(s, s.max(axis=1, keepdims=True), out=s)
        np.exp(s, out=s)
        # the values carry a column of ones: one sgemm gives each row's weighted sum and its
        # total, and the m x Dv sums are divided instead of the m x w weights (two passes
        # over the scores fewer than attention.py's `_softmax_rows`)
        o = host_work.scratch("attention_sums", (m, Dv + 1))
        cb.gemm(RowMajor, NoTrans, NoTrans, m, Dv + 1, w, 1.0, s.ctypes.data, w, vh.ctypes.data, Dv + 1, 0.0,
                o.ctypes.data, Dv + 1)
        np.divide(o[:, :Dv], o[:, Dv:], out=out[b, h, row : row + m])


def _with_ones(v: np.ndarray) -> np.ndarray:
    """[..., S, Dv] -> [..., S, Dv + 1], the last column ones."""
    v1 = host_work.scratch("attention_values", (*v.shape[:-1], v.shape[-1] + 1))
    v1[..., :-1] = v
    v1[..., -1] = 1.0
    return v1


def _host(x: mx.array) -> np.ndarray:
    """x (evaluated, float32) as a numpy array whose last two axes are row-major."""
    a = np.asarray(x)
    if a.strides[-1] != 4 or a.strides[-2] != 4 * a.shape[-1]:
        a = np.ascontiguousarray(a)
    return a


def workers() -> int:
    """Threads for the blocks: the BLAS's own thread count (what the user set for matmuls),
    at most engine/kv/host_work.py's (1 under its `one_thread`)."""
    return max(1, min(blas.blas_info().get("threads") or 1, host_work.workers()))


def serves() -> bool:
    """Whether this process can take the blocked path (a bound BLAS whose threads can be set)."""
    return mx.default_device() == mx.cpu and bound_cblas() is not None and blas.threads_settable()


def blocked_attention(q: mx.array, k: mx.array, v: mx.array, scale: float, causal: bool, rep: int) -> mx.array | None:
    """softmax(q k^T * scale [+ causal mask]) v for uniform rows (each row's L queries at
    its last L positions of S), q [B, Hq, L, D], k/v [B, Hkv, S, D]; None where this
    does not serve (module docstring)."""
    if _off.on or not serves():
        return None
    if not (q.dtype == k.dtype == v.dtype == mx.float32):
        return None
    B, Hq, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    if causal and S < L:
        return None
    qs = mx.contiguous((q * scale).reshape(B, Hkv, rep * L, D))
    mx.eval(qs, k, v)
    qn, kn, vn = _host(qs), _host(k), _with_ones(np.asarray(v))
    out = host_work.scratch("attention_out", (B, Hkv, rep * L, v.shape[-1]))  # mx.array copies it out
    hidden = _hidden(L) if causal else None
    jobs = sorted(_blocks(B, Hkv, rep, L, S, causal), key=lambda j: -j[3] * j[5])  # largest first
    taken = itertools.count()  # next() is atomic under the GIL: each block runs once
    args = (jobs, taken, qn, kn, vn, out, L, S, causal, hidden)
    n = min(workers(), len(jobs))
    # every sgemm on one BLAS thread, however many workers: a threaded sgemm may split its
    # sums otherwise, and a row's bits would depend on the thread count
    with blas.one_thread_each():
        if n <= 1:
            _run(*args)
        else:
            futures = [host_work.pool(n).submit(_run, *args) for _ in range(n)]
            wait(futures)  # every block done before the threads are restored, even if one raised
            for f in futures:
                f.result()
    return mx.array(out).reshape(B, Hq, L, v.shape[-1])
