"""`jumpahead bench kv`: what a quantized KV cache costs in quality and saves in memory.

Quality, teacher-forced: a held-out agent session (the public mini-swe-agent turn that
`bench decode --contexts` uses, cut to C tokens) goes through the model in prefill
chunks once per arm, all arms in lockstep: full precision and each quantized format
(engine/kv/kv_format.py). At every position the quantized arm's next-token argmax is
compared with full precision's (agreement) and the largest logit difference taken.
Every position attends to all earlier ones through the cache, so the late positions
measure the long-context error.

Memory: bytes per cached token of one row (ModelRunner.kv_bytes_per_token, read off
the attention layers' buffers; the tests check it against the live buffers), and how
many tokens of context (or rows of that context) fit a fixed budget.

Speed is `jumpahead bench decode --contexts 2048,8000 --kv-bits B` (bench/context.py).
"""

from __future__ import annotations

import time
from typing import Any, Callable

CHUNK = 256  # prefill chunk: logits of [CHUNK, vocab] per arm at a time
BUDGET = 1 << 30  # the fixed budget of the "fits" figures


def run(model_name: str | None, contexts: list[int], formats: list[str],
        progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    import mlx.core as mx

    from jumpahead.engine.kv.kv_format import KVFormat
    from jumpahead.engine.model.loader import load_model
    from jumpahead.engine.kv.model_runner import ModelRunner

    from .context import session_prompt

    model, tok, info = load_model(model_name, progress=lambda s: None)
    arms: dict[str, Any] = {"full": None}
    for name in formats:
        k, _, v = name.lower().removeprefix("k").partition("v")
        arms[name] = KVFormat(int(k), int(v or k))
    runners = {name: ModelRunner(model, fmt) for name, fmt in arms.items()}
    out: dict[str, Any] = {"bench": "kv", "model": info.name, "dtype": info.dtype, "chunk": CHUNK,
                           "formats": {n: (f.describe() if f else {"format": "full"}) for n, f in arms.items()},
                           "contexts": {}}
    for c in contexts:
        prompt, source = session_prompt(tok, c)
        caches = {}
        for name, runner in runners.items():
            cache = runner.new_cache()
            cache.ends = [0]
            caches[name] = cache
        stats = {n: {"agree": 0, "max_diff": 0.0, "sum_diff": 0.0} for n in arms if n != "full"}
        positions = 0
        t0 = time.perf_counter()
        for lo in range(0, c, CHUNK):
            chunk = prompt[lo: lo + CHUNK]
            logits = {}
            for name, runner in runners.items():
                logits[name] = runner.forward([chunk], caches[name], positions=slice(None))[0].astype(mx.float32)
                mx.eval(logits[name])
                caches[name].advance([len(chunk)])
            ref = logits.pop("full")
            top = mx.argmax(ref, axis=-1)
            for name, lg in logits.items():
                diff = mx.abs(lg - ref).max(axis=-1)
                s = stats[name]
                s["agree"] += int((mx.argmax(lg, axis=-1) == top).sum().item())
                s["max_diff"] = max(s["max_diff"], float(diff.max().item()))
                s["sum_diff"] += float(diff.sum().item())
            positions += len(chunk)
            progress(f"context {c}: {positions}/{c} positions ({time.perf_counter() - t0:.0f} s)")
        row: dict[str, Any] = {"prompt": source, "positions": positions, "formats": {}}
        full_bytes = runners["full"].kv_bytes_per_token
        for name in arms:
            per_token = runners[name].kv_bytes_per_token
            entry: dict[str, Any] = {
                "bytes_per_token": round(per_token), "bytes_per_1k_tokens_mb": round(per_token * 1000 / 2**20, 2),
                "compression_vs_full": round(full_bytes / per_token, 2),
                "tokens_in_1_gib": int(BUDGET // per_token), "rows_of_this_context_in_1_gib": int(BUDGET // (per_token * c)),
            }
            if name != "full":
                s = stats[name]
                entry.update(next_token_agreement=round(s["agree"] / positions, 4),
                             max_logit_diff=round(s["max_diff"], 4), mean_max_logit_diff=round(s["sum_diff"] / positions, 4))
            row["formats"][name] = entry
        out["contexts"][str(c)] = row
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    from jumpahead.bench.output import emit

    p = argparse.ArgumentParser(prog="jumpahead bench kv", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="mlx-lm folder, GGUF file or gemma3-270m (default: the embedded default)")
    p.add_argument("--contexts", default="2048,8000", help="comma-separated prompt lengths in tokens")
    p.add_argument("--formats", default="k8v8,k4v4,k8v4", help="quantized formats against full precision")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    try:
        contexts = [int(x) for x in a.contexts.split(",") if x.strip()]
        formats = [f.strip() for f in a.formats.split(",") if f.strip()]
        for f in formats:
            k, _, v = f.lower().removeprefix("k").partition("v")
            int(k), int(v or k)
    except ValueError:
        p.error("--contexts must be integers and --formats like k8v8,k4v4,k8v4")
    if not contexts or min(contexts) < CHUNK:
        p.error(f"--contexts needs lengths of at least {CHUNK}")
    try:
        result = run(a.model, contexts, formats, progress=lambda s: print(s, file=sys.stderr, flush=True))
    except ValueError as exc:
        print(f"jumpahead bench kv: {exc}", file=sys.stderr)
        return 2
    return emit(result, a.out)


if __name__ == "__main__":
    raise SystemExit(main())
