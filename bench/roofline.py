"""`jumpahead bench roofline`: where every millisecond of a decoded token goes, against
this machine's own limits measured in the same process (issue 42).

Part 1, the machine (`machine`), measured now, best of `--repeats`:

- `stream`: how fast this CPU reads memory. Every array read is float32, larger than
  any cache (`--stream-mb`, default 288 MB) and read once per repeat:
  `numpy_sgemv_one_matrix_gb_s` is `np.dot(A, v)` over one [N, 576] matrix and
  `numpy_sgemv_matrices_gb_s` over `--matrices` distinct [1536, 576] matrices (the
  decode shape of the default model's MLP), through numpy's own OpenBLAS;
  `bound_cblas_sgemv_gb_s` is `cblas_sgemv` of the BLAS MLX is bound to (ctypes), over
  the same matrices. A matrix-vector product does 2 FLOP per 4-byte element read, so
  it is bound by the reads. `numpy_sum_gb_s` (`A.sum()`) is reported beside them but
  is NOT the floor: numpy's pairwise summation does enough work per element to be
  compute-bound (issue 42 saw ~12 GB/s against ~19 for sgemv on this CPU).
  `stream_read_gb_s`, the floor used below, is the fastest of the sgemv reads: any
  rate observed is one this machine attains. numpy's BLAS runs with as many threads as
  the bound one (`numpy_blas_threads`, `blas.threads`: `JUMPAHEAD_BLAS_THREADS`, else
  every core), so the floor is for the threads the engine has.
- `blas`: the BLAS MLX uses (`mx.matmul` on the CPU calls `cblas_sgemm` of the library
  engine/machine/blas.py bound). `mlx_sgemm_prefill_gflop_s`: [512, 576] x [576, 1536], a
  prefill chunk's shape, compute-bound. `mlx_decode_read_gb_s[mM]`: the effective
  read rate of `x @ W.T`, x [M, 576], over the same distinct weight matrices (the
  decode shape, M = rows), and `cblas_sgemm_read_gb_s[mM]` the same call straight to
  cblas_sgemm (no MLX in between). With OpenBLAS, sgemm at M=1 packs the weights
  first and reads them at about half the sgemv rate or less: that gap is the headroom
  a gemv path would win on decode.
- `dispatch`: MLX's cost per graph node, from a chain of 1000 tiny elementwise adds
  (best of at least 10): `build_us_per_node` (Python building the lazy graph) and
  `eval_us_per_node` (evaluating it at once: the scheduling and kernel launch of a
  node with nothing to compute).

Part 2, the model (`runs`, one per rows B x context), through the engine's own
ModelRunner on a cache filled to that context by 512-token prefill chunks; one decode
step is one forward of one token per row (B tokens). Medians over `--steps` steps, run
in 8 rounds interleaved with the graph, the weights and the attention alone (below), so
that load from elsewhere on the machine hits every part alike; the parts are still
timed apart, so on a busy machine `other_ops_and_dispatch_ms` (what is left) carries
their noise and can come out below zero:

- `step.total_ms` = `forward_ms` (Python returns the lazy logits) + `eval_ms`. Where
  the attention scores are large, engine/kv/attention.py takes numpy's softmax and
  evaluates each layer's scores inside the forward (`attention_path: numpy`), so
  `forward_ms` then contains most of the compute. `graph_build_ms` is Python building
  the whole token's graph alone: the same step with the MLX attention path (no
  evaluation inside the forward: MLX's matmul for one row and MLX's swiglu too), timed to the return of
  the lazy logits.
  `sampler_ms`: `mx.argmax` over the [B, V] logits and `.tolist()`, after them.
- `row_gemv` (B=1, where engine/kv/row_gemv.py is installed): the same decode steps with
  its sgemv path held off, interleaved with the timed ones: `matmul_step_ms` beside
  `step_ms` (both with the sampler) and `speedup`.
- `nodes`: the MLX graph of one token (the build above, `mx.export_to_dot`): node count
  and the top primitives.
- `split`: `weights_ms` = every `nn.Linear`/`QuantizedLinear` of the model and the
  vocabulary head, each on a random [B, 1, in] input, as the engine's forwards run them
  (one graph through MLX's matmul; at one row, where engine/kv/row_gemv.py installed its
  sgemv path, one synchronized sgemv call each: `weights_path`): the floor with this BLAS (these layers' parameter bytes are what a token reads,
  `weight_bytes`, at `weights_read_gb_s`; `weights_by_shape` times each shape's layers
  alone, the vocabulary head among them); `attention_ms` = engine/kv/attention.py's
  `attention` at this context with the model's head counts, one call per attention
  layer (sliding layers at their window), evaluated together; `graph_build_ms` as
  above; `other_ops_and_dispatch_ms` = total - weights - attention - build: norms,
  RoPE, activations, cache writes, residuals, and the per-node cost of every op,
  estimated beside it as node count x `eval_us_per_node` (`dispatch_estimate_ms`).
- `floors`: `bandwidth_floor_ms` = (weight bytes + KV bytes this step reads) / the
  stream read rate: no implementation on this machine decodes faster;
  `blas_floor_ms` = weight bytes / the bound BLAS's sgemm read rate at M=B plus the KV
  bytes at the stream rate: the floor with MLX's matmul as it is; `gemv_floor_ms`
  (B=1) with the bound BLAS's sgemv instead. `fraction_of_*` = floor / total (1.0: at
  the limit).
- `prefill`: the last 512-token chunk of the fill (B rows, ending at the context):
  tokens/s and `sgemm_floor_ms` = (2 x `prefill_linear_params` x tokens + the attention
  matmuls' FLOPs over the keys each query can see: the cached ones and the chunk's own
  up to itself, not the masked half of the chunk's block) / `mlx_sgemm_prefill_gflop_s`,
  with the fraction of that limit reached. The head is among the prefill parameters
  only where the runner cannot split it off. `chunk_ms` is the median of three timings
  (the fill's own and the chunk rolled back and run twice more, full-attention models);
  `sgemm_gflop_s_after_each` is the prefill-shape sgemm rate measured right after each,
  and `fraction_of_sgemm_limit_paired` the median of each timing against the rate of its
  own moment (this host's speed moves by 10-20% within a run).
  `host_paths` (B=1, full-attention models): that chunk rolled back and run again, in
  rounds interleaved, each arm timed after an untimed run of its own: as the engine runs
  it (`chunk_ms`), and with numpy's swiglu held off, MLX's own 32 MiB buffer cache, the
  row-split work on one thread and the blocked attention held off (`held_off_chunk_ms`;
  engine/kv/host_swiglu.py, engine/memory.py, engine/kv/host_work.py,
  engine/kv/prefill_attention.py), with each one's fraction of the sgemm limit and the
  `speedup`.

Part 3 (`served`): tokens/s of `engine.stream` (the scheduler, what users see) at B=1
on a short chat prompt, counted as `jumpahead bench decode` counts, beside the split's
B=1 rate at the smallest context, 1000 / (total + sampler).

`jumpahead bench roofline [--model PATH] [--rows 1,4] [--contexts 512,2048] [--steps 24]`
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import io
import math
import os
import re
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import jumpahead.engine  # noqa: F401  (binds the optimized BLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from jumpahead.engine.kv import attention as attention_mod
from jumpahead.engine import memory
from jumpahead.engine.kv import fast_ops, host_swiglu, host_work, prefill_attention, row_gemv
from jumpahead.engine.machine import blas
from jumpahead.engine.machine.cblas import bound_cblas
from jumpahead.engine.kv.cache_layout import CHUNKED, FULL, LIST, SLIDING

CHUNK = 512  # the scheduler's prefill chunk (EngineConfig.prefill_chunk)
DIM, OUT = 576, 1536  # the default model's hidden and MLP widths: the decode GEMV shape
CHAIN = 1000  # nodes in the dispatch chain
ROUNDS = 8  # interleaved rounds per run: decode steps, then each part alone
GB = 1e9

_progress: Callable[[str], None] = lambda s: print(f"roofline: {s}", file=sys.stderr, flush=True)  # noqa: E731


def _best(fn: Callable[[], Any], repeats: int) -> float:
    """Seconds: the fastest of `repeats` calls after one warm-up call."""
    fn()
    best = math.inf
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, nd)


# --- the BLAS libraries, straight through ctypes ------------------------------------------

def _numpy_blas_lib() -> str | None:
    """Path of the OpenBLAS numpy's own BLAS calls go to (from this process's maps)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line}
    except OSError:
        return None
    ours = [p for p in paths if "numpy" in p or "scipy_openblas" in p]
    return sorted(ours)[0] if ours else None


def numpy_blas_threads(threads: int | None) -> int | None:
    """Set numpy's OpenBLAS to `threads` (as many as the bound BLAS); the count set, or None."""
    path = _numpy_blas_lib()
    if path is None or not threads:
        return None
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
                 "openblas_set_num_threads"):
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes = [ctypes.c_int]
            fn(int(threads))
            return int(threads)
    return None


# --- part 1: the machine --------------------------------------------------------------------

def stream_and_blas(repeats: int, stream_mb: int, matrices: int, ms: list[int]) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    threads = blas.blas_info().get("threads")
    np_threads = numpy_blas_threads(threads)
    out: dict[str, Any] = {"stream": {}, "blas": {}}
    s = out["stream"]
    s["numpy_blas_threads"] = np_threads
    s["bytes_mb"] = stream_mb

    _progress(f"stream read: one [N, {DIM}] float32 matrix of {stream_mb} MB")
    n = max(1, int(stream_mb * 1e6 / (DIM * 4)))
    a = rng.random((n, DIM), dtype=np.float32)
    v = rng.random(DIM, dtype=np.float32)
    s["numpy_sgemv_one_matrix_gb_s"] = _r(a.nbytes / _best(lambda: np.dot(a, v), repeats) / GB, 2)
    s["numpy_sum_gb_s"] = _r(a.nbytes / _best(lambda: a.sum(), repeats) / GB, 2)
    del a
    gc.collect()

    _progress(f"stream read: {matrices} distinct [{OUT}, {DIM}] matrices")
    mats = [rng.random((OUT, DIM), dtype=np.float32) for _ in range(matrices)]
    total = sum(w.nbytes for w in mats)
    s["matrices"] = matrices
    s["matrices_mb"] = _r(total / 1e6, 1)
    s["numpy_sgemv_matrices_gb_s"] = _r(total / _best(lambda: [np.dot(w, v) for w in mats], repeats) / GB, 2)

    cb = bound_cblas()
    b = out["blas"]
    b["library"] = blas.blas_info().get("library")
    b["threads"] = threads
    if cb is not None:
        y = np.empty(OUT, dtype=np.float32)
        s["bound_cblas_sgemv_gb_s"] = _r(total / _best(lambda: [cb.sgemv(w, v, y) for w in mats], repeats) / GB, 2)
        b["cblas_sgemv_read_gb_s"] = s["bound_cblas_sgemv_gb_s"]
        b["cblas_sgemm_read_gb_s"] = {}
        for m in ms:
            xm = rng.random((m, DIM), dtype=np.float32)
            ym = np.empty((m, OUT), dtype=np.float32)
            t = _best(lambda: [cb.sgemm_xwt(xm, w, ym) for w in mats], repeats)
            b["cblas_sgemm_read_gb_s"][f"m{m}"] = _r(total / t / GB, 2)
    else:
        s["bound_cblas_sgemv_gb_s"] = None
        b["cblas_sgemv_read_gb_s"] = None
        b["cblas_sgemm_read_gb_s"] = None
    reads = {k: s.get(k) for k in ("numpy_sgemv_one_matrix_gb_s", "numpy_sgemv_matrices_gb_s",
                                   "bound_cblas_sgemv_gb_s")}
    source, rate = max(((k, x) for k, x in reads.items() if x), key=lambda kv: kv[1])
    s["stream_read_gb_s"] = rate
    s["stream_read_source"] = source
    s["why"] = ("the floor is the fastest matrix-vector read observed (2 FLOP per 4 bytes read: bound by the "
                "reads, and any rate observed is attainable); numpy .sum() is reported beside it, not taken: its "
                "pairwise summation can be compute-bound and read slower than memory allows")

    _progress("BLAS through MLX: decode-shape reads and a prefill-shape sgemm")
    ws = [mx.array(w) for w in mats]
    mx.eval(ws)
    del mats
    gc.collect()
    b["mlx_decode_read_gb_s"] = {}
    for m in ms:
        x = mx.random.normal((m, DIM))
        mx.eval(x)
        t = _best(lambda: mx.eval([x @ w.T for w in ws]), repeats)
        b["mlx_decode_read_gb_s"][f"m{m}"] = _r(total / t / GB, 2)
    b["prefill_shape"] = [CHUNK, DIM, OUT]
    b["mlx_sgemm_prefill_gflop_s"] = _r(sgemm_rate(repeats, ws[:8]), 1)
    del ws
    gc.collect()
    return out


def sgemm_rate(repeats: int, ws: list[mx.array] | None = None) -> float:
    """GFLOP/s of MLX's matmul at the prefill shape [CHUNK, DIM] x [DIM, OUT] (8 weights),
    best of `repeats`."""
    ws = ws if ws is not None else [mx.random.normal((OUT, DIM)) for _ in range(8)]
    xp = mx.random.normal((CHUNK, DIM))
    mx.eval(xp, ws)
    t = _best(lambda: mx.eval([xp @ w.T for w in ws]), repeats)
    return 2 * CHUNK * DIM * OUT * len(ws) / t / 1e9


def dispatch(repeats: int) -> dict[str, Any]:
    _progress(f"dispatch: a chain of {CHAIN} tiny adds")
    x = mx.zeros((16,))
    one = mx.ones((16,))  # same shape: one Add node per link, no Broadcast
    mx.eval(x, one)
    builds, evals = [], []
    nodes = 0
    for i in range(max(10, repeats) + 1):  # a chain evaluates in ~3 ms: cheap to repeat
        t0 = time.perf_counter()
        y = x
        for _ in range(CHAIN):
            y = y + one
        t1 = time.perf_counter()
        if i == 0:
            nodes = graph_nodes(y)[0]
        t2 = time.perf_counter()
        mx.eval(y)
        t3 = time.perf_counter()
        if i:
            builds.append(t1 - t0)
            evals.append(t3 - t2)
    nodes = nodes or CHAIN
    return {"chain_nodes": nodes, "build_us_per_node": _r(min(builds) / nodes * 1e6, 3),
            "eval_us_per_node": _r(min(evals) / nodes * 1e6, 3)}


# --- part 2: the model ----------------------------------------------------------------------

LABEL = re.compile(r'label ="([^"]*)"')


def graph_nodes(*arrays: mx.array) -> tuple[int, Counter]:
    """Primitive nodes in the lazy graph behind `arrays` and their count by primitive."""
    buf = io.StringIO()
    mx.export_to_dot(buf, *arrays)
    labels = LABEL.findall(buf.getvalue())
    return len(labels), Counter(labels)


def _nbytes(module: nn.Module) -> int:
    return sum(v.nbytes for _, v in tree_flatten(module.parameters()))


def _owner(f: Callable) -> nn.Module | None:
    if isinstance(f, (row_gemv.GemvLinear, row_gemv.GemvEmbedding)):
        return f.original
    owner = f if isinstance(f, nn.Module) else getattr(f, "__self__", None)
    return owner.original if isinstance(owner, row_gemv.GemvEmbedding) else owner


def _callable_bytes(f: Callable) -> int:
    owner = _owner(f)
    return _nbytes(owner) if isinstance(owner, nn.Module) else 0


def _shape_name(f: Callable, head: Any) -> str:
    """'out x in' of a linear layer; the vocabulary head 'head out x in'."""
    owner = _owner(f)
    w = getattr(owner, "weight", None)
    if w is None:
        return "other"
    return f"{'head ' if owner is _owner(head) else ''}{int(w.shape[0])}x{_in_dims(owner)}"


def _is_linear(m: Any) -> bool:
    """nn.Linear, nn.QuantizedLinear, or a replacement of theirs (a *Linear with a 2-D weight)."""
    if isinstance(m, (nn.Linear, nn.QuantizedLinear)):
        return True
    w = getattr(m, "weight", None) if isinstance(m, nn.Module) else None
    return type(m).__name__.endswith("Linear") and isinstance(w, mx.array) and w.ndim == 2


def _in_dims(layer: nn.Module) -> int:
    if hasattr(layer, "scales") and hasattr(layer, "group_size"):  # quantized: weight is packed
        return int(layer.scales.shape[-1] * layer.group_size)
    return int(layer.weight.shape[-1])


def _head(engine: Any) -> Callable | None:
    """The vocabulary projection: the runner's split head, else lm_head or the tied embedding."""
    runner = engine.runner
    head = runner.head if runner.head is not None else getattr(engine.model, "lm_head", None)
    if head is None and runner.trunk is not None and hasattr(runner.trunk.embed_tokens, "as_linear"):
        head = runner.trunk.embed_tokens.as_linear
    return head


@dataclass
class Linears:
    layers: list[tuple[Callable, int]]  # (callable, input width): every linear layer and the head
    weight_bytes: int  # their parameter bytes: what one decode step reads
    prefill_params: int  # linear parameters a prefill chunk multiplies every token by
    head_bytes: int


def _params(m: Any) -> int:
    return int(m.weight.size * (32 // int(getattr(m, "bits", 32) or 32)))


def linear_layers(engine: Any) -> Linears:
    """Every linear layer the model runs per token plus the vocabulary head. A prefill
    chunk skips the head where the runner splits it off (ModelRunner.forward)."""
    model, runner = engine.model, engine.runner
    found: list[tuple[Callable, int]] = []
    seen: set[int] = set()
    nbytes = 0
    served = row_gemv.stand_ins(model)  # where one row goes through sgemv: time that
    for _, m in model.named_modules():
        if _is_linear(m) and id(m) not in seen:
            seen.add(id(m))
            found.append((served.get(id(m), m), _in_dims(m)))
            nbytes += _nbytes(m)
    head = _head(engine)
    owner = _owner(head) if head is not None else None
    head_bytes = _nbytes(owner) if isinstance(owner, nn.Module) else 0
    prefill_params = sum(_params(_owner(m)) for m, _ in found if _owner(m) is not owner)
    if not runner.split and owner is not None and getattr(owner, "weight", None) is not None:
        prefill_params += _params(owner)
    if head is not None and id(owner) not in seen:
        found.append((head, _hidden(model)))
        nbytes += head_bytes
    return Linears(found, nbytes, prefill_params, head_bytes)


def _args(model: Any) -> Any:
    args = getattr(model, "args", None)
    text = getattr(args, "text_config", None)
    if isinstance(text, dict):
        return argparse.Namespace(**text)
    return text if text is not None and not hasattr(args, "num_attention_heads") else args


def _hidden(model: Any) -> int:
    return int(_args(model).hidden_size)


def head_shape(model: Any) -> tuple[int, int, int]:
    a = _args(model)
    hq = int(a.num_attention_heads)
    hkv = int(getattr(a, "num_key_value_heads", None) or hq)
    d = int(getattr(a, "head_dim", None) or a.hidden_size // hq)
    return hq, hkv, d


def attention_spans(layout: list, context: int) -> list[int]:
    """Keys each attention layer reads at this context (sliding/chunked: their window)."""
    spans = []
    for kind in layout:
        if kind.kind == LIST:
            spans += attention_spans(list(kind.children), context)
        elif kind.kind == FULL:
            spans.append(context)
        elif kind.kind in (SLIDING, CHUNKED):
            spans.append(min(context, int(kind.window or context)))
    return spans


def kv_bytes(runner: Any, rows: int, context: int) -> int:
    """KV bytes a decode step reads at this context (B rows): stored layers read every
    cached token, sliding ones their window (approximately: equal bytes per sliding layer)."""
    per = runner.kv_bytes_per_token * context
    windows = [k for k in _flat_kinds(runner.layout) if k.kind == SLIDING]
    if windows and runner.window_bytes:
        per_layer_token = runner.window_bytes / sum(int(k.window) for k in windows)
        per += sum(per_layer_token * min(context, int(k.window)) for k in windows)
    return int(rows * per)


def _flat_kinds(layout: list) -> list:
    out = []
    for k in layout:
        out += _flat_kinds(list(k.children)) if k.kind == LIST else [k]
    return out


def _visible(span: int, start: int, width: int) -> int:
    """Keys seen, summed over a chunk's queries at positions start..start+width-1, by a
    layer whose queries see at most `span` keys (a window; the context for full layers)."""
    return sum(min(span, start + i + 1) for i in range(width))


def _synthetic(n: int, vocab: int) -> list[int]:
    return [(i * 7919) % max(1, vocab - 200) + 100 for i in range(n)]


class _MlxAttention:
    """engine/kv/attention.py on MLX's own path (no evaluation inside the forward) while held."""

    def __enter__(self) -> None:
        self.saved = getattr(attention_mod, "NUMPY_MIN", None)
        if self.saved is not None:
            attention_mod.NUMPY_MIN = 1 << 62

    def __exit__(self, *exc: Any) -> None:
        if self.saved is not None:
            attention_mod.NUMPY_MIN = self.saved


def measure_run(engine: Any, rows: int, context: int, steps: int, machine: dict[str, Any],
                linears: Linears, vocab: int) -> dict[str, Any]:
    runner, model = engine.runner, engine.model
    layers, weight_bytes = linears.layers, linears.weight_bytes
    layer_bytes = [_callable_bytes(f) for f, _ in layers]
    head = _head(engine)
    hq, hkv, d = head_shape(model)
    spans = attention_spans(runner.layout, context)

    # fill the cache to the context in the scheduler's chunks; time the last chunk
    _progress(f"B={rows} context={context}: prefill")
    cache = runner.new_cache()
    cache.ends = [0] * rows
    prompt = _synthetic(context, vocab)
    chunk_s, chunk_start = 0.0, 0
    if context <= CHUNK:  # the only chunk is also the first of its shape: one throwaway first
        runner.forward([prompt] * rows, cache, None)
        mx.eval(cache.arrays())
    for s in range(0, context, CHUNK):
        chunk = prompt[s : s + CHUNK]
        t0 = time.perf_counter()
        runner.forward([chunk] * rows, cache, None)
        cache.advance([len(chunk)] * rows)
        mx.eval(cache.arrays())
        chunk_s, chunk_start = time.perf_counter() - t0, s
    width = context - chunk_start
    # one timing moves by 20% on this kind of host: the last chunk twice more, the median of
    # three; and the sgemm rate measured right after each, each timing against its own moment's
    chunk_samples, rates = [chunk_s], [sgemm_rate(3)]
    for _ in range(2 if _rerunnable(runner) else 0):
        chunk_samples.append(_rerun(runner, cache, prompt[chunk_start:], rows))
        rates.append(sgemm_rate(3))
    chunk_s = statistics.median(chunk_samples)
    held_off = _prefill_ab(runner, cache, prompt[chunk_start:], rows) if rows == 1 else None

    # Interleaved rounds, so that load from elsewhere on the machine hits every part
    # alike: decode steps as the engine runs them, then the graph alone, the weights
    # alone and the attention alone, once each per round.
    xs = [mx.random.normal((rows, 1, n)) for _, n in layers]
    q = mx.random.normal((rows, hq, 1, d))
    kvs = [(mx.random.normal((rows, hkv, s, d)), mx.random.normal((rows, hkv, s, d))) for s in spans]
    mx.eval(xs, q, kvs)
    scale = d ** -0.5
    tokens = [[5]] * rows
    rounds = max(1, min(ROUNDS, steps))
    per_round = math.ceil(steps / rounds)
    fwd, evl, smp, builds, weights, attn = [], [], [], [], [], []
    groups: dict[str, list[int]] = {}
    for i, (f, _) in enumerate(layers):
        groups.setdefault(_shape_name(f, head), []).append(i)
    group_times: dict[str, list[float]] = {name: [] for name in groups}
    nodes, by_primitive = 0, Counter()
    _progress(f"B={rows} context={context}: {rounds * per_round} decode steps in {rounds} rounds with the "
              "graph, the weights and the attention alone")

    ab = rows == 1 and bool(runner.row_gemv.get("installed"))  # sgemv against MLX's matmul, interleaved
    # the rows' step outside MLX's graph where it serves this many (engine/kv/host_decode.py)
    host = runner.host if runner.host is not None and rows <= runner.host.max_rows else None
    plain_steps: list[float] = []
    mlx_steps: list[float] = []  # MLX's step (with sgemv) where the host step serves
    whole_steps: list[float] = []  # forward + eval + sampler of each timed step, as plain_step times them
    host_timers: dict[str, float] = {}

    def plain_step(timed: bool) -> None:
        t0 = time.perf_counter()
        with row_gemv.suspended():
            step(False, served=False)
        if timed:
            plain_steps.append(time.perf_counter() - t0)

    def mlx_step(timed: bool) -> None:
        t0 = time.perf_counter()
        step(False, served=False)
        if timed:
            mlx_steps.append(time.perf_counter() - t0)

    def step(timed: bool, served: bool = True) -> None:
        nonlocal tokens
        if host is not None:
            host.timers = host_timers if timed else None
        t0 = time.perf_counter()
        logits = runner.forward(tokens, cache, host=served)
        t1 = time.perf_counter()
        mx.eval(logits)
        t2 = time.perf_counter()
        picked = mx.argmax(logits[:, -1, :], axis=-1).tolist()
        t3 = time.perf_counter()
        cache.advance([1] * rows)
        tokens = [[int(t)] for t in picked]
        if host is not None:
            host.timers = None
        if timed:
            fwd.append(t1 - t0)
            evl.append(t2 - t1)
            smp.append(t3 - t2)
            whole_steps.append(t3 - t0)

    def graph_alone(timed: bool) -> None:
        # the same step on MLX's attention path (no evaluation inside the forward),
        # evaluated untimed and not committed: the next forward rewrites the same slots
        nonlocal nodes, by_primitive
        with _MlxAttention(), row_gemv.suspended(), host_swiglu.suspended():
            t0 = time.perf_counter()
            logits = runner.forward(tokens, cache, host=False)
            t1 = time.perf_counter()
            if timed:
                builds.append(t1 - t0)
            else:
                nodes, by_primitive = graph_nodes(logits)
            mx.eval(logits, cache.arrays())

    def timed_eval(into: list[float] | None, fn: Callable[[], list]) -> None:
        t0 = time.perf_counter()
        with fast_ops.active():  # the linears as the engine's forwards run them (row_gemv)
            mx.eval(fn())
        if into is not None:
            into.append(time.perf_counter() - t0)

    def linears_alone() -> list:  # every linear layer and the head on [B, 1, in], one graph
        return [f(x) for (f, _), x in zip(layers, xs)]

    def attention_alone() -> list:  # one call per attention layer at its span, distinct K/V
        return [attention_mod.attention(q, k, v, scale, mask=None) for k, v in kvs]

    for r in range(rounds + 1):  # round 0 warms every part up, untimed
        for _ in range(per_round if r else 3):
            step(r > 0)
            if ab:
                plain_step(r > 0)
            if host is not None:
                mlx_step(r > 0)
        graph_alone(r > 0)
        timed_eval(weights if r else None, linears_alone)
        timed_eval(attn if r else None, attention_alone)
        for name, idx in groups.items():  # the weights by layer shape, each group its own graph
            timed_eval(group_times[name] if r else None, lambda: [layers[i][0](xs[i]) for i in idx])
    numpy_path = rows * hq * 1 * max(spans or [0]) >= getattr(attention_mod, "NUMPY_MIN", 1 << 62)
    forward_ms = statistics.median(fwd) * 1e3
    eval_ms = statistics.median(evl) * 1e3
    total_ms = forward_ms + eval_ms
    build_ms = statistics.median(builds) * 1e3
    weights_ms = statistics.median(weights) * 1e3
    attention_ms = statistics.median(attn) * 1e3 if kvs else 0.0
    del cache, kvs
    gc.collect()

    by_shape: dict[str, dict[str, Any]] = {}
    for name, idx in groups.items():
        t = statistics.median(group_times[name])
        nb = sum(layer_bytes[i] for i in idx)
        by_shape[name] = {"layers": len(idx), "ms": _r(t * 1e3), "mb": _r(nb / 1e6, 1), "read_gb_s": _r(nb / t / GB, 2)}
    del xs
    gc.collect()

    # floors
    stream = machine["stream"]["stream_read_gb_s"]
    bl = machine["blas"]
    kv = kv_bytes(runner, rows, context)
    bw_floor = (weight_bytes + kv) / (stream * GB) * 1e3
    mlx_rate = (bl.get("mlx_decode_read_gb_s") or {}).get(f"m{rows}")
    blas_floor = (weight_bytes / (mlx_rate * GB) + kv / (stream * GB)) * 1e3 if mlx_rate else None
    gemv = bl.get("cblas_sgemv_read_gb_s")
    gemv_floor = (weight_bytes / (gemv * GB) + kv / (stream * GB)) * 1e3 if gemv and rows == 1 else None
    per_node = machine["dispatch"]["eval_us_per_node"]
    mlx_parts = None
    if host is not None and host_timers.get("steps"):
        # the served step builds no graph: its split is its own timers' (engine/kv/host_decode.py);
        # the parts timed through MLX stay beside it for comparison
        mlx_parts = {"weights_ms": _r(weights_ms), "attention_ms": _r(attention_ms), "graph_build_ms": _r(build_ms)}
        weights_ms, attention_ms, build_ms = (host_timers["weights"] / host_timers["steps"] * 1e3,
                                              host_timers["attention"] / host_timers["steps"] * 1e3, 0.0)
    other_ms = total_ms - weights_ms - attention_ms - build_ms

    # prefill: the last chunk against the sgemm limit
    tokens_in_chunk = rows * width
    # the keys each query can see (a causal chunk: the cached ones and those up to its own),
    # not the masked half of the chunk's own block: what the chunk must compute
    attn_flop = sum(4 * rows * hq * d * _visible(s, chunk_start, width) for s in spans)
    flop = 2 * linears.prefill_params * tokens_in_chunk + attn_flop
    sgemm_floor = flop / (bl["mlx_sgemm_prefill_gflop_s"] * 1e9) * 1e3
    paired = statistics.median(flop / (r * 1e9) / c for r, c in zip(rates, chunk_samples))
    return {
        "rows": rows,
        "context": context,
        "attention_path": "numpy softmax (scores evaluated inside the forward)" if numpy_path else "mlx",
        "step": {
            "total_ms": _r(total_ms), "forward_ms": _r(forward_ms), "eval_ms": _r(eval_ms),
            "graph_build_ms": _r(build_ms), "sampler_ms": _r(statistics.median(smp) * 1e3),
            "ms_per_token": _r(total_ms / rows), "tok_s": _r(rows * 1e3 / total_ms, 2),
            "steps": len(fwd), "rounds": rounds,
        },
        "row_gemv": _ab_report(ab, whole_steps if host is None else mlx_steps, plain_steps),
        "host_decode": None if host is None else {
            **_ab_report(True, whole_steps, mlx_steps, "mlx_step"),
            "split_ms": {k: _r(host_timers[k] / host_timers["steps"] * 1e3)
                         for k in ("weights", "attention", "other")} if host_timers.get("steps") else None},
        "nodes": {"per_step": nodes, "per_token": _r(nodes / rows, 1),
                  "top_primitives": dict(by_primitive.most_common(10))},
        "split": {
            "weights_ms": _r(weights_ms), "attention_ms": _r(attention_ms), "graph_build_ms": _r(build_ms),
            "other_ops_and_dispatch_ms": _r(other_ms),
            "dispatch_estimate_ms": _r(nodes * per_node / 1e3) if per_node is not None else None,
            "weights_fraction": _r(weights_ms / total_ms), "attention_fraction": _r(attention_ms / total_ms),
            "graph_build_fraction": _r(build_ms / total_ms), "other_fraction": _r(other_ms / total_ms),
            "linear_layers": len(layers), "weight_bytes": weight_bytes,
            "weights_path": f"numpy and {'sgemv' if rows == 1 else 'sgemm'} outside MLX's graph "
                            "(engine/kv/host_decode.py)" if host is not None
            else "sgemv (engine/kv/row_gemv.py)" if rows == 1 and runner.row_gemv.get("installed")
            else "mlx matmul",
            "weights_read_gb_s": _r(weight_bytes / (weights_ms / 1e3) / GB, 2),
            "weights_by_shape": by_shape,
            "attention_layers": len(spans), "attention_heads": [hq, hkv, d],
            "mlx_parts": mlx_parts,
        },
        "floors": {
            "kv_bytes": kv,
            "bandwidth_floor_ms": _r(bw_floor), "fraction_of_bandwidth_floor": _r(bw_floor / total_ms),
            "blas_floor_ms": _r(blas_floor),
            "fraction_of_blas_floor": _r(blas_floor / total_ms) if blas_floor else None,
            "gemv_floor_ms": _r(gemv_floor),
            "fraction_of_gemv_floor": _r(gemv_floor / total_ms) if gemv_floor else None,
        },
        "prefill": {
            "rows": rows, "chunk_tokens": width, "chunk_start": chunk_start,
            "chunk_ms": _r(chunk_s * 1e3), "chunk_ms_samples": [_r(x * 1e3) for x in chunk_samples],
            "tok_s": _r(tokens_in_chunk / chunk_s, 1),
            "gflop": _r(flop / 1e9, 3), "attention_gflop": _r(attn_flop / 1e9, 3),
            "gflop_s": _r(flop / chunk_s / 1e9, 1),
            "sgemm_floor_ms": _r(sgemm_floor), "fraction_of_sgemm_limit": _r(sgemm_floor / (chunk_s * 1e3)),
            "sgemm_gflop_s_after_each": [_r(r, 1) for r in rates],
            "fraction_of_sgemm_limit_paired": _r(paired),
            "host_paths": None if held_off is None else {
                **held_off, "fraction_of_sgemm_limit": _r(sgemm_floor / held_off["chunk_ms"]),
                "held_off_fraction_of_sgemm_limit": _r(sgemm_floor / held_off["held_off_chunk_ms"])},
        },
    }


def _rerunnable(runner: Any) -> bool:
    """Rolling a chunk back is exact for full-attention layers only."""
    return runner.trimmable and all(k.kind == FULL for k in _flat_kinds(runner.layout))


def _rerun(runner: Any, cache: Any, chunk: list[int], rows: int) -> float:
    """Seconds to run the last chunk again, rolled back first."""
    for b in range(rows):
        cache.rollback(b, len(chunk))
    t0 = time.perf_counter()
    runner.forward([chunk] * rows, cache, None)
    cache.advance([len(chunk)] * rows)
    mx.eval(cache.arrays())
    return time.perf_counter() - t0


def _prefill_ab(runner: Any, cache: Any, chunk: list[int], rows: int, rounds: int = 3) -> dict[str, Any] | None:
    """The last chunk again, rolled back and re-run, interleaved: as the engine runs it,
    and with numpy's swiglu held off, MLX's own 32 MiB buffer cache, the row-split work on
    one thread and the blocked attention held off (engine/kv/host_swiglu.py,
    engine/memory.py, engine/kv/host_work.py, engine/kv/prefill_attention.py).
    Median ms of each and the speedup."""
    if not _rerunnable(runner):
        return None
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(rounds):
        ours.append(_rerun(runner, cache, chunk, rows))
        with host_swiglu.suspended(), memory.default_buffer_cache(), host_work.one_thread(), \
                prefill_attention.suspended():
            _rerun(runner, cache, chunk, rows)  # untimed: each arm timed after a run of its own
            theirs.append(_rerun(runner, cache, chunk, rows))
        _rerun(runner, cache, chunk, rows)  # refills the buffer cache the held-off arm emptied
    a, b = statistics.median(ours) * 1e3, statistics.median(theirs) * 1e3
    return {"chunk_ms": _r(a), "held_off_chunk_ms": _r(b), "speedup": _r(b / a),
            "swiglu": bool(runner.swiglu.get("routed")), "buffer_cache_mb": _r(memory.buffer_cache_limit() / 2**20, 1),
            "softmax_threads": host_work.workers(),
            "blocked_attention": prefill_attention.workers() if prefill_attention.serves() else None}


def _ab_report(ab: bool, whole: list[float], plain: list[float], name: str = "matmul_step") -> dict[str, Any] | None:
    """The same B=1 steps with a path held off (the sgemv stand-ins: row_gemv.suspended;
    the host step: MLX's step), interleaved with the timed ones: the median ms of each
    (forward, eval and sampler) and the speedup of the path the engine runs."""
    if not ab or not plain or not whole:
        return None
    ours = statistics.median(whole) * 1e3
    theirs = statistics.median(plain) * 1e3
    return {"step_ms": _r(ours), f"{name}_ms": _r(theirs), "speedup": _r(theirs / ours)}


def served(engine: Any, tokens: int, repeats: int) -> dict[str, Any]:
    """B=1 decode through the engine's scheduler, counted as bench/decode.py counts."""
    from .decode import _prompts, ours

    prompt = _prompts(engine.tokenizer, 1)
    _progress(f"served: engine.stream, {tokens} tokens x {repeats}")
    ours(engine, prompt, 8)
    rates = [ours(engine, prompt, tokens) for _ in range(max(1, repeats))]
    return {"rows": 1, "prompt_tokens": len(prompt[0]), "max_tokens": tokens,
            "context_range": [len(prompt[0]), len(prompt[0]) + tokens],
            "tok_s": _r(statistics.median(rates), 2), "samples_tok_s": [_r(x, 2) for x in rates]}


def run(model_name: str | None, rows: list[int], contexts: list[int], steps: int, repeats: int, stream_mb: int,
        matrices: int, tokens: int) -> dict[str, Any]:
    from jumpahead.engine.engine import Engine, EngineConfig

    started = time.perf_counter()
    ms = sorted(set([1, 4] + rows))
    machine = stream_and_blas(repeats, stream_mb, matrices, ms)
    machine["dispatch"] = dispatch(repeats)
    _progress(f"loading {model_name or 'the default model'}")
    engine = Engine.load(model_name, EngineConfig(prefix_cache=False), progress=lambda s: None)
    try:
        model = engine.model
        linears = linear_layers(engine)
        hq, hkv, d = head_shape(model)
        vocab = int(getattr(_args(model), "vocab_size", 0) or 32000)
        runs = [measure_run(engine, b, c, steps, machine, linears, vocab) for c in contexts for b in rows]
        serve = served(engine, tokens, 2) if tokens > 0 else None
        if serve is not None:
            ones = [r for r in runs if r["rows"] == 1]
            if ones:
                near = min(ones, key=lambda r: r["context"])
                step = near["step"]
                rate = 1e3 / (step["total_ms"] + step["sampler_ms"])
                serve["split_context"] = near["context"]
                serve["split_tok_s"] = _r(rate, 2)
                serve["served_over_split"] = _r(serve["tok_s"] / rate)
        result = {
            "bench": "roofline",
            "model": engine.info.name,
            "dtype": engine.info.dtype,
            "device": str(mx.default_device()),
            "cpu": blas.cpu_name(),
            "cores": os.cpu_count(),
            "machine": machine,
            "model_shape": {
                "model_type": engine.runner.model_type, "layers": engine.runner.n_layers,
                "hidden": _hidden(model), "heads": hq, "kv_heads": hkv, "head_dim": d, "vocab": vocab,
                "linear_layers": len(linears.layers), "weight_bytes": linears.weight_bytes,
                "head_bytes": linears.head_bytes, "prefill_linear_params": linears.prefill_params,
                "kv_bytes_per_token": engine.runner.kv_bytes_per_token,
            },
            "runs": runs,
            "served": serve,
            "wall_s": _r(time.perf_counter() - started, 1),
        }
    finally:
        engine.close()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="jumpahead bench roofline", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None,
                    help="mlx-lm folder, GGUF file or gemma3-270m (default: the embedded default model)")
    ap.add_argument("--rows", default="1,4", help="decode rows B, comma-separated (default 1,4)")
    ap.add_argument("--contexts", default="512,2048",
                    help="cached tokens per row, comma-separated (default 512,2048; 8192 prefills slowly)")
    ap.add_argument("--steps", type=int, default=24, help="timed decode steps per run, after 3 warm-up (default 24)")
    ap.add_argument("--repeats", type=int, default=3, help="repeats of each machine limit, best taken (default 3)")
    ap.add_argument("--stream-mb", type=int, default=288, help="MB of the one-matrix stream read (default 288)")
    ap.add_argument("--matrices", type=int, default=90,
                    help=f"distinct [{OUT}, {DIM}] float32 matrices in the read-rate tests (default 90: 318 MB)")
    ap.add_argument("--tokens", type=int, default=64,
                    help="tokens of the served decode through engine.stream (default 64; 0 skips it)")
    ap.add_argument("--out", default=None, help="also write the JSON result to this file")
    args = ap.parse_args(argv)
    from .decode import parse_contexts

    rows = parse_contexts(ap, args.rows, "rows")
    contexts = parse_contexts(ap, args.contexts)
    if args.steps < 1 or args.repeats < 1 or args.matrices < 1 or args.stream_mb < 1:
        ap.error("--steps, --repeats, --matrices and --stream-mb must be positive")
    from jumpahead.bench.output import emit

    return emit(run(args.model, rows, contexts, args.steps, args.repeats, args.stream_mb, args.matrices,
                    args.tokens), args.out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
