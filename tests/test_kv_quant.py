"""Quantized KV cache (engine/kv/kv_format.py) composed with the batch, verified proposals,
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
from jumpahead.engine.kv.kv_format import KVFormat, parse_kv_format
from jumpahead.engine.kv.model_runner import ModelRunner
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
    from jumpahead.engine.model.default_model import ensure_default_model

    return ensure_default_model(progress=lambda s: None)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory, tokenizer_dir):
    """(fam, format name) -> dict(model, tokenizer, engine, prompts, folder), one engine at a time."""
    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import load_model

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
    return f["engine"].runner.fresh_logits


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
from jumpahead.engine.kv.kv_format import KVFormat
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
    from jumpahead.engine.model.loader import load_model

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

    from jumpahead.engine.kv import attention as att

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


# --- logit-level oracle: both arms read the same once-quantized keys and values ----------
#
# The reference is mlx-lm's own model over its own caches (make_prompt_cache), one row,
# the whole sequence in one forward, each attention cache's writes passed through
# mx.quantize + mx.dequantize of the same format: it reads the once-quantized keys and
# values the format defines, through mlx-lm's own attention (its rope, masks, sliding
# windows, MLA, shared layers). Quantizing per token makes that equal to the engine's
# packed store however its rows were batched, so the logits agree to float32 noise
# (measured 1e-6..4e-6 of the logits' scale on every family here), and TIGHT is far
# below what a wrong mask, offset or scale moves them by (a 2% attention scale in
# batched forwards: 2-25% of the scale). Float noise can still put one element on the
# other side of a rounding midpoint (measured: a few per test at K8, 2e-3..8e-3 in the
# logits); only there, where the reference's own value lies within TIE of the
# midpoint between its code and the engine's stored neighbouring code, the reference
# takes the engine's code, and those elements are counted and must stay rare.

ORACLE_FAMS = ["llama", "gemma3_text", "gpt_oss", "qwen3_next", "falcon_h1", "deepseek_v3", "gemma4_text",
               "qwen3_5", "glm4_moe_lite"]
TIGHT = 2e-5  # of max |reference logit|
TIE = 0.01  # of a quantization step: how near the midpoint a rounding may go either way
# Where a flip escapes TIE (noise a little above it, measured 2e-4..8e-3 in the logits on
# gemma4_text and qwen3_5 at K8): a row's check may be this loose, a few times per test
# (LOOSE_AT_MOST of its 28 row checks); a wrong scale, mask or offset moves every
# batched row by 5-25% of the scale.
ROUNDING = 2e-3
LOOSE_AT_MOST = 3


@pytest.fixture(scope="module")
def oracle_models(tmp_path_factory, tokenizer_dir):
    from jumpahead.engine.model.loader import load_model

    root = tmp_path_factory.mktemp("kvoracle")
    made: dict = {}

    def get(fam: str, full: bool = False):
        """(model, prompts), or with `full` (model, prompts, tokenizer, info)."""
        if fam not in made:
            made.clear()
            model, tok, info = load_model(str(build(fam, root, tokenizer_dir, size="kv")), progress=lambda s: None)
            prompts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
                       for t in TEXTS]
            made[fam] = (model, prompts, tok, info)
        return made[fam] if full else made[fam][:2]

    return get


class QuantizedReference:
    """Reference logits over once-quantized keys and values (see above); `engine`: a
    RowKVCache whose stored codes settle exact rounding ties, `row` its row."""

    def __init__(self, model, fmt: KVFormat) -> None:
        self.model, self.fmt = model, fmt
        self.adopted = self.elements = 0
        self.loose: list[str] = []  # row checks within ROUNDING but not TIGHT

    def _engine_view(self, layer, row: int, T: int, bits: int, values: bool, margin: int):
        from jumpahead.engine.kv.row_cache import SlidingLayerCache

        buf = layer.values if values else layer.keys
        if buf is None:
            return 0, None
        d = mx.dequantize(*(a[row : row + 1] for a in buf), group_size=self.fmt.group_size, bits=bits)
        cap = d.shape[2]
        if isinstance(layer, SlidingLayerCache) and T > cap:  # a ring: position p at slot p % cap
            first = T - cap + margin  # slots the last forward's padding may have written are skipped
            if first >= T:
                return 0, None
            return first, d[:, :, mx.array([p % cap for p in range(first, T)], dtype=mx.int32)]
        return 0, d[:, :, :T]

    def _quantized(self, x: mx.array, bits: int, layer, row: int, values: bool, margin: int) -> mx.array:
        gs = self.fmt.group_size
        w, scales, biases = mx.quantize(x, group_size=gs, bits=bits)
        r = mx.dequantize(w, scales, biases, group_size=gs, bits=bits)
        self.elements += x.size
        if layer is None:
            return r
        first, e = self._engine_view(layer, row, x.shape[2], bits, values, margin)
        if e is None or e.shape[:2] != x.shape[:2] or e.shape[-1] != x.shape[-1]:
            return r
        step = mx.repeat(scales, gs, axis=-1)[:, :, first:]
        xs, rs = x[:, :, first:].astype(mx.float32), r[:, :, first:].astype(mx.float32)
        gap = mx.abs(rs - e) / step
        tie = (gap > 0.5) & (gap < 1.5) & (mx.abs(xs - (rs + e) / 2) < TIE * step)
        n = int(tie.sum().item())
        if not n:
            return r
        self.adopted += n
        return mx.concatenate([r[:, :, :first], mx.where(tie, e.astype(r.dtype), r[:, :, first:])], axis=2)

    def logits(self, tokens: list[int], engine=None, row: int = 0, margin: int = 0) -> mx.array:
        """[len(tokens), V] logits of one forward over a fresh quantizing cache."""
        from mlx_lm.models.cache import CacheList, KVCache, RotatingKVCache, make_prompt_cache

        fmt = self.fmt

        def wrap(c, layer):
            if isinstance(c, CacheList):
                for i, child in enumerate(c.caches):
                    wrap(child, None if layer is None else layer.caches[i])
            elif isinstance(c, (KVCache, RotatingKVCache)):
                real = c.update_and_fetch
                c.update_and_fetch = lambda k, v: real(self._quantized(k, fmt.key_bits, layer, row, False, margin),
                                                       self._quantized(v, fmt.value_bits, layer, row, True, margin))

        cache = make_prompt_cache(self.model)
        layers = engine.layers if engine is not None else [None] * len(cache)
        assert len(layers) == len(cache)
        for c, layer in zip(cache, layers):
            wrap(c, layer)
        out = self.model(mx.array([tokens], dtype=mx.int32), cache=cache)[0].astype(mx.float32)
        mx.eval(out)
        return out


def assert_rows_match(ref: QuantizedReference, cache, seqs: list[list[int]], widths: list[int], logits: mx.array,
                      offsets: list[int], margin: int, what: str) -> None:
    """Row b's logits at its last widths[b] positions equal the reference's for seqs[b]."""
    mx.eval(logits)
    for b, (seq, w) in enumerate(zip(seqs, widths)):
        want = ref.logits(seq, cache, b, margin)[len(seq) - w :]
        got = logits[offsets[b] : offsets[b] + w]
        diff, scale = float(mx.abs(got - want).max()), float(mx.abs(want).max())
        assert diff <= ROUNDING * scale, f"{what}: row {b} logits differ by {diff:.3g} (scale {scale:.3g})"
        if diff > TIGHT * scale:
            ref.loose.append(f"{what} row {b}: {diff:.3g} of {scale:.3g}")
    assert ref.adopted <= 1e-4 * ref.elements, (ref.adopted, ref.elements)


def rounds_against_reference(model, prompts: list[list[int]], fmt: KVFormat, rounds: int = 6) -> dict:
    """Four rows prefilled in one padded forward, then `rounds` verifying rounds of
    mixed widths at the rows' different offsets, each rejecting part of its tokens
    (attention rolls back by pointer, recurrent state by replay), every round's logits
    against the reference over the row's committed tokens plus the round's. Returns
    what the rounds did (for the sliding layers' rings)."""
    runner = ModelRunner(model, fmt)
    ref = QuantizedReference(model, fmt)
    cache = runner.new_cache()
    cache.ends = [0] * 4
    logits, offsets = runner.forward_ragged(prompts, cache, [1] * 4)
    assert_rows_match(ref, cache, prompts, [1] * 4, logits, offsets, 0, "prefill")
    cache.advance([len(p) for p in prompts])
    seqs = [list(p) for p in prompts]
    wrapped = 0
    for r in range(rounds):
        widths = [(r + b) % 4 + 1 for b in range(4)]
        new = [[(37 * i + 11 * b + 101 * r) % 3000 + 100 for i in range(w)] for b, w in enumerate(widths)]
        before = cache.states()
        logits, offsets = runner.forward_ragged(new, cache, widths)
        wrapped += any(cache.layers and l.plan.wraps(l.window) for l in cache.windowed)
        assert_rows_match(ref, cache, [s + n for s, n in zip(seqs, new)], widths, logits, offsets, max(widths),
                          f"round {r}")
        keep = [1 + (r + 2 * b) % w for b, w in enumerate(widths)]  # a rejected proposal's tail rolls back
        runner.replay(cache, new, keep, before)
        cache.advance(keep)
        seqs = [s + n[:k] for s, n, k in zip(seqs, new, keep)]
    assert len(ref.loose) <= LOOSE_AT_MOST, ref.loose
    return {"wrapped": wrapped, "adopted": ref.adopted, "elements": ref.elements, "loose": ref.loose}


@pytest.mark.parametrize("fam", ORACLE_FAMS)
@pytest.mark.parametrize("fmt", ["k8v4", "k4v4"])
def test_batched_rounds_and_rollbacks_equal_the_quantized_reference(oracle_models, fam, fmt):
    """Rows at different offsets in one padded (or packed) forward, each equal alone
    (the reference is one row), after rejected verified rounds equal to a fresh
    forward; sliding layers' rings wrap on the way (window 8)."""
    model, prompts = oracle_models(fam)
    if not ModelRunner(model).trimmable:
        pytest.skip(f"{fam}: rounds are not padding-safe")
    done = rounds_against_reference(model, prompts, FORMATS[fmt])
    if fam in ("gemma3_text", "gpt_oss", "gemma4_text"):
        assert done["wrapped"] > 0, done


@pytest.mark.parametrize("fam", ["llama", "gemma3_text", "deepseek_v3"])
def test_the_oracle_catches_an_attention_scale_2pc_off_in_batched_forwards(oracle_models, monkeypatch, fam):
    """The oracle is sharp: attention's scale 2% off only where a forward carries more
    than one row (the packed path of llama, the padded one of gemma3_text, MLA's float
    path of deepseek_v3) fails it; the oracle itself is not patched."""
    from jumpahead.engine.kv import attention as att
    from jumpahead.engine.kv import ragged

    model, prompts = oracle_models(fam)
    real = att.attention

    def skewed(q, k, v, scale, mask=None, sinks=None, fmt=None):
        return real(q, k, v, scale * 1.02 if q.shape[0] > 1 else scale, mask, sinks, fmt=fmt)

    monkeypatch.setattr(att, "attention", skewed)
    monkeypatch.setattr(ragged, "attention", skewed)
    with pytest.raises(AssertionError, match="logits differ"):  # by far more than ROUNDING
        rounds_against_reference(model, prompts, KVFormat(8, 4), rounds=1)
    monkeypatch.setattr(att, "attention", real)
    monkeypatch.setattr(ragged, "attention", real)
    rounds_against_reference(model, prompts, KVFormat(8, 4), rounds=1)  # and unpatched it passes


@pytest.mark.parametrize("fam", ["deepseek_v3", "glm4_moe_lite", "gemma4_text", "qwen3_5"])
def test_kv_bits_8_loads_and_decodes_like_mlx_lm_over_the_same_quantized_kv(oracle_models, fam):
    """`--kv-bits 8` on MLA latents (deepseek_v3, glm4_moe_lite), gemma4's KV-shared
    layers and a wrapper model (qwen3_5): the engine loads, and its greedy tokens equal
    greedy decoding of the quantized reference (a near-tie of its logits at most)."""
    from jumpahead.engine.engine import Engine, EngineConfig

    model, prompts, tok, info = oracle_models(fam, full=True)
    fmt = KVFormat(8, 8)
    eng = Engine(model, tok, info, EngineConfig(max_batch=2, prefix_cache=False, kv_format=fmt, warm_up=False))
    try:
        got = tokens_of(eng.generate_sync(GenerationRequest(prompt=prompts[2], max_tokens=N, methods=["none"])))
        assert eng.runner.describe()["kv_cache"]["format"] == "k8v8-g64"
    finally:
        eng.close()
    ref = QuantizedReference(model, fmt)
    want, seq = [], list(prompts[2])
    for _ in range(len(got)):
        want.append(int(mx.argmax(ref.logits(seq)[-1]).item()))
        seq.append(want[-1])
    assert_same_or_near_tie(model, prompts[2], got, want, logits_fn=lambda t: ref.logits(t)[-1])


@pytest.mark.parametrize("fam", ["qwen3_5", "gemma4_text"])
def test_install_routes_the_attention_classes_of_wrapper_models(oracle_models, monkeypatch, fam):
    """qwen3_5's model class wraps qwen3_next's attention layers (another mlx-lm
    module): install patches every module whose classes appear in the model, so our
    cache layers' attention runs engine/kv/attention.py there too, quantized or not."""
    import sys as _sys

    from jumpahead.engine.kv import attention as att

    model, prompts = oracle_models(fam)
    calls = []
    real = att.attention

    def counting(q, k, v, scale, mask=None, sinks=None, fmt=None):
        calls.append(fmt)
        return real(q, k, v, scale, mask, sinks, fmt=fmt)

    monkeypatch.setattr(att, "attention", counting)
    for fmt in (None, KVFormat(8, 8)):
        runner = ModelRunner(model, fmt)
        modules = {type(m).__module__ for _, m in model.named_modules()}
        callers = [m for m in modules if hasattr(_sys.modules[m], "scaled_dot_product_attention")]
        assert callers and all(getattr(_sys.modules[m].scaled_dot_product_attention, "_jumpahead", False)
                               for m in callers), callers
        calls.clear()
        cache = runner.new_cache()
        cache.ends = [0]
        mx.eval(runner.forward([prompts[0]], cache))
        n_attention = len(cache.attention)
        assert len(calls) >= n_attention > 0, (calls, n_attention)
        if fmt is not None:  # the packed triples were read, not only dequantized views
            assert sum(c is fmt for c in calls) >= n_attention, calls
