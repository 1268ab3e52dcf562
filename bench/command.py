"""`jumpahead bench KIND [ARGS]`: benchmarks that print JSON with ratios against a
baseline measured side by side in the same run (absolute times are not stable on a
busy machine; ratios are). Each KIND's module parses its own ARGS (`main(argv)`)."""

from __future__ import annotations

import argparse
import importlib
import sys

# kind -> (module with main(argv) -> int, help)
KINDS: dict[str, tuple[str, str]] = {
    "decode": ("jumpahead.bench.decode", "decode tokens/s vs mlx-lm stream_generate and BatchGenerator"),
    "fill": ("jumpahead.bench.fill", "strict fill, echo and mixed batches vs ordinary decoding"),
    "cache": ("jumpahead.bench.cache", "time to first token: cold vs RAM hit vs SSD hit"),
    "proxy": ("jumpahead.bench.proxy", "upstream mode: added latency vs the upstream direct; "
              "prefix-cache hits with affinity vs round-robin"),
    "attention": ("jumpahead.bench.attention", "prefill/decode by context: numpy-softmax attention vs MLX's kernel"),
    "forecast": ("jumpahead.bench.forecast", "who finishes last: forecast vs remaining max_tokens on replayed real turns"),
    "load": ("jumpahead.bench.load", "N concurrent streaming clients, mixed protocols: errors, latency, RSS"),
    "disconnect": ("jumpahead.bench.disconnect", "clients vanishing mid-prefill and mid-stream: rows, memory, next request"),
    "crash": ("jumpahead.bench.crash", "SIGKILL during SSD cache and trace writes: restart, outputs, traces"),
    "family-model": ("jumpahead.bench.family_models", "build a random-weight model of a layer family "
                     "(sliding, sinks, MLA, hybrid recurrent) for the other benches' --model"),
    "kv": ("jumpahead.bench.kv", "quantized KV cache: next-token agreement and logit error vs full precision "
           "at agent contexts, bytes per token, what fits 1 GiB"),
    "drafter": ("jumpahead.bench.drafter", "the learned drafter vs ordinary decoding (B=1, B=4), echo vs echo + drafter, "
              "a mixed batch; outputs checked token for token"),
    "blas": ("jumpahead.bench.blas", "each BLAS this CPU can run vs the reference: GEMM GFLOP/s, default-model "
             "decode and prefill tok/s, new process per arm"),
    "claude-code": ("jumpahead.bench.claude_code", "a real `claude -p` 3-turn scripted task on the default model: "
                    "prefix-cache hits and time to first token per turn"),
    "models": ("jumpahead.bench.model_sweep", "every model type mlx-lm ships, tiny and random, served as serve "
               "does by default and checked against mlx-lm: batch, one-row, refused or a failure per type"),
    "roofline": ("jumpahead.bench.roofline", "this machine's limits measured now (stream read GB/s, the bound "
                 "BLAS's sgemm and decode-shape rates, MLX dispatch per node) and where each ms of a decode "
                 "step goes against them: weights, attention, graph build, other ops"),
    "trace-size": ("jumpahead.bench.trace_size", "trace file bytes: delta-encoded turn lines vs every turn whole"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=sorted(KINDS), help="which benchmark: " + "; ".join(
        f"{k}: {h}" for k, (_, h) in sorted(KINDS.items())))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own options (KIND --help)")


def run(args: argparse.Namespace) -> int:
    import jumpahead.engine  # noqa: F401  (loads OpenBLAS before mlx)

    name = KINDS[args.kind][0]
    module = importlib.import_module(name)
    if not hasattr(module, "main"):
        print(f"jumpahead bench {args.kind}: {name} has no main(argv) yet", file=sys.stderr)
        return 2
    return int(module.main(list(args.args)) or 0)
