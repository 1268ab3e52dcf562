"""`jumpahead bench decode --contexts 2048,4096,8000`: prefill and decode at agent
context lengths, ours side by side with mlx-lm's `stream_generate`.

For each length C the prompt is a real agent turn (the public mini-swe-agent session
in ../shared/traces/public, rendered with the model's chat template, the middle cut
so it is exactly C tokens and still ends with the generation prompt); without the
session, a synthetic chat of code files. Arms, interleaved per repeat in one process
on one loaded model so machine noise hits both alike:

- ours: the Engine with its prompt cache off (a cold prefill every time, as mlx-lm's
  fresh cache), ordinary greedy decoding (methods none: engine against engine);
- mlx-lm: `stream_generate` with its own prompt cache (`make_prompt_cache`, a fresh
  one per run) and its default prefill step.

Prefill tokens/s = C / time to the first token; decode ms/token = first to last
token over the tokens after the first. Both stop at EOS, so the token counts are
reported; `agreeing_tokens` says how many leading greedy tokens the two produced
alike (float32 rounding in attention may flip a near-tie at long contexts; it is
reported, not claimed).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any, Callable

HEAD = 256  # tokens kept from the start of a cut session (the system prompt's beginning)


def session_prompt(tokenizer: Any, context: int, trace: Path | None = None) -> tuple[list[int], str]:
    """A prompt of exactly `context` tokens and where it came from."""
    from .bench_cache import TRACE, openai_messages, render

    path = trace or TRACE
    if path.exists():
        messages = openai_messages(path)
        ids: list[int] = []
        for k in range(2, len(messages) + 1):  # the first turn ending in a tool result that reaches `context`
            if messages[k - 1]["role"] not in ("tool", "user"):
                continue
            ids = render(tokenizer, messages[:k])
            if len(ids) >= context:
                break
        source = f"{path.name}, messages[:{k}] ({len(ids)} tokens)"
    else:
        from .bench_echo import CONFIG, PY_FILE

        text = "\n\n".join(f"File {i}:\n{PY_FILE if i % 2 else CONFIG}" for i in range(context // 100 + 1))
        ids = render(tokenizer, [{"role": "user", "content": text + "\n\nSummarise these files."}])
        source = f"synthetic (code files; {path} is absent)"
    if len(ids) < context:
        raise ValueError(f"the prompt source has only {len(ids)} tokens, fewer than {context}")
    if len(ids) > context:
        ids = ids[:HEAD] + ids[len(ids) - (context - HEAD):]
        source += f", middle cut to {context}"
    return ids, source


def ours(engine: Any, prompt: list[int], n: int) -> dict[str, Any]:
    from .types import GenerationRequest

    async def go() -> tuple[float, list[float], list[int]]:
        t0 = time.perf_counter()
        stamps: list[float] = []
        tokens: list[int] = []
        async for chunk in engine.stream(GenerationRequest(prompt=prompt, max_tokens=n, methods=["none"])):
            if chunk.tokens:
                stamps.extend([time.perf_counter()] * len(chunk.tokens))
                tokens += chunk.tokens
        return t0, stamps, tokens

    return _measure(*asyncio.run(go()), len(prompt))


def mlx_lm(model: Any, tokenizer: Any, prompt: list[int], n: int) -> dict[str, Any]:
    from mlx_lm import stream_generate
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    t0 = time.perf_counter()
    stamps: list[float] = []
    tokens: list[int] = []
    for r in stream_generate(model, tokenizer, prompt, max_tokens=n, prompt_cache=cache):
        stamps.append(time.perf_counter())
        tokens.append(int(r.token))
    # stream_generate yields the EOS token too (as text ""); ours emits it as well
    return _measure(t0, stamps, tokens, len(prompt))


def _measure(t0: float, stamps: list[float], tokens: list[int], context: int) -> dict[str, Any]:
    ttft = stamps[0] - t0
    decode = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else float("nan")
    return {"ttft_s": ttft, "prefill_tok_s": context / ttft, "decode_ms": decode * 1000, "tokens": tokens}


def _agree(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def run(
    model_name: str | None,
    contexts: list[int],
    tokens: int = 32,
    repeats: int = 1,
    progress: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    import mlx.core as mx

    from .engine import Engine, EngineConfig

    engine = Engine.load(model_name, EngineConfig(prefix_cache=False), progress=lambda s: None)
    model, tok = engine.model, engine.tokenizer
    out: dict[str, Any] = {"bench": "decode.contexts", "model": engine.info.name, "dtype": engine.info.dtype,
                           "device": str(mx.default_device()), "tokens": tokens, "repeats": repeats,
                           "context_length": engine.context_length, "contexts": {}}
    try:
        too_long = [c for c in contexts if c + tokens > engine.context_length]
        if too_long:
            raise ValueError(f"contexts {too_long} + {tokens} tokens exceed the model's window "
                             f"({engine.context_length} tokens)")
        warm = session_prompt(tok, 256)[0]  # page in weights, allocate buffers
        ours(engine, warm, 4)
        mlx_lm(model, tok, warm, 4)
        for c in contexts:
            prompt, source = session_prompt(tok, c)
            runs: dict[str, list[dict[str, Any]]] = {"ours": [], "mlx_lm": []}
            for r in range(repeats):
                for arm in (("ours", "mlx_lm") if r % 2 == 0 else ("mlx_lm", "ours")):
                    res = ours(engine, prompt, tokens) if arm == "ours" else mlx_lm(model, tok, prompt, tokens)
                    runs[arm].append(res)
                    progress(f"context {c} {arm:>6}: prefill {res['prefill_tok_s']:.1f} tok/s "
                             f"(ttft {res['ttft_s']:.1f}s), decode {res['decode_ms']:.1f} ms/token, "
                             f"{len(res['tokens'])} tokens")

            def med(arm: str, key: str) -> float:
                return statistics.median(x[key] for x in runs[arm])

            row = {"prompt": source}
            for arm in ("ours", "mlx_lm"):
                row[arm] = {"prefill_tok_s": round(med(arm, "prefill_tok_s"), 1), "ttft_s": round(med(arm, "ttft_s"), 2),
                            "decode_ms_per_token": round(med(arm, "decode_ms"), 1),
                            "generated": [len(x["tokens"]) for x in runs[arm]]}
            row["prefill_ratio"] = round(row["ours"]["prefill_tok_s"] / row["mlx_lm"]["prefill_tok_s"], 3)
            row["decode_ratio"] = round(row["mlx_lm"]["decode_ms_per_token"] / row["ours"]["decode_ms_per_token"], 3)
            row["agreeing_tokens"] = [_agree(a["tokens"], b["tokens"]) for a, b in zip(runs["ours"], runs["mlx_lm"])]
            row["samples"] = {arm: [{"prefill_tok_s": round(x["prefill_tok_s"], 1),
                                     "decode_ms": round(x["decode_ms"], 1)} for x in runs[arm]] for arm in runs}
            out["contexts"][str(c)] = row
    finally:
        engine.close()
    out["ratios"] = "ours over mlx-lm (> 1: ours is faster): prefill tokens/s, and decode ms/token inverted"
    return out
