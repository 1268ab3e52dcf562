"""The DeepSeek-V3 layout of checkpoint-native MTP (DeepSeek-V3, GLM-4.5 `glm4_moe`,
GLM-4.7-Flash `glm4_moe_lite`): the MTP module is stored as one extra decoder layer
`model.layers.{num_hidden_layers}.*` (num_nextn_predict_layers = 1), with

    e = enorm(embed(x_{t+1}))            the target's own embedding (the layer's copy of
                                         `embed_tokens` is the same table; not read)
    h = hnorm(h_t)                       the target's hidden state at t after its final
                                         norm (what the trunk returns)
    x = eh_proj(concat([e, h]))          embedding first, then hidden
    g = layer(x)                         a decoder layer of the model's own class (its
                                         attention, MoE MLP), rope at t
    logits = shared_head.head(shared_head.norm(g))

as vLLM's deepseek_mtp.py (DeepSeekMultiTokenPredictorLayer.forward: enorm on the
embeddings, hnorm on previous_hidden_states, `torch.cat([inputs_embeds,
previous_hidden_states])`, eh_proj, mtp_block, residual added; compute_logits:
shared_head.norm then shared_head.head) and its glm4_moe_mtp.py compute it. vLLM
zeroes the embedding at absolute position 0 ("not needed by MTP"); so do we. Chaining
feeds g (before shared_head.norm, as vLLM feeds its forward's output) back in.

The layer's weights go through the model's own mlx-lm `sanitize` renamed to layer 0
(per-expert tensors stacked, MLA's kv_b_proj split into embed_q / unembed_out), so
they land in mlx-lm's parameter layout exactly as the trunk's did.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn

from .mtp import MtpError, install_weights, model_type, text_args

NEXTN_MODEL_TYPES = ("deepseek_v3", "glm4_moe", "glm4_moe_lite")
_OWN = ("enorm.", "hnorm.", "eh_proj.", "shared_head.")


def nextn_prefix(model: nn.Module) -> str:
    return f"model.layers.{text_args(model).num_hidden_layers}."


def read_nextn_weights(folder: str | Path, prefix: str) -> dict[str, mx.array] | None:
    """The tensors under `prefix` (the MTP layer) of a Hugging Face folder, names as
    stored; None: none there (mlx_lm.convert drops them)."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        return None
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({folder / f for k, f in weight_map.items() if k.startswith(prefix)})
    else:
        files = sorted(folder.glob("*.safetensors"))
    out: dict[str, mx.array] = {}
    for f in files:
        out.update({k: v for k, v in mx.load(str(f)).items() if k.startswith(prefix)})
    return out or None


class _SharedHead(nn.Module):
    def __init__(self, dim: int, vocab: int, eps: float) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(dim, eps=eps)
        self.head = nn.Linear(dim, vocab, bias=False)


class NextnHead(nn.Module):
    """enorm / hnorm / eh_proj, the extra decoder layer, shared_head (parameter names
    are the checkpoint's without `model.layers.{N}.`; the layer's own are `layers.0.*`)."""

    def __init__(self, layer_class: type, args: Any) -> None:
        super().__init__()
        dim, eps = args.hidden_size, args.rms_norm_eps
        self.enorm = nn.RMSNorm(dim, eps=eps)
        self.hnorm = nn.RMSNorm(dim, eps=eps)
        self.eh_proj = nn.Linear(2 * dim, dim, bias=False)
        self.layers = [layer_class(args, layer_idx=args.num_hidden_layers)]  # MoE where the rule says so
        self.shared_head = _SharedHead(dim, args.vocab_size, eps)
        # MLA attention (deepseek_v3, glm4_moe_lite) masks by array only
        self._array_mask = getattr(args, "kv_lora_rank", None) is not None

    def __call__(self, hidden: mx.array, embeds: mx.array, cache: Any, mask: Any = "causal") -> mx.array:
        """hidden, embeds [B, L, D] at positions cache.offset.. -> g [B, L, D]."""
        L = hidden.shape[1]
        pos = mx.array(cache.offset).reshape(-1, 1) + mx.arange(L)[None]
        embeds = mx.where((pos == 0)[..., None], mx.zeros_like(embeds), embeds)  # as vLLM: position 0's is zero
        x = self.eh_proj(mx.concatenate([self.enorm(embeds), self.hnorm(hidden)], axis=-1))
        if isinstance(mask, str):
            mask = None if L == 1 else cache.causal(L) if self._array_mask else mask
        return self.layers[0](x, mask=mask, cache=cache)

    def logits_fn(self, target_head: Callable[[mx.array], mx.array]) -> Callable[[mx.array], mx.array]:
        """The MTP layer's own head (shared_head; DeepSeek-V3 and GLM ship it)."""
        return lambda g: self.shared_head.head(self.shared_head.norm(g))

    @property
    def array_mask(self) -> bool:
        return self._array_mask

    @classmethod
    def load(cls, folder: str | Path, model: nn.Module) -> "NextnHead":
        mtype = model_type(model)
        if mtype not in NEXTN_MODEL_TYPES:
            raise MtpError(f"model type {mtype!r} has no model.layers.N MTP layout here "
                           f"(known: {', '.join(NEXTN_MODEL_TYPES)})")
        prefix = nextn_prefix(model)
        raw = read_nextn_weights(folder, prefix)
        if raw is None:
            raise MtpError(f"{folder}: no {prefix}* weights (the MTP layer; a Hugging Face format checkpoint "
                           "folder keeps it, mlx_lm.convert drops it)")
        own, layer = {}, {}
        for name, w in raw.items():
            key = name[len(prefix):]
            if key.endswith((".scales", ".biases")) or w.dtype in (mx.uint32, mx.uint8):
                raise MtpError(f"{name}: quantized MTP weights are not supported (use the checkpoint's bf16 ones)")
            if key.startswith(_OWN):
                own[key] = w
            elif not key.startswith("embed_tokens."):  # the target's own table is used
                layer[f"model.layers.0.{key}"] = w
        layer = model.sanitize(layer)  # the trunk's own conversion, for layer 0
        own.update({k.replace("model.layers.0.", "layers.0.", 1): v for k, v in layer.items()})
        head = cls(type(model.model.layers[0]), text_args(model))
        install_weights(head, own, model, folder)
        return head
