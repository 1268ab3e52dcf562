"""`jumpahead bench blas`: every BLAS candidate on this CPU, side by side with MLX's bundled
reference BLAS: float32 GEMM GFLOP/s through MLX and the default model's greedy decode
and prefill rates (mlx-lm's own loop), each arm a new process (a BLAS binds once per
process), arms interleaved per repeat. Ratios are against the reference measured in the
same run. Refused candidates are listed with their reason and not run: they would crash.
Whether each arm's tokens equal the reference's is computed from the token lists (BLAS
kernels round differently; a difference is reported, not hidden)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

CHILD = r"""
import json, sys, time
import jumpahead.engine
from jumpahead.engine.machine.blas import blas_info
import mlx.core as mx
want = sys.argv[1]
info = blas_info()
if (info["path"] or "none") != want:
    print(json.dumps({"error": f"bound {info['path']}, wanted {want}"})); sys.exit(0)
a = mx.random.normal((512, 512)); mx.eval(a)
best = min((lambda t: (mx.eval(a @ a), time.perf_counter() - t)[1])(time.perf_counter()) for _ in range(10))
from mlx_lm.generate import stream_generate
from mlx_lm.sample_utils import make_sampler
from jumpahead.engine.model.loader import load_model
model, tok, _ = load_model(None, progress=lambda s: None)
prompt = tok.apply_chat_template([{"role": "user", "content": "Write a Python function that reverses a list, with a docstring."}],
                                 add_generation_prompt=True)
tokens, last = [], None
for last in stream_generate(model, tok, prompt, max_tokens=int(sys.argv[2]), sampler=make_sampler(0.0)):
    tokens.append(last.token)
print(json.dumps({"gflops": 2 * 512 ** 3 / best / 1e9, "decode_tok_s": last.generation_tps,
                  "prefill_tok_s": last.prompt_tps, "tokens": tokens, "threads": info["threads"]}))
"""


def _arm(path: str, tokens: int, threads: int | None) -> dict[str, Any]:
    env = {**os.environ, "JUMPAHEAD_BLAS": path}
    if threads:
        env["JUMPAHEAD_BLAS_THREADS"] = str(threads)
    done = subprocess.run([sys.executable, "-c", CHILD, path, str(tokens)], capture_output=True, text=True,
                          env=env, timeout=1200)
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-300:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="jumpahead bench blas", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64, help="tokens decoded per arm and repeat (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (default 3)")
    parser.add_argument("--threads", type=int, default=None, help="BLAS threads in every arm (default: all cores)")
    parser.add_argument("--out", default=None, help="also write the JSON result here")
    args = parser.parse_args(argv)
    from jumpahead.engine.machine import blas

    features = blas.cpu_features()
    examined = [blas.examine(c, features) for c in blas.candidates()]
    arms = {"reference": "none"} | {f"{c.origin}: {os.path.basename(os.path.realpath(c.path))}": c.path
                                     for c in examined if c.accepted}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
    for r in range(args.repeats):
        for name, path in arms.items():
            print(f"repeat {r + 1}/{args.repeats}: {name}", file=sys.stderr, flush=True)
            runs[name].append(_arm(path, args.tokens, args.threads))
    ref_tokens = next((x["tokens"] for x in runs["reference"] if "tokens" in x), None)
    result: dict[str, Any] = {"cpu": blas.cpu_name(), "cores": os.cpu_count(), "tokens": args.tokens,
                              "repeats": args.repeats, "arms": {}, "refused": [
                                  {"path": c.path, "origin": c.origin, "reason": c.reason} for c in examined if not c.accepted]}
    ref = {}
    for name, got in runs.items():
        ok = [x for x in got if "error" not in x]
        if not ok:
            result["arms"][name] = {"errors": [x["error"] for x in got]}
            continue
        row = {k: round(statistics.median(x[k] for x in ok), 2) for k in ("gflops", "decode_tok_s", "prefill_tok_s")}
        row["threads"] = ok[0]["threads"]
        row["tokens_equal_reference"] = ref_tokens is not None and all(x["tokens"] == ref_tokens for x in ok)
        if name == "reference":
            ref = row
        elif ref:
            row.update({f"{k}_vs_reference": round(row[k] / ref[k], 2) for k in ("gflops", "decode_tok_s", "prefill_tok_s")})
        if len(ok) < len(got):
            row["errors"] = [x["error"] for x in got if "error" in x]
        result["arms"][name] = row
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0 if all("errors" not in v for v in result["arms"].values()) else 1
