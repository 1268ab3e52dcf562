"""`jumpahead bench decode`: our decode speed side by side with mlx-lm's own.

Arms, interleaved (ABAB...) in one process on one loaded model so that machine noise
hits both alike: single-row decode (ours vs mlx-lm `stream_generate`) and B=4
aggregate decode (ours vs mlx-lm `BatchGenerator`). Decode throughput is counted in
the window after every row has its first token, so prefill does not blur it.

With `--contexts 2048,4096,8000`: prefill tokens/s and decode ms/token at agent
context lengths, vs mlx-lm `stream_generate` with its own prompt cache
(bench/context.py).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import jumpahead.engine  # noqa: F401  (OpenBLAS before mlx)
import mlx.core as mx
from mlx_lm import stream_generate
from mlx_lm.generate import BatchGenerator

from jumpahead.engine.engine import Engine, EngineConfig
from jumpahead.engine.types import GenerationRequest

TOPICS = [
    "the history of the printing press",
    "how a compiler turns source code into machine code",
    "why the sky is blue",
    "the rules of chess for a beginner",
]


def _prompts(tokenizer, n: int) -> list[list[int]]:
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Write a long, detailed essay about {TOPICS[i % len(TOPICS)]}."}],
            add_generation_prompt=True,
        )
        for i in range(n)
    ]


def _window_tps(stamps: list[list[float]]) -> tuple[float, int]:
    """Tokens/s over [all rows started, last token], counting tokens inside it."""
    start = max(s[0] for s in stamps)
    end = max(s[-1] for s in stamps)
    n = sum(sum(1 for t in s if t > start) for s in stamps)
    return (n / (end - start) if end > start else 0.0), n


def mlx_single(model, tokenizer, prompt: list[int], n: int) -> float:
    stamps = [time.perf_counter() for _ in stream_generate(model, tokenizer, prompt, max_tokens=n)]
    return _window_tps([stamps])[0]


def mlx_batch(model, tokenizer, prompts: list[list[int]], n: int) -> float:
    gen = BatchGenerator(model, stop_tokens=[[t] for t in tokenizer.eos_token_ids])
    uids = gen.insert(prompts, [n] * len(prompts))
    stamps: dict[int, list[float]] = {u: [] for u in uids}
    while responses := gen.next_generated():
        now = time.perf_counter()
        for r in responses:
            stamps[r.uid].append(now)
    gen.close()
    return _window_tps(list(stamps.values()))[0]


def ours(engine: Engine, prompts: list[list[int]], n: int) -> float:
    # stop_token_ids=[] and ignore EOS by max length: every arm generates n tokens
    async def one(p: list[int]) -> list[float]:
        stamps = []
        async for chunk in engine.stream(GenerationRequest(prompt=p, max_tokens=n)):
            if chunk.tokens:
                stamps.extend([time.perf_counter()] * len(chunk.tokens))
        return stamps

    async def all_rows() -> list[list[float]]:
        return await asyncio.gather(*[one(p) for p in prompts])

    return _window_tps(asyncio.run(all_rows()))[0]


def run(model_name: str | None = None, tokens: int = 64, repeats: int = 3, batch: int = 4) -> dict[str, Any]:
    # No prefix cache: every arm prefills its prompt the same way.
    engine = Engine.load(model_name, EngineConfig(prefix_cache=False), progress=lambda s: None)
    model, tokenizer = engine.model, engine.tokenizer
    single_prompt = _prompts(tokenizer, 1)
    batch_prompts = _prompts(tokenizer, batch)
    # warm-up both paths (page in weights, allocate buffers)
    ours(engine, single_prompt, 8)
    mlx_single(model, tokenizer, single_prompt[0], 8)
    res: dict[str, list[float]] = {k: [] for k in ("ours_1", "mlx_1", "ours_b", "mlx_b")}
    for _ in range(repeats):
        res["ours_1"].append(ours(engine, single_prompt, tokens))
        res["mlx_1"].append(mlx_single(model, tokenizer, single_prompt[0], tokens))
        res["mlx_b"].append(mlx_batch(model, tokenizer, batch_prompts, tokens))
        res["ours_b"].append(ours(engine, batch_prompts, tokens))
    engine.close()
    med = {k: statistics.median(v) for k, v in res.items()}
    return {
        "bench": "decode",
        "model": engine.info.name,
        "dtype": engine.info.dtype,
        "device": str(mx.default_device()),
        "tokens_per_row": tokens,
        "repeats": repeats,
        "single_row": {
            "jumpahead_tok_s": round(med["ours_1"], 2),
            "mlx_lm_stream_generate_tok_s": round(med["mlx_1"], 2),
            "ratio": round(med["ours_1"] / med["mlx_1"], 3),
            "target": ">= 0.95",
        },
        f"batch_{batch}_aggregate": {
            "jumpahead_tok_s": round(med["ours_b"], 2),
            "mlx_lm_batch_generator_tok_s": round(med["mlx_b"], 2),
            "ratio": round(med["ours_b"] / med["mlx_b"], 3),
            "target": ">= 1.0",
        },
        "samples": {k: [round(x, 2) for x in v] for k, v in res.items()},
    }


def parse_contexts(parser: Any, text: str, name: str = "contexts") -> list[int]:
    """A --contexts value (or another option `name`'s): comma-separated positive
    integers, else the argparse parser's usage error. bench/attention.py and
    bench/roofline.py read theirs so too."""
    try:
        contexts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--{name} must be comma-separated integers, got {text!r}")
    if not contexts or min(contexts) < 1:
        parser.error(f"--{name} needs at least one positive value")
    return contexts


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="jumpahead bench decode", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="mlx-lm model path or hub id (default: the embedded default)")
    ap.add_argument("--tokens", type=int, default=None, help="tokens generated per row (default 64)")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repetitions per arm (default 3)")
    ap.add_argument("--batch", type=int, default=4, help="rows in the batched arm (default 4)")
    ap.add_argument("--contexts", default=None, metavar="LIST",
                    help="instead: prefill tokens/s and decode ms/token at these prompt lengths, e.g. "
                         "2048,4096,8000, vs mlx-lm stream_generate (bench/context.py; --tokens "
                         "defaults to 32 and --repeats to 1 there)")
    ap.add_argument("--kv-bits", type=int, default=None, choices=(4, 8),
                    help="with --contexts: both sides' KV cache quantized to these bits, beside both at "
                         "full precision")
    ap.add_argument("--out", default=None, help="also write the JSON result to this file")
    args = ap.parse_args(argv)
    from jumpahead.bench.output import emit

    if args.contexts is None:
        return emit(run(args.model, args.tokens or 64, args.repeats or 3, args.batch), args.out)
    contexts = parse_contexts(ap, args.contexts)
    from . import context

    try:
        result = context.run(args.model, contexts, args.tokens or 32, args.repeats or 1,
                             progress=lambda s: print(s, file=sys.stderr, flush=True), kv_bits=args.kv_bits)
    except ValueError as exc:
        print(f"jumpahead bench decode: {exc}", file=sys.stderr)
        return 2
    return emit(result, args.out)
