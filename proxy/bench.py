"""`jumpahead bench KIND`: benchmarks that print JSON with ratios against a baseline
measured side by side in the same run (absolute times are not stable on a busy
machine; ratios are)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

# kind -> (module with run(**kwargs) -> dict, help)
KINDS: dict[str, tuple[str, str]] = {
    "decode": ("jumpahead.engine.bench_decode", "decode tokens/s vs mlx-lm stream_generate and BatchGenerator"),
    "fill": ("jumpahead.engine.bench_fill", "strict fill, echo and mixed batches vs ordinary decoding"),
    "cache": ("jumpahead.engine.bench_cache", "time to first token: cold vs RAM hit vs SSD hit"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=sorted(KINDS), help="which benchmark")
    parser.add_argument("--model", default=None, metavar="PATH_OR_ID", help="model (default: the embedded default)")
    parser.add_argument("--tokens", type=int, default=None, help="tokens generated per row")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repetitions per arm")
    parser.add_argument("--out", default=None, help="also write the JSON to this file")


def run(args: argparse.Namespace) -> int:
    import jumpahead.engine  # noqa: F401  (loads OpenBLAS before mlx)

    module = importlib.import_module(KINDS[args.kind][0])
    kwargs = {"model_name": args.model}
    if args.tokens is not None:
        kwargs["tokens"] = args.tokens
    if args.repeats is not None:
        kwargs["repeats"] = args.repeats
    try:
        result = module.run(**kwargs)
    except TypeError as exc:
        print(f"jumpahead bench {args.kind}: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0
