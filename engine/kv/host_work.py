"""Host-side (numpy) work inside a forward: worker threads for work split by rows (the
attention's softmax, the blocked prefill attention; numpy and the BLAS release the GIL
in their loops) and reused scratch arrays for results MLX copies out.

One pool for all of them, so that the cores are not oversubscribed. Each row gets the
same operations whichever thread takes it, so a split never changes a result's bits
(tests/test_attention.py).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .held import Held

THREADS_ENV = "JUMPAHEAD_SOFTMAX_THREADS"
_pools: dict[int, ThreadPoolExecutor] = {}  # by worker count
_one = Held()


def workers() -> int:
    """JUMPAHEAD_SOFTMAX_THREADS, else the cores this process may use, at most 4 (the
    passes are memory-bound beyond that); 1 under `one_thread`."""
    if _one.on:
        return 1
    raw = os.environ.get(THREADS_ENV, "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


def one_thread() -> Held:
    """Everything here on the calling thread alone while held (`bench roofline` times both)."""
    return _one


def pool(n: int) -> ThreadPoolExecutor:
    """The process's pool of n workers."""
    if n not in _pools:
        _pools[n] = ThreadPoolExecutor(max_workers=n, thread_name_prefix="jumpahead-rows")
    return _pools[n]


def row_blocks(a: np.ndarray, n: int) -> list[np.ndarray]:
    """Views of a's rows (all axes but the last) in n blocks; [a] where a reshape would copy."""
    if not a.flags.c_contiguous:
        return [a]
    rows = a.reshape(-1, a.shape[-1])  # a view of a's buffer
    step = -(-rows.shape[0] // n)
    return [rows[i : i + step] for i in range(0, rows.shape[0], step)]


_scratch = threading.local()
SCRATCH_MAX = 64 << 20  # a 30k-context prefill of the default model keeps ~60 MB in all


def scratch(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A float32 array of `shape` that this thread reuses under `name` (contents left over).

    For numpy work inside a forward whose result MLX copies out (`mx.array(a)`): with
    the fixed mmap threshold the engine sets (engine/memory.py), a fresh array of a few
    MB is a fresh mmap whose pages fault in and are zeroed on first write. Measured in the
    serving process: numpy's swiglu over a 512 x 1536 chunk 1.86 ms with a fresh output,
    0.61 ms with a reused one (BENCHMARKS.md, issue 42). Kept up to SCRATCH_MAX bytes a
    name (what a long context's rare large call asks is allocated anew: its page faults are
    small beside its arithmetic, and the memory goes back)."""
    held = getattr(_scratch, "arrays", None)
    if held is None:
        held = _scratch.arrays = {}
    n = 1
    for d in shape:
        n *= d
    if 4 * n > SCRATCH_MAX:
        return np.empty(shape, np.float32)
    buf = held.get(name)
    if buf is None or buf.size < n:
        buf = held[name] = np.empty(n, np.float32)
    return buf[:n].reshape(shape)
