"""Quantized KV cache (engine/kv_format.py) composed with the batch, verified proposals,
the real proposers and the prefix cache (RAM and SSD), on the default model and on
tiny random-weight models of the families whose attention it quantizes: full
(llama), sliding window (gemma3_text), sliding window + sinks (gpt_oss), hybrid
recurrent (qwen3_next: Gated DeltaNet state stays full precision) and a CacheList of
Mamba-2 state beside attention (falcon_h1).

References: mlx-lm's own QuantizedKVCache (same quantization, its own attention) for
greedy decoding; a single forward over the same quantized cache for the near-tie
proofs.

Quantization widens the near-tie: rounding a key to 8 or 4 bits is discontinuous, so
the float noise two correct paths differ by (1e-4 in the logits at full precision:
matmul shapes of a batch or a round, numpy's or MLX's softmax) moves an element
across a rounding step now and then, and that step is much larger than the noise.
Measured on the default model over TEXTS, our forward against mlx-lm's quantized
forward of the same prompt: max |logit difference| 0.22-0.50 at K8, 0-1.95 at K4
(one prompt identical: no element crossed a step). The proofs below accept a
divergence only where both tokens are the reference's top two and their logits are
within QUANT_TIE of the format's narrowest bits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

from jumpahead.bench.family_models import build
from jumpahead.engine.kv_format import KVFormat, parse_kv_format
from jumpahead.engine.model_runner import ModelRunner
from jumpahead.engine.types import GenerationRequest
from tests.oracle import assert_same_or_near_tie
from tests.test_families import N, TEXTS, ScriptedVerified, staggered_four, tokens_of

REPO = Path(__file__).resolve().parents[1]
FAMS = ["llama", "gemma3_text", "gpt_oss", "qwen3_next", "falcon_h1"]
DEFAULT = pytest.param("default", marks=pytest.mark.slow)  # the real default model: slow here
FORMATS = {"k8v8": KVFormat(8, 8), "k4v4": KVFormat(4, 4), "k8v4": KVFormat(8, 4)}
QUANT_TIE = {8: 1.0, 4: 3.0}  # about twice the measured noise (module docstring)


def tie(fmt: KVFormat) -> float:
    return QUANT_TIE[min(fmt.key_bits, fmt.value_bits)]


@pytest.fixture(scope="module")
def tokenizer_dir():
    from jumpahead.engine.default_model import ensure_default_model

    return ensure_default_model(progress=lambda s: None)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory, tokenizer_dir):
    """(fam, format name) -> dict(model, tokenizer, engine, prompts, folder), one engine at a time."""
    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.loader import load_model

    root = tmp_path_factory.mktemp("kvfam")
    made: dict[tuple, dict] = {}

    def get(fam: str, fmt: str) -> dict:
        key = (fam, fmt)
        if key not in made:
            for other in made.values():
                other["engine"].close()
            made.clear()
            folder = None if fam == "default" else build(fam, root, tokenizer_dir, size="kv")
            model, tok, info = load_model(None if folder is None else str(folder), progress=lambda s: None)
            eng = Engine(model, tok, info, EngineConfig(max_batch=8, cost_aware=False, prefix_cache=False,
                                                        kv_format=FORMATS[fmt]))
            prompts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
                       for t in TEXTS]
            made[key] = {"model": model, "tokenizer": tok, "info": info, "engine": eng, "prompts": prompts,
                         "folder": folder, "format": FORMATS[fmt], "ordinary": {}}
        return made[key]

    yield get
    for f in made.values():
        f["engine"].close()


def ordinary(f: dict, i: int, n: int = N) -> list[int]:
    if (i, n) not in f["ordinary"]:
        r = GenerationRequest(prompt=f["prompts"][i], max_tokens=n, methods=["none"])
        f["ordinary"][(i, n)] = tokens_of(f["engine"].generate_sync(r))
    return f["ordinary"][(i, n)]


def one_forward(f: dict):
    """Reference logits: the whole sequence in one forward over a fresh quantized cache."""
    runner = f["engine"].runner

    def logits(tokens: list[int]) -> mx.array:
        cache = runner.new_cache()
        cache.ends = [0]
        out = runner.forward([tokens], cache)[0, -1].astype(mx.float32)
        mx.eval(out)
        return out

    return logits


def check(f: dict, i: int, got: list[int], want: list[int]) -> str:
    return assert_same_or_near_tie(f["model"], f["prompts"][i], got, want, tol=tie(f["format"]),
                                   logits_fn=one_forward(f))


def mlx_lm_quantized_greedy(model, prompt: list[int], n: int, fmt: KVFormat) -> list[int]:
    """mlx-lm's own path: its QuantizedKVCache in every layer, its quantized attention."""
    from mlx_lm.models.cache import QuantizedKVCache

    assert fmt.key_bits == fmt.value_bits  # mlx-lm's cache has one width for both
    cache = [QuantizedKVCache(group_size=fmt.group_size, bits=fmt.key_bits) for _ in model.layers]
    logits = model(mx.array([prompt], dtype=mx.int32), cache=cache)
    out = []
    for _ in range(n):
        t = int(mx.argmax(logits[0, -1]).item())
        out.append(t)
        logits = model(mx.array([[t]], dtype=mx.int32), cache=cache)
    return out


@pytest.mark.parametrize("fam", [DEFAULT, "llama"])
@pytest.mark.parametrize("fmt", ["k8v8", "k4v4"])
def test_greedy_equals_mlx_lm_quantized_cache(quantized, fam, fmt):
    f = quantized(fam, fmt)
    got = ordinary(f, 2)
    want = mlx_lm_quantized_greedy(f["model"], f["prompts"][2], len(got), f["format"])
    check(f, 2, got, want)
    # and the cache really holds the quantized triples (words, scales, biases)
    cache = f["engine"].runner.new_cache()
    cache.ends = [0]
    f["engine"].runner.forward([f["prompts"][2]], cache)
    assert all(isinstance(l.keys, tuple) and l.keys[0].dtype == mx.uint32 for l in cache.attention)


@pytest.mark.parametrize("fam", [DEFAULT, *FAMS])
@pytest.mark.parametrize("fmt", ["k8v4", "k4v4"])
def test_batch_of_four_equals_alone(quantized, fam, fmt):
    """Four rows with different prompt lengths and staggered joins, odd rows carrying
    partly wrong verified proposals (rounds of mixed widths), each equal to alone."""
    f = quantized(fam, fmt)
    alone = [ordinary(f, i) for i in range(4)]
    got = staggered_four(f, alone, methods=["none"])
    for i in range(4):
        check(f, i, got[i], alone[i])


@pytest.mark.parametrize("fam", FAMS)
@pytest.mark.parametrize("mode", ["accept", "partial", "first"])
def test_verified_proposals_equal_ordinary(quantized, fam, mode):
    f = quantized(fam, "k8v4")
    want = ordinary(f, 1)
    r = GenerationRequest(prompt=f["prompts"][1], max_tokens=N)
    prop = ScriptedVerified(want, mode)
    r.proposers = [prop]
    chunks = f["engine"].generate_sync(r)
    assert prop.proposed > 0
    assert chunks[-1].fill["verified"]["rejected" if mode != "accept" else "accepted"] > 0
    check(f, 1, tokens_of(chunks), want)


@pytest.mark.parametrize("fam", [DEFAULT, "gemma3_text", "qwen3_next"])
@pytest.mark.parametrize("method", ["echo", "ngram", "strict"])
def test_methods_equal_ordinary(quantized, fam, method):
    f = quantized(fam, "k8v4")
    want = ordinary(f, 2)
    chunks = f["engine"].generate_sync(GenerationRequest(prompt=f["prompts"][2], max_tokens=N, methods=[method]))
    assert "declined" not in chunks[-1].fill, chunks[-1].fill
    check(f, 2, tokens_of(chunks), want)


COLD_AND_WARM = r"""
import json, sys
import jumpahead.engine
from jumpahead.engine.engine import Engine, EngineConfig
from jumpahead.engine.kv_format import KVFormat
from jumpahead.engine.types import GenerationRequest
folder, directory, prompt, bits = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
fmt = KVFormat(*bits)
eng = Engine.load(folder or None, EngineConfig(prefix_cache_dir=directory, kv_format=fmt), progress=lambda s: None)
chunks = eng.generate_sync(GenerationRequest(prompt=prompt, max_tokens=12, methods=["none"]))
stats = eng.metrics()["prefix_cache"]
print(json.dumps({"tokens": [t for c in chunks for t in c.tokens], "cached": chunks[-1].cached_tokens,
                  "ssd_hit_tokens": stats["ssd_hit_tokens"]}))
eng.close()
"""


@pytest.mark.parametrize("fam", [DEFAULT, "llama", "gemma3_text", "qwen3_next", "falcon_h1"])
def test_prefix_cache_second_turn_in_ram_and_from_ssd(quantized, fam, tmp_path):
    """An agent's second turn hits the quantized first turn's prefix from RAM and,
    in a new process, from SSD, with the cold tokens; the stored bytes are the
    quantized ones (well under full precision's)."""
    from jumpahead.engine.engine import Engine, EngineConfig

    f = quantized(fam, "k8v4")
    tok, fmt = f["tokenizer"], f["format"]
    messages = [{"role": "user", "content": TEXTS[0]}]
    first = f["prompts"][0]
    directory = str(tmp_path / "pc")
    eng = Engine(f["model"], tok, f["info"], EngineConfig(prefix_cache_dir=directory, kv_format=fmt))
    try:
        answer = tokens_of(eng.generate_sync(GenerationRequest(prompt=first, max_tokens=12, methods=["none"])))
        check(f, 0, answer, ordinary(f, 0, 12))
        messages += [{"role": "assistant", "content": tok.decode([t for t in answer if t not in tok.eos_token_ids])},
                     {"role": "user", "content": "The tool printed: 42 files, 3 folders."}]
        second = tok.apply_chat_template(messages, add_generation_prompt=True)
        assert second[: len(first)] == first
        cold = tokens_of(f["engine"].generate_sync(GenerationRequest(prompt=second, max_tokens=12, methods=["none"])))
        chunks = eng.generate_sync(GenerationRequest(prompt=second, max_tokens=12, methods=["none"]))
        assert chunks[-1].cached_tokens >= len(first)
        assert_same_or_near_tie(f["model"], second, tokens_of(chunks), cold, tol=tie(fmt), logits_fn=one_forward(f))
        pc = eng.prefix_cache
        assert pc.counters["publish_errors"] == 0 and pc.counters["published"] >= 3, pc.counters
        if eng.runner.packing == "bytes" and not eng.runner.snapshots:  # stored quantized, no state beside
            stats = eng.metrics()["prefix_cache"]
            per_token = stats["ram_bytes"] / stats["published_tokens"]
            full = ModelRunner(f["model"]).kv_bytes_per_token  # the same layers at full precision
            assert per_token == eng.runner.kv_bytes_per_token and per_token <= full / 2.5, (per_token, full)
        pc.flush(timeout=60)
    finally:
        eng.close()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    folder = "" if f["folder"] is None else str(f["folder"])
    args = [folder, directory, json.dumps(second), json.dumps([fmt.key_bits, fmt.value_bits, fmt.group_size])]
    out = subprocess.run([sys.executable, "-c", COLD_AND_WARM, *args],
                         capture_output=True, text=True, cwd=str(REPO), env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    warm = json.loads(out.stdout.strip().splitlines()[-1])
    assert warm["cached"] >= len(first) and warm["ssd_hit_tokens"] >= len(first), warm
    assert_same_or_near_tie(f["model"], second, warm["tokens"], cold, tol=tie(fmt), logits_fn=one_forward(f))


@pytest.mark.slow
def test_bytes_per_token_kv4_at_least_3x_smaller(quantized):
    """On the default model: the bytes per token /health reports (ModelRunner's) equal
    the live cache's buffers over their capacity, and K4/V4 is at least 3x smaller than
    full precision, K8/V8 at least 1.8x."""
    f = quantized("default", "k4v4")
    measured = {}
    for name, fmt in (("full", None), ("k8v8", KVFormat(8, 8)), ("k4v4", KVFormat(4, 4))):
        runner = ModelRunner(f["model"], fmt)
        cache = runner.new_cache()
        cache.ends = [0]
        runner.forward([f["prompts"][0]], cache)
        mx.eval(cache.arrays())
        measured[name] = sum(a.nbytes for a in cache.arrays()) / cache.attention[0].capacity
        assert measured[name] == runner.kv_bytes_per_token, (name, measured[name], runner.kv_bytes_per_token)
    assert measured["full"] / measured["k4v4"] >= 3.0, measured
    assert measured["full"] / measured["k8v8"] >= 1.8, measured


def test_bad_formats_are_refused_clearly(tokenizer_dir, tmp_path):
    with pytest.raises(ValueError, match="bits must be one of"):
        KVFormat(7, 7)
    with pytest.raises(ValueError, match="needs --kv-bits"):
        parse_kv_format(None, 4)
    assert parse_kv_format(None) is None and parse_kv_format(8).value_bits == 8
    # a head width the group size does not divide: refused at load, naming the flag
    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.loader import load_model

    folder = build("llama", tmp_path, tokenizer_dir, size="kv")  # head_dim 64
    model, tok, info = load_model(str(folder), progress=lambda s: None)
    with pytest.raises(ValueError, match="kv-group-size"):
        Engine(model, tok, info, EngineConfig(prefix_cache=False, kv_format=KVFormat(8, 8, group_size=128)))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "jumpahead.app.cli", "serve", "--kv-bits", "7"],
                         capture_output=True, text=True, cwd=str(REPO), env=env, timeout=120)
    assert out.returncode == 2 and "--kv-bits" in out.stderr


@pytest.mark.parametrize("bits", [(8, 8), (4, 4), (8, 4)])
@pytest.mark.parametrize("L", [1, 5, 300])
def test_both_attention_paths_agree_with_mlx_lm(monkeypatch, bits, L):
    """The CPU path (dequantize, then the float attention) and the GPU path
    (quantized_matmul on the packed words) against each other and, where mlx-lm can
    (one width for keys and values, no sinks), against mlx-lm's quantized attention;
    with a causal mask, a boolean per-row mask, and attention sinks."""
    from mlx_lm.models.base import quantized_scaled_dot_product_attention

    from jumpahead.engine import attention as att

    fmt = KVFormat(*bits)
    mx.random.seed(L)
    B, Hq, Hkv, S, D = 2, 6, 2, 320, 64
    q = mx.random.normal((B, Hq, L, D))
    k, v = fmt.quantize(mx.random.normal((B, Hkv, S, D)), fmt.key_bits), fmt.quantize(mx.random.normal((B, Hkv, S, D)), fmt.value_bits)
    rows = mx.arange(S)[None, None, None, :] < mx.array([S - 7, S])[:, None, None, None]  # row 0 sees fewer keys
    rows = mx.broadcast_to(rows, (B, 1, L, S))  # the engine's per-row masks are [B, 1, L, S]
    masks = {"causal": "causal", "rows": rows} if L > 1 else {"none": None, "rows": rows}
    sinks = mx.random.normal((Hq,))
    for name, mask in masks.items():
        for s in (None, sinks):
            monkeypatch.setattr(att, "QUANTIZED_MATMUL_ON_CPU", False)
            cpu = att.quantized_attention(q, k, v, 0.125, mask, s, fmt)
            monkeypatch.setattr(att, "QUANTIZED_MATMUL_ON_CPU", True)
            gpu = att.quantized_attention(q, k, v, 0.125, mask, s, fmt)
            assert float(mx.abs(cpu - gpu).max()) < 1e-4, (name, s is not None)
            if s is None and fmt.key_bits == fmt.value_bits:
                ref = quantized_scaled_dot_product_attention(q, k, v, 0.125, mask, fmt.group_size, fmt.key_bits)
                assert float(mx.abs(cpu - ref).max()) < 1e-4, name


def test_serve_kv_bits_over_http(tokenizer_dir, tmp_path):
    """`jumpahead serve --kv-bits 8 --kv-value-bits 4` on a hybrid model: /health names
    the format and its bytes per token, a tool call through the openai SDK and a second
    turn that hits the quantized prompt cache."""
    import httpx
    import openai

    from tests.serving import start_serve

    folder = build("qwen3_next", tmp_path, tokenizer_dir, size="kv")
    server = start_serve(["--model", str(folder), "--kv-bits", "8", "--kv-value-bits", "4"], tmp_path)
    try:
        server.wait_healthy(600)
        health = httpx.get(f"{server.url}/health", timeout=30).json()
        kv = health["layers"]["kv_cache"]
        assert kv["format"] == "k8v4-g64" and kv["key_bits"] == 8 and kv["value_bits"] == 4
        # 2 attention layers, 2 KV heads of 64: K 64+8 and V 32+8 bytes per head and token
        assert kv["bytes_per_token"] == 2 * 2 * (64 + 2 * 4 + 32 + 2 * 4), kv
        chat = openai.OpenAI(base_url=f"{server.url}/v1", api_key="dummy", max_retries=0, timeout=300)
        # an enum keeps a random-weight model's arguments short (the grammar closes them)
        tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["unit"]}}}
        messages = [{"role": "user", "content": "What is the weather in Paris? " * 20}]
        forced = {"type": "function", "function": {"name": "get_weather"}}
        r = chat.chat.completions.create(model="local", messages=messages, tools=[tool], tool_choice=forced,
                                         max_tokens=60, temperature=0)
        call = r.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather"
        assert json.loads(call.function.arguments)["unit"] in ("celsius", "fahrenheit")
        messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}]
        r2 = chat.chat.completions.create(model="local", messages=messages, tools=[tool], max_tokens=8, temperature=0)
        assert r2.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens // 2, r2.usage
    finally:
        server.stop()
