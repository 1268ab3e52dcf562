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
reported, not claimed). Each figure is also given by process CPU time (all threads),
which other processes on a shared machine disturb far less than the wall clock.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from jumpahead.engine.interface import Engine

HEAD = 256  # tokens kept from the start of a cut session (the system prompt's beginning)


def session_prompt(tokenizer: Any, context: int, trace: Path | None = None) -> tuple[list[int], str]:
    """A prompt of exactly `context` tokens and where it came from."""
    from .cache import TRACE, openai_messages, render

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
        from .echo import CONFIG, PY_FILE

        text = "\n\n".join(f"File {i}:\n{PY_FILE if i % 2 else CONFIG}" for i in range(context // 100 + 1))
        ids = render(tokenizer, [{"role": "user", "content": text + "\n\nSummarise these files."}])
        source = f"synthetic (code files; {path} is absent)"
    if len(ids) < context:
        raise ValueError(f"the prompt source has only {len(ids)} tokens, fewer than {context}")
    if len(ids) > context:
        ids = ids[:HEAD] + ids[len(ids) - (context - HEAD):]
        source += f", middle cut to {context}"
    return ids, source


def ours(engine: "Engine", prompt: list[int], n: int) -> dict[str, Any]:
    from jumpahead.engine.types import GenerationRequest

    async def go() -> tuple[tuple[float, float], list[tuple[float, float]], list[int]]:
        t0 = _now()
        stamps: list[tuple[float, float]] = []
        tokens: list[int] = []
        async for chunk in engine.stream(GenerationRequest(prompt=prompt, max_tokens=n, methods=["none"])):
            if chunk.tokens:
                stamps.extend([_now()] * len(chunk.tokens))
                tokens += chunk.tokens
        return t0, stamps, tokens

    return _measure(*asyncio.run(go()), len(prompt))


def mlx_lm(model: Any, tokenizer: Any, prompt: list[int], n: int, kv_bits: int | None = None) -> dict[str, Any]:
    from mlx_lm import stream_generate
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    # its quantized cache at its own default start (--quantized-kv-start 5000: the cache
    # is quantized once it holds more tokens; ours quantizes every token)
    quant = {"kv_bits": kv_bits, "kv_group_size": 64} if kv_bits else {}
    t0 = _now()
    stamps: list[tuple[float, float]] = []
    tokens: list[int] = []
    for r in stream_generate(model, tokenizer, prompt, max_tokens=n, prompt_cache=cache, **quant):
        stamps.append(_now())
        tokens.append(int(r.token))
    # stream_generate yields the EOS token too (as text ""); ours emits it as well
    return _measure(t0, stamps, tokens, len(prompt))


def _now() -> tuple[float, float]:
    """Wall clock and this process's CPU time (all threads): on a shared machine the
    CPU time is far less disturbed by other processes than the wall clock."""
    return time.perf_counter(), time.process_time()


def _measure(t0: tuple[float, float], stamps: list[tuple[float, float]], tokens: list[int],
             context: int) -> dict[str, Any]:
    out: dict[str, Any] = {"tokens": tokens}
    for clock, i in (("", 0), ("_cpu", 1)):
        ttft = stamps[0][i] - t0[i]
        decode = (stamps[-1][i] - stamps[0][i]) / (len(stamps) - 1) if len(stamps) > 1 else float("nan")
        out.update({f"ttft{clock}_s": ttft, f"prefill{clock}_tok_s": context / ttft, f"decode{clock}_ms": decode * 1000})
    return out


def _agree(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def run(
    model_name: str | None,
    contexts: list[int],
    tokens: int = 32,
    repeats: int = 1,
    progress: Callable[[str], None] = lambda s: None,
    kv_bits: int | None = None,
) -> dict[str, Any]:
    """`kv_bits`: both arms with their KV cache quantized to these bits (ours:
    engine/kv/kv_format.py, group 64; mlx-lm: its QuantizedKVCache from the first token),
    beside both at full precision ("ours_full", "mlx_lm_full")."""
    import mlx.core as mx

    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.kv.kv_format import KVFormat

    full = Engine.load(model_name, EngineConfig(prefix_cache=False), progress=lambda s: None)
    engine = full
    if kv_bits:
        engine = Engine(full.model, full.tokenizer, full.info,
                        EngineConfig(prefix_cache=False, kv_format=KVFormat(kv_bits, kv_bits)))
    model, tok = engine.model, engine.tokenizer
    out: dict[str, Any] = {"bench": "decode.contexts", "model": engine.info.name, "dtype": engine.info.dtype,
                           "kv_bits": kv_bits,
                           "device": str(mx.default_device()), "tokens": tokens, "repeats": repeats,
                           "context_length": engine.context_length, "contexts": {}}
    try:
        too_long = [c for c in contexts if c + tokens > engine.context_length]
        if too_long:
            raise ValueError(f"contexts {too_long} + {tokens} tokens exceed the model's window "
                             f"({engine.context_length} tokens)")
        warm = session_prompt(tok, 256)[0]  # page in weights, allocate buffers
        ours(engine, warm, 4)
        mlx_lm(model, tok, warm, 4, kv_bits)
        names = ("ours", "mlx_lm") + (("ours_full", "mlx_lm_full") if kv_bits else ())
        do = {"ours": lambda p: ours(engine, p, tokens), "mlx_lm": lambda p: mlx_lm(model, tok, p, tokens, kv_bits),
              "ours_full": lambda p: ours(full, p, tokens), "mlx_lm_full": lambda p: mlx_lm(model, tok, p, tokens)}
        for c in contexts:
            prompt, source = session_prompt(tok, c)
            runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
            for r in range(repeats):
                for arm in (names if r % 2 == 0 else names[::-1]):
                    res = do[arm](prompt)
                    runs[arm].append(res)
                    progress(f"context {c} {arm:>6}: prefill {res['prefill_tok_s']:.1f} tok/s "
                             f"(ttft {res['ttft_s']:.1f}s; by CPU time {res['prefill_cpu_tok_s']:.1f} tok/s), "
                             f"decode {res['decode_ms']:.1f} ms/token (CPU {res['decode_cpu_ms']:.1f}), "
                             f"{len(res['tokens'])} tokens")

            def med(arm: str, key: str) -> float:
                return statistics.median(x[key] for x in runs[arm])

            row = {"prompt": source}
            for arm in names:
                row[arm] = {"prefill_tok_s": round(med(arm, "prefill_tok_s"), 1), "ttft_s": round(med(arm, "ttft_s"), 2),
                            "decode_ms_per_token": round(med(arm, "decode_ms"), 1),
                            "prefill_cpu_tok_s": round(med(arm, "prefill_cpu_tok_s"), 1),
                            "decode_cpu_ms_per_token": round(med(arm, "decode_cpu_ms"), 1),
                            "generated": [len(x["tokens"]) for x in runs[arm]]}
            for clock in ("", "_cpu"):
                row[f"prefill{clock}_ratio"] = round(
                    row["ours"][f"prefill{clock}_tok_s"] / row["mlx_lm"][f"prefill{clock}_tok_s"], 3)
                row[f"decode{clock}_ratio"] = round(
                    row["mlx_lm"][f"decode{clock}_ms_per_token"] / row["ours"][f"decode{clock}_ms_per_token"], 3)
            if kv_bits:  # what quantizing did to each side's speed
                for side in ("ours", "mlx_lm"):
                    row[f"{side}_quantized_over_full"] = {
                        "prefill": round(row[side]["prefill_tok_s"] / row[f"{side}_full"]["prefill_tok_s"], 3),
                        "decode": round(row[f"{side}_full"]["decode_ms_per_token"] / row[side]["decode_ms_per_token"], 3)}
            row["agreeing_tokens"] = [_agree(a["tokens"], b["tokens"]) for a, b in zip(runs["ours"], runs["mlx_lm"])]
            row["samples"] = {arm: [{k: round(x[k], 1) for k in ("prefill_tok_s", "decode_ms", "prefill_cpu_tok_s",
                                                                  "decode_cpu_ms")} for x in runs[arm]] for arm in runs}
            out["contexts"][str(c)] = row
    finally:
        engine.close()
        if engine is not full:
            full.close()
    out["ratios"] = "ours over mlx-lm (> 1: ours is faster): prefill tokens/s, and decode ms/token inverted"
    return out
