"""Random-weight models of every layer family, built from mlx-lm's own classes
(tests' oracles; `bench families` times them at a bench size).

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
    # gemma4: global layers of another head width than the sliding ones, and the last
    # layers sharing earlier layers' caches (make_cache returns fewer caches than layers)
    "gemma4_text": {**_BASE, "model_type": "gemma4_text", "num_hidden_layers": 6, "num_key_value_heads": 1,
                    "head_dim": 16, "global_head_dim": 32, "sliding_window": WINDOW, "sliding_window_pattern": 2,
                    "num_kv_shared_layers": 2, "hidden_size_per_layer_input": 8,
                    "vocab_size_per_layer_input": VOCAB, "intermediate_size": 64, "use_double_wide_mlp": False},
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
    # chunked local attention (3 of 4 layers; mlx-lm's ChunkedKVCache) + global NoPE
    # layers with attention temperature tuning, MoE every other layer
    "llama4": {"model_type": "llama4", "text_config": {
        **_BASE, "model_type": "llama4_text", "num_hidden_layers": 4, "attention_bias": False,
        "attention_chunk_size": 2 * WINDOW, "interleave_moe_layer_step": 2, "intermediate_size_mlp": 96,
        "num_experts_per_tok": 1, "num_local_experts": 4, "rope_scaling": None, "use_qk_norm": True,
        "attn_temperature_tuning": True, "floor_scale": 8}},
    # a CacheList per layer: Mamba-2 state and attention side by side
    "falcon_h1": {**_BASE, "model_type": "falcon_h1", "num_hidden_layers": 2, "mamba_d_conv": 4,
                  "mamba_d_head": 16, "mamba_d_ssm": 64, "mamba_d_state": 16, "mamba_expand": 2,
                  "mamba_n_groups": 1, "mamba_n_heads": 4, "mamba_chunk_size": 16, "mlp_expansion_factor": 2,
                  "tie_word_embeddings": True},
}

FAMILIES = list(CONFIGS)
# Families built only for the tests of their MTP layer (not in FAMILIES' every-family tests)
MTP_ONLY_CONFIGS: dict[str, dict] = {
    "glm4_moe": {**_BASE, "model_type": "glm4_moe", "num_hidden_layers": 2, "moe_intermediate_size": 32,
                 "n_shared_experts": 1, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1,
                 "topk_group": 1, "first_k_dense_replace": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.0,
                 "rope_scaling": None, "use_qk_norm": True, "attention_bias": True, "partial_rotary_factor": 0.5},
    # GLM-4.7-Flash: DeepSeek-V3's MLA and MoE under its own model type
    "glm4_moe_lite": {**_BASE, "model_type": "glm4_moe_lite", "num_hidden_layers": 2, "num_key_value_heads": 4,
                      "moe_intermediate_size": 32, "n_shared_experts": 1, "n_routed_experts": 4,
                      "num_experts_per_tok": 2, "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8,
                      "v_head_dim": 16, "qk_nope_head_dim": 16, "first_k_dense_replace": 1, "n_group": 1,
                      "topk_group": 1},
}
WEIGHT_SCALE = 3.0


# A bench-sized shape (about the default model's cost per token): what `size="bench"`
# changes in a family's config (text_config for nested ones).
BENCH_SIZE = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
              "intermediate_size": 1536, "moe_intermediate_size": 384, "shared_expert_intermediate_size": 384,
              "linear_num_value_heads": 8, "linear_num_key_heads": 4, "linear_key_head_dim": 64,
              "linear_value_head_dim": 64, "num_hidden_layers": 24, "sliding_window": 512}


# `size="kv"`: the tiny shape with head widths a quantized KV cache can group (64, 128).
KV_SIZE = {"head_dim": 64, "query_pre_attn_scalar": 64, "global_head_dim": 128, "mamba_d_head": 16,
           "kv_lora_rank": 64, "qk_rope_head_dim": 64}  # MLA: latents and rope keys


def family_config(family: str, size: str = "tiny") -> dict:
    config = json.loads(json.dumps({**CONFIGS, **MTP_ONLY_CONFIGS}[family]))
    if size == "bench":
        target = config.get("text_config", config)
        for k, v in BENCH_SIZE.items():
            if k in target or k == "num_hidden_layers":
                target[k] = v
        if "layer_types" in target:
            target["layer_types"] = [("sliding_attention", "full_attention")[i % 2] for i in range(target["num_hidden_layers"])]
        if family == "gemma3_text":
            target.update({"num_key_value_heads": 1, "head_dim": 256, "num_attention_heads": 4,
                           "query_pre_attn_scalar": 256, "sliding_window_pattern": 6})
    elif size == "kv":  # tiny, with heads as wide as quantized KV groups need (64)
        target = config.get("text_config", config)
        for k, v in KV_SIZE.items():
            if k in target or k == "head_dim":
                target[k] = v
    elif size != "tiny":
        raise ValueError(f"size must be tiny, kv or bench, got {size!r}")
    return config


def random_model(config: dict, seed: int = 0):
    """mlx-lm's own Model for `config` with seeded random weights, scaled (WEIGHT_SCALE)."""
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    scaled = tree_map(lambda p: p * WEIGHT_SCALE if mx.issubdtype(p.dtype, mx.floating) and p.ndim >= 2 else p,
                      model.parameters())
    model.update(scaled)
    return model


def build(family: str, root: Path, tokenizer_dir: Path, seed: int = 0, size: str = "tiny") -> Path:
    """An mlx-lm folder with `family`'s random model (cached under root)."""
    out = Path(root) / (family if size == "tiny" else f"{family}-{size}")
    if (out / "model.safetensors").exists():
        return out
    config = family_config(family, size)
    model = random_model(config, seed)
    weights = dict(tree_flatten(model.parameters()))
    mx.eval(weights)
    return _write_folder(out, weights, config, tokenizer_dir)


def _write_folder(out: Path, weights: dict[str, mx.array], config: dict, tokenizer_dir: Path) -> Path:
    """The mlx-lm folder `out`: the weights, config.json and the tokenizer's files from
    `tokenizer_dir`, written beside it and renamed into place (an interrupted build
    leaves no folder that looks complete)."""
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


# Families whose checkpoints ship a multi-token-prediction layer under `mtp.*` (engine/methods/mtp.py)
MTP_FAMILIES = ("qwen3_next", "qwen3_5")
# `predictable=True`: the trunk's layer outputs scaled by this, so the model is nearly a
# bigram model of its embedding and the MTP layer below predicts it well
PREDICTABLE_SCALE = 0.003
_HF_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight", ".q_norm.weight",
             ".k_norm.weight")
_MTP_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight", "k_norm.weight",
              "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight")
_OUTPUTS = ("o_proj.weight", "out_proj.weight", "down_proj.weight")


def _to_hf(weights: dict[str, mx.array], nested: bool) -> dict[str, mx.array]:
    """mlx-lm's sanitize undone for qwen3_next / qwen3_5: per-expert tensors, conv1d as
    [C, 1, K], zero-centred norms, qwen3_5's `model.language_model.` names."""
    out: dict[str, mx.array] = {}
    for name, v in weights.items():
        if nested:
            name = name.replace("language_model.model.", "model.language_model.").replace("language_model.lm_head.",
                                                                                        "lm_head.")
        if ".switch_mlp." in name:
            for e in range(v.shape[0]):
                out[name.replace(".switch_mlp.", f".experts.{e}.")] = v[e]
            continue
        if "conv1d.weight" in name and v.shape[-1] == 1:
            v = v.moveaxis(1, 2)
        if v.ndim == 1 and (name.endswith(_HF_NORMS) or (name.startswith("mtp.") and (
                name == "mtp.norm.weight" or name.endswith(_MTP_NORMS)))):
            v = v - 1.0
        out[name] = v
    return out


def _random_with_mtp(config: dict, make_head, seed: int) -> tuple[dict[str, mx.array], dict[str, mx.array]]:
    """(the model's weights, its MTP head's) at random, scaled as `build` scales them."""
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    head = make_head(model)
    scale = lambda p: p * WEIGHT_SCALE if mx.issubdtype(p.dtype, mx.floating) and p.ndim >= 2 else p  # noqa: E731
    model.update(tree_map(scale, model.parameters()))
    head.update(tree_map(scale, head.parameters()))
    return dict(tree_flatten(model.parameters())), dict(tree_flatten(head.parameters()))


def build_hf_with_mtp(family: str, root: Path, tokenizer_dir: Path, seed: int = 0, predictable: bool = False,
                      size: str = "tiny") -> Path:
    """A Hugging Face format folder of `family`'s random model (as its checkpoints are
    published: per-expert tensors, zero-centred norms, unsanitized conv1d) with an MTP
    layer of the real names and shapes under `mtp.*` (mtp.fc, mtp.pre_fc_norm_embedding,
    mtp.pre_fc_norm_hidden, mtp.layers.0.* -- one full-attention decoder layer of the
    model's own kind -- and mtp.norm), which mlx-lm's loader drops and engine/methods/mtp.py reads.

    `predictable`: the trunk's layer outputs are scaled down (PREDICTABLE_SCALE), so its
    next token is nearly a function of the current one, and the MTP layer is built to
    compute exactly that function (fc passes the embedding half through, the layer
    adds nothing): it drafts what the target will pick, which exercises acceptance."""
    from jumpahead.engine.methods.mtp import MtpHead

    if family not in MTP_FAMILIES:
        raise ValueError(f"{family} has no MTP layout (known: {', '.join(MTP_FAMILIES)})")
    out = Path(root) / f"{family}-hf-mtp{'-predictable' if predictable else ''}{'' if size == 'tiny' else '-' + size}"
    if (out / "model.safetensors").exists():
        return out
    config = family_config(family, size)
    text = config.get("text_config", config)
    (text if "text_config" in config else config)["mtp_num_hidden_layers" if "text_config" in config
                                                   else "num_nextn_predict_layers"] = 1
    weights, mtp = _random_with_mtp(config, MtpHead.for_model, seed)
    if predictable:
        weights = {k: v * PREDICTABLE_SCALE if k.endswith(_OUTPUTS) else v for k, v in weights.items()}
        dim = text["hidden_size"]
        mtp = {k: mx.zeros_like(v) if k.endswith(_OUTPUTS) else v for k, v in mtp.items()}
        mtp["fc.weight"] = mx.concatenate([mx.eye(dim), mx.zeros((dim, dim))], axis=1)  # [embedding, hidden]
    weights.update({f"mtp.{k}": v for k, v in mtp.items()})
    weights = _to_hf(weights, nested="text_config" in config)
    mx.eval(weights)
    return _write_folder(out, weights, config, tokenizer_dir)


# DeepSeek-V3-layout MTP (engine/methods/mtp_nextn.py): the MTP layer is model.layers.{N}.*
NEXTN_FAMILIES = ("deepseek_v3", "glm4_moe", "glm4_moe_lite")
_NEXTN_OUTPUTS = ("o_proj.weight", "down_proj.weight")


def _nextn_to_hf(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """mlx-lm's deepseek_v3 / glm4_moe sanitize undone: per-expert tensors, MLA's
    embed_q / unembed_out joined back into kv_b_proj."""
    out: dict[str, mx.array] = {}
    for name, v in weights.items():
        if ".switch_mlp." in name:
            for e in range(v.shape[0]):
                out[name.replace(".switch_mlp.", f".experts.{e}.")] = v[e]
        elif name.endswith("self_attn.embed_q.weight"):
            wv = weights[name.replace("embed_q", "unembed_out")]
            kv = mx.concatenate([v.swapaxes(-1, -2), wv], axis=1)  # [H, nope + v, R]
            out[name.replace("embed_q", "kv_b_proj")] = kv.reshape(-1, kv.shape[-1])
        elif not name.endswith("self_attn.unembed_out.weight"):
            out[name] = v
    return out


def build_hf_with_nextn(family: str, root: Path, tokenizer_dir: Path, seed: int = 0,
                        predictable: bool = False) -> Path:
    """A Hugging Face format folder of `family`'s random model with its MTP layer as
    DeepSeek-V3 and GLM-4.5 publish it: model.layers.{N}.{enorm, hnorm, eh_proj,
    shared_head.norm, shared_head.head, embed_tokens} beside the layer's own attention
    and MoE weights (per-expert tensors, MLA's kv_b_proj), num_nextn_predict_layers 1.

    `predictable`: as build_hf_with_mtp (a nearly-bigram trunk; eh_proj passes the
    embedding half through, the layer adds nothing, shared_head is the target's final
    norm and head), so the MTP layer drafts what the target will pick."""
    from jumpahead.engine.methods.mtp_nextn import NextnHead

    if family not in NEXTN_FAMILIES:
        raise ValueError(f"{family} has no model.layers.N MTP layout here (known: {', '.join(NEXTN_FAMILIES)})")
    out = Path(root) / f"{family}-hf-nextn{'-predictable' if predictable else ''}"
    if (out / "model.safetensors").exists():
        return out
    config = {**family_config(family), "num_nextn_predict_layers": 1}
    weights, mtp = _random_with_mtp(config, lambda m: NextnHead(type(m.model.layers[0]), m.args), seed)
    if predictable:
        weights = {k: v * PREDICTABLE_SCALE if k.endswith(_NEXTN_OUTPUTS) else v for k, v in weights.items()}
        dim = config["hidden_size"]
        mtp = {k: mx.zeros_like(v) if k.endswith(_NEXTN_OUTPUTS) else v for k, v in mtp.items()}
        mtp["eh_proj.weight"] = mx.concatenate([mx.eye(dim), mx.zeros((dim, dim))], axis=1)  # [embedding, hidden]
        mtp["shared_head.head.weight"] = weights["lm_head.weight"]
        mtp["shared_head.norm.weight"] = weights["model.norm.weight"]
    layer = f"model.layers.{config['num_hidden_layers']}."
    weights.update({layer + k.removeprefix("layers.0."): v for k, v in mtp.items()})
    weights[layer + "embed_tokens.weight"] = weights["model.embed_tokens.weight"]
    weights = _nextn_to_hf(weights)
    mx.eval(weights)
    return _write_folder(out, weights, config, tokenizer_dir)


# The default model's attention and MLP grafted into falcon_h1 (Mamba-2 state beside
# attention in every layer): a hybrid recurrent model that writes like SmolLM2 (so
# echo has copies to verify), whose Mamba path is small but real (its output weights
# scaled by HYBRID_MAMBA_SCALE): the recurrent state is in every token's computation.
HYBRID = "falcon_h1-smollm"
HYBRID_MAMBA_SCALE = 0.01


def build_grafted_hybrid(root: Path, seed: int = 0) -> Path:
    """An mlx-lm folder: SmolLM2-135M's weights in falcon_h1 layers (see HYBRID)."""
    from mlx.utils import tree_unflatten
    from mlx_lm.models import falcon_h1

    from jumpahead.engine.model.default_model import ensure_default_model
    from jumpahead.engine.model.loader import load_model

    out = Path(root) / HYBRID
    if (out / "model.safetensors").exists():
        return out
    src = ensure_default_model(progress=lambda s: None)
    base = json.loads((src / "config.json").read_text())
    net, _, _ = load_model(None, progress=lambda s: None, dequantize=True)
    llama = dict(tree_flatten(net.parameters()))
    config = {"model_type": "falcon_h1", "hidden_size": base["hidden_size"], "num_hidden_layers": base["num_hidden_layers"],
              "num_attention_heads": base["num_attention_heads"], "num_key_value_heads": base["num_key_value_heads"],
              "head_dim": base["head_dim"], "intermediate_size": base["intermediate_size"], "vocab_size": base["vocab_size"],
              "rms_norm_eps": base["rms_norm_eps"], "rope_theta": base["rope_theta"], "rope_traditional": False,
              "max_position_embeddings": base["max_position_embeddings"], "tie_word_embeddings": True,
              "attention_in_multiplier": 1.0, "attention_out_multiplier": 1.0, "embedding_multiplier": 1.0,
              "key_multiplier": 1.0, "lm_head_multiplier": 1.0, "ssm_in_multiplier": 1.0, "ssm_out_multiplier": 1.0,
              "mlp_multipliers": [1.0, 1.0], "ssm_multipliers": [1.0, 1.0, 1.0, 1.0, 1.0],
              "mamba_d_conv": 4, "mamba_d_head": 32, "mamba_d_ssm": 128, "mamba_d_state": 16, "mamba_expand": 2,
              "mamba_n_groups": 1, "mamba_n_heads": 4, "mamba_chunk_size": 128, "mlp_expansion_factor": 1,
              "eos_token_id": base.get("eos_token_id"), "bos_token_id": base.get("bos_token_id")}
    mx.random.seed(seed)
    model = falcon_h1.Model(falcon_h1.ModelArgs.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    rename = {"mlp.": "feed_forward.", "post_attention_layernorm": "pre_ff_layernorm"}
    for name, value in llama.items():
        new = name.replace("model.norm.", "model.final_layernorm.")
        for a, b in rename.items():
            new = new.replace(a, b)
        if new not in weights or weights[new].shape != value.shape:
            raise ValueError(f"cannot graft {name} onto falcon_h1 ({new})")
        weights[new] = value
    for name in weights:
        if name.endswith("mamba.out_proj.weight"):
            weights[name] = weights[name] * HYBRID_MAMBA_SCALE
    model.update(tree_unflatten(list(weights.items())))
    mx.eval(model.parameters())
    return _write_folder(out, dict(tree_flatten(model.parameters())), config, src)


def main(argv: list[str] | None = None) -> int:
    """`jumpahead bench family-model FAMILY [--size bench] [--out DIR]`: build the folder
    and print its path as JSON (give it to the other benches' --model)."""
    import argparse

    from jumpahead.engine.model.default_model import ensure_default_model

    from jumpahead.bench.output import emit

    ap = argparse.ArgumentParser(prog="jumpahead bench family-model", description=main.__doc__.split("\n")[0])
    ap.add_argument("family", choices=[*FAMILIES, HYBRID],
                    help=f"a family's random model, or {HYBRID}: the default model grafted into falcon_h1")
    ap.add_argument("--size", choices=("tiny", "bench"), default="bench",
                    help="tiny: the tests' oracles; bench: about the default model's cost per token (default)")
    ap.add_argument("--out", default=None, help="parent folder (default: the jumpahead cache's family-models/)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    root = Path(args.out) if args.out else ensure_default_model(progress=lambda s: None).parent.parent / "family-models"
    if args.family == HYBRID:
        path = build_grafted_hybrid(root, args.seed)
    else:
        path = build(args.family, root, ensure_default_model(progress=lambda s: None), args.seed, args.size)
    return emit({"family": args.family, "size": args.size, "path": str(path)})
