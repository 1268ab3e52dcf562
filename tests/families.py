"""Tiny random-weight models of every layer family, built from mlx-lm's own classes.

Exactness does not need good weights: each family's config is shrunk to a few small
layers, the model is instantiated by mlx-lm's own Model class, its random weights are
saved as an ordinary mlx-lm folder with the default model's tokenizer (so the real
loading code reads it back), and the engine must reproduce mlx-lm on it token for
token. Sliding windows are made short (8 tokens) so that prompts of a few dozen
tokens already cross them. Nothing is downloaded.

Random weights give flat logits, where float noise flips argmax; the weights are
scaled up (WEIGHT_SCALE) so the top logits stand apart.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map

VOCAB = 49152  # the default model's tokenizer
WINDOW = 8

_BASE = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "intermediate_size": 96, "rms_norm_eps": 1e-6, "vocab_size": VOCAB, "rope_theta": 10000.0,
         "max_position_embeddings": 4096, "tie_word_embeddings": False}

CONFIGS: dict[str, dict] = {
    "llama": {**_BASE, "model_type": "llama", "num_hidden_layers": 2},
    "qwen3_moe": {**_BASE, "model_type": "qwen3_moe", "num_hidden_layers": 2, "num_experts": 4,
                  "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
                  "moe_intermediate_size": 32, "norm_topk_prob": True},
    "gemma3_text": {**_BASE, "model_type": "gemma3_text", "num_hidden_layers": 4, "num_key_value_heads": 1,
                    "query_pre_attn_scalar": 16, "sliding_window": WINDOW, "sliding_window_pattern": 2,
                    "rope_local_base_freq": 10000.0},
    "gpt_oss": {**_BASE, "model_type": "gpt_oss", "num_hidden_layers": 2, "num_local_experts": 4,
                "num_experts_per_tok": 2, "sliding_window": WINDOW,
                "layer_types": ["sliding_attention", "full_attention"]},
    "qwen3_next": {**_BASE, "model_type": "qwen3_next", "num_hidden_layers": 4, "linear_num_value_heads": 4,
                   "linear_num_key_heads": 2, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                   "linear_conv_kernel_dim": 4, "num_experts": 4, "num_experts_per_tok": 2,
                   "decoder_sparse_step": 1, "shared_expert_intermediate_size": 32, "mlp_only_layers": [],
                   "moe_intermediate_size": 32, "partial_rotary_factor": 0.25, "full_attention_interval": 2},
    "qwen3_5": {"model_type": "qwen3_5", "text_config": {
        **_BASE, "model_type": "qwen3_5_text", "num_hidden_layers": 4, "linear_num_value_heads": 4,
        "linear_num_key_heads": 2, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4, "full_attention_interval": 2,
        "rope_parameters": {"type": "default", "mrope_section": [1, 1, 0], "rope_theta": 10000.0,
                            "partial_rotary_factor": 0.25}}},
    "deepseek_v3": {**_BASE, "model_type": "deepseek_v3", "num_hidden_layers": 2, "num_key_value_heads": 4,
                    "moe_intermediate_size": 32, "n_shared_experts": 1, "n_routed_experts": 4,
                    "num_experts_per_tok": 2, "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8,
                    "v_head_dim": 16, "qk_nope_head_dim": 16, "first_k_dense_replace": 1, "n_group": 1,
                    "topk_group": 1},
}

FAMILIES = list(CONFIGS)
WEIGHT_SCALE = 3.0


def build(family: str, root: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """An mlx-lm folder with `family`'s tiny random model (cached under root)."""
    from mlx_lm.utils import _get_classes

    out = Path(root) / family
    if (out / "model.safetensors").exists():
        return out
    config = json.loads(json.dumps(CONFIGS[family]))
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    scaled = tree_map(lambda p: p * WEIGHT_SCALE if mx.issubdtype(p.dtype, mx.floating) and p.ndim >= 2 else p,
                      model.parameters())
    model.update(scaled)
    weights = dict(tree_flatten(model.parameters()))
    mx.eval(weights)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    mx.save_safetensors(str(tmp / "model.safetensors"), weights)
    (tmp / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, tmp / name)
    tmp.rename(out)
    return out
