"""`jumpahead bench attention`: prefill and decode cost by context length, with the
numpy-softmax attention (engine/kv/attention.py) vs MLX's own kernel.

For each context length, both arms prefill the same synthetic prompt in the
scheduler's 512-token chunks, then decode single tokens on top of it; arms run
interleaved in one process on one loaded model, so machine noise hits both alike.
A verifying-round arm times a B=4 round where two rows carry 8 proposal tokens at
~400 cached tokens (the shape a mixed echo batch takes). Ratios are MLX kernel time
over ours (> 1: ours is faster).

`jumpahead bench attention [--contexts 1024,4096] [--decode 8] [--repeats 2]`.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
import mlx.core as mx

from jumpahead.engine.kv import attention
from jumpahead.engine.engine import Engine, EngineConfig

CHUNK = 512  # the scheduler's prefill chunk (SchedulerConfig.prefill_chunk)
ARMS = ("mlx", "numpy")


def _synthetic(n: int) -> list[int]:
    return [(i * 7919) % 30000 + 100 for i in range(n)]


def _use(arm: str, default: int) -> None:
    attention.NUMPY_MIN = default if arm == "numpy" else 1 << 62


def _prefill_and_decode(runner, n: int, decode: int) -> tuple[float, float]:
    """Seconds to prefill n tokens; median seconds per decoded token after them."""
    cache = runner.new_cache()
    cache.ends = [0]
    prompt = _synthetic(n)
    t0 = time.perf_counter()
    for s in range(0, n, CHUNK):
        chunk = prompt[s : s + CHUNK]
        runner.forward([chunk], cache, None)
        cache.advance([len(chunk)])
        mx.eval(cache.arrays())
    prefill = time.perf_counter() - t0
    steps = []
    for _ in range(decode):
        t0 = time.perf_counter()
        mx.eval(mx.argmax(runner.forward([[5]], cache), axis=-1))
        cache.advance([1])
        steps.append(time.perf_counter() - t0)
    return prefill, statistics.median(steps)


def _verify_round(runner, reps: int, default: int) -> dict[str, float]:
    ctx = 400
    cache = runner.new_cache()
    cache.ends = [0] * 4
    runner.forward([_synthetic(ctx)] * 4, cache, None)
    cache.advance([ctx - 4 * b for b in range(4)])
    mx.eval(cache.arrays())
    widths = [9, 1, 9, 1]
    rows = [[5] * w for w in widths]
    times: dict[str, list[float]] = {a: [] for a in ARMS}
    for rep in range(reps + 1):
        for arm in ARMS if rep % 2 == 0 else ARMS[::-1]:
            _use(arm, default)
            t0 = time.perf_counter()
            logits, _ = runner.forward_ragged(rows, cache, widths)  # not advanced: rewrites the same slots
            mx.eval(mx.argmax(logits, axis=-1))
            if rep:
                times[arm].append(time.perf_counter() - t0)
    med = {a: statistics.median(t) for a, t in times.items()}
    return {"widths": widths, "cached_tokens": ctx, "mlx_ms": round(med["mlx"] * 1000, 1),
            "numpy_ms": round(med["numpy"] * 1000, 1), "ratio": round(med["mlx"] / med["numpy"], 3)}


def run(model_name: str | None, contexts: list[int], decode: int, repeats: int) -> dict[str, Any]:
    engine = Engine.load(model_name, EngineConfig(prefix_cache_ssd=False), progress=lambda s: None)
    runner = engine.runner
    default = attention.NUMPY_MIN
    out: dict[str, Any] = {"bench": "attention", "model": engine.info.name, "dtype": engine.info.dtype,
                           "device": str(mx.default_device()), "numpy_min": default, "contexts": {}}
    try:
        _prefill_and_decode(runner, 64, 2)  # warm-up
        for n in contexts:
            got: dict[str, list[tuple[float, float]]] = {a: [] for a in ARMS}
            for r in range(repeats):
                for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
                    _use(arm, default)
                    got[arm].append(_prefill_and_decode(runner, n, decode))
            pre = {a: statistics.median(p for p, _ in v) for a, v in got.items()}
            dec = {a: statistics.median(d for _, d in v) for a, v in got.items()}
            out["contexts"][str(n)] = {
                "prefill_s": {a: round(pre[a], 2) for a in ARMS},
                "prefill_ratio": round(pre["mlx"] / pre["numpy"], 3),
                "decode_ms_per_token": {a: round(dec[a] * 1000, 1) for a in ARMS},
                "decode_ratio": round(dec["mlx"] / dec["numpy"], 3),
            }
        out["verify_round_B4"] = _verify_round(runner, 8, default)
    finally:
        attention.NUMPY_MIN = default
        engine.close()
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    from jumpahead.bench.output import emit

    from .decode import parse_contexts

    p = argparse.ArgumentParser(prog="jumpahead bench attention", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--contexts", default="1024,4096", help="comma-separated prompt lengths in tokens")
    p.add_argument("--decode", type=int, default=8, help="tokens decoded after each prefill")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    return emit(run(a.model, parse_contexts(p, a.contexts), a.decode, a.repeats), a.out)


if __name__ == "__main__":
    raise SystemExit(main())
