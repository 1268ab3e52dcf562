"""A tiny random-weight model of every model type mlx-lm ships (`bench models`'s
subjects; bench/model_sweep.py serves each and checks it against mlx-lm).

Each type's config is the small one mlx-lm's own tests/test_models.py instantiates
(copied below, _FROM_MLX_LM_TESTS, at ml-explore/mlx-lm d78bf58), or a hand-made one
(_HAND) for the types those tests do not build, or bench/family_models.CONFIGS for
the ten families the family tests already cover. `tiny_config` then shrinks it the
same way for every type: the default model's vocabulary (VOCAB, so its tokenizer
works), at most MAX_LAYERS layers (per-layer lists cut to match), widths scaled so
that the hidden size is at most MAX_HIDDEN, sliding windows of WINDOW tokens.
Weights are random and scaled (family_models.WEIGHT_SCALE); nothing is downloaded.

Types that cannot be built this way are in SKIPPED with the reason.
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from jumpahead.bench import family_models
from jumpahead.bench.family_models import VOCAB, WINDOW, _write_folder

MAX_LAYERS = 4
MAX_HIDDEN = 128
HELPERS = ("base", "cache", "rope_utils", "switch_layers", "activations", "bitlinear_layers", "gated_delta", "mla",
           "pipeline", "ssm")

_FROM_MLX_LM_TESTS: dict[str, dict] = {
    'Klear': {'model_type': 'Klear', 'hidden_size': 128, 'num_hidden_layers': 4, 'intermediate_size': 128, 'num_attention_heads': 4, 'attention_bias': False, 'mlp_only_layers': [0], 'num_experts': 4, 'num_experts_per_tok': 2, 'decoder_sparse_step': 2, 'n_shared_experts': 1, 'moe_intermediate_size': 128, 'rms_norm_eps': 1e-05, 'vocab_size': 1000, 'num_key_value_heads': 4, 'rope_theta': 1000.0, 'max_position_embeddings': 1000, 'norm_topk_prob': True},
    'afm7': {'model_type': 'afm7', 'vocab_size': 1000, 'hidden_dim': 256, 'num_layers': 16, 'num_hidden_layers': 16, 'num_kv_reuse_layers': 8, 'num_heads': 8, 'num_kv_heads': 4},
    'afmoe': {'model_type': 'afmoe', 'vocab_size': 1000, 'hidden_size': 128, 'num_hidden_layers': 4, 'num_attention_heads': 8, 'num_key_value_heads': 4, 'intermediate_size': 128, 'head_dim': 32, 'rope_theta': 100.0, 'layer_types': ['full_attention', 'sliding_attention', 'sliding_attention', 'full_attention'], 'num_experts': 4, 'num_experts_per_tok': 2, 'moe_intermediate_size': 128},
    'apertus': {'model_type': 'apertus', 'hidden_size': 128, 'num_hidden_layers': 4, 'intermediate_size': 256, 'mlp_bias': True, 'num_attention_heads': 8, 'attention_bias': False, 'rms_norm_eps': 1e-05, 'vocab_size': 1000, 'num_key_value_heads': 4, 'max_position_embeddings': 1000, 'rope_theta': 1000, 'post_norm': True, 'qk_norm': True, 'tie_word_embeddings': False},
    'baichuan_m1': {'model_type': 'baichuan_m1', 'vocab_size': 1000, 'hidden_size': 128, 'intermediate_size': 256, 'num_hidden_layers': 4, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'rope_theta': 1000, 'sliding_window': 128, 'sliding_window_layers': [0, 2], 'conv_window': 2, 'rms_norm_eps': 1e-05},
    'bailing_moe': {'model_type': 'bailing_moe', 'hidden_size': 64, 'intermediate_size': 128, 'max_position_embeddings': 1000, 'moe_intermediate_size': 128, 'num_experts': 4, 'num_shared_experts': 1, 'norm_topk_prob': True, 'num_attention_heads': 4, 'num_experts_per_tok': 2, 'num_hidden_layers': 4, 'num_key_value_heads': 2, 'rms_norm_eps': 1e-05, 'rope_theta': 1000, 'vocab_size': 1000, 'first_k_dense_replace': 2},
    'bailing_moe_linear': {'model_type': 'bailing_moe_linear', 'hidden_size': 1024, 'num_hidden_layers': 4, 'intermediate_size': 2048, 'moe_intermediate_size': 1024, 'num_experts_per_tok': 2, 'num_experts': 4, 'norm_topk_prob': True, 'num_shared_experts': 2, 'num_attention_heads': 4, 'num_key_value_heads': 4, 'rms_norm_eps': 1e-05, 'vocab_size': 10000, 'rope_theta': 1000, 'first_k_dense_replace': 0, 'layer_group_size': 2, 'group_norm_size': 1, 'max_position_embeddings': 1000},
    'bitnet': {'model_type': 'bitnet', 'hidden_size': 1024, 'num_hidden_layers': 4, 'intermediate_size': 2048, 'num_attention_heads': 4, 'num_key_value_heads': 4, 'rms_norm_eps': 1e-05, 'vocab_size': 10000},
    'cohere': {'model_type': 'cohere'},
    'cohere2': {'model_type': 'cohere2', 'hidden_size': 4096, 'head_dim': 128, 'num_hidden_layers': 40, 'sliding_window': 4096, 'sliding_window_pattern': 4},
    'dbrx': {'model_type': 'dbrx', 'd_model': 1024, 'ffn_config': {'ffn_hidden_size': 2048, 'moe_num_experts': 4, 'moe_top_k': 2}, 'attn_config': {'kv_n_heads': 2, 'clip_qkv': True, 'rope_theta': 10000}, 'n_layers': 4, 'n_heads': 4, 'vocab_size': 10000},
    'deepseek': {'model_type': 'deepseek', 'vocab_size': 1024, 'hidden_size': 128, 'intermediate_size': 256, 'moe_intermediate_size': 256, 'num_hidden_layers': 4, 'num_attention_heads': 8, 'num_key_value_heads': 4},
    'deepseek_v2': {'model_type': 'deepseek_v2', 'vocab_size': 1024, 'hidden_size': 128, 'intermediate_size': 256, 'moe_intermediate_size': 256, 'num_hidden_layers': 4, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'kv_lora_rank': 4, 'q_lora_rank': 4, 'qk_rope_head_dim': 32, 'v_head_dim': 16, 'qk_nope_head_dim': 32, 'rope_scaling': {'beta_fast': 32, 'beta_slow': 1, 'factor': 40, 'mscale': 1.0, 'mscale_all_dim': 1.0, 'original_max_position_embeddings': 4096, 'type': 'yarn'}},
    'deepseek_v3': {'model_type': 'deepseek_v3', 'vocab_size': 1024, 'hidden_size': 128, 'intermediate_size': 256, 'moe_intermediate_size': 256, 'num_hidden_layers': 4, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'n_routed_experts': 4, 'n_group': 2, 'topk_group': 1, 'num_experts_per_tok': 2, 'n_shared_experts': 1, 'kv_lora_rank': 4, 'q_lora_rank': 4, 'qk_rope_head_dim': 32, 'v_head_dim': 16, 'qk_nope_head_dim': 32, 'rope_scaling': {'beta_fast': 32, 'beta_slow': 1, 'factor': 40, 'mscale': 1.0, 'mscale_all_dim': 1.0, 'original_max_position_embeddings': 4096, 'type': 'yarn'}},
    'deepseek_v32': {'model_type': 'deepseek_v32', 'vocab_size': 1024, 'hidden_size': 128, 'intermediate_size': 256, 'moe_intermediate_size': 256, 'num_hidden_layers': 4, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'n_routed_experts': 4, 'n_group': 2, 'topk_group': 1, 'num_experts_per_tok': 2, 'n_shared_experts': 1, 'kv_lora_rank': 4, 'q_lora_rank': 4, 'qk_rope_head_dim': 32, 'v_head_dim': 16, 'qk_nope_head_dim': 32, 'rope_scaling': {'beta_fast': 32, 'beta_slow': 1, 'factor': 40, 'mscale': 1.0, 'mscale_all_dim': 1.0, 'original_max_position_embeddings': 4096, 'type': 'yarn'}},
    'dots1': {'model_type': 'dots1', 'hidden_size': 64, 'num_hidden_layers': 4, 'intermediate_size': 128, 'num_attention_heads': 4, 'rms_norm_eps': 1e-05, 'vocab_size': 1000, 'max_position_embeddings': None, 'num_key_value_heads': 2, 'first_k_dense_replace': 1, 'moe_intermediate_size': 64, 'n_routed_experts': 4, 'n_shared_experts': 1, 'norm_topk_prob': True, 'num_experts_per_tok': 1, 'rope_theta': 1000, 'routed_scaling_factor': 1.0},
    'ernie4_5': {'hidden_size': 128, 'intermediate_size': 128, 'model_type': 'ernie4_5', 'max_position_embeddings': 1000, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'head_dim': None, 'num_hidden_layers': 4, 'rms_norm_eps': 1e-05, 'vocab_size': 1000, 'rope_theta': 10000, 'use_bias': False, 'tie_word_embeddings': True},
    'ernie4_5_moe': {'hidden_size': 128, 'intermediate_size': 128, 'model_type': 'ernie4_5_moe', 'max_position_embeddings': 1000, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'num_hidden_layers': 4, 'rms_norm_eps': 1e-05, 'vocab_size': 1000, 'rope_theta': 1000, 'use_bias': False, 'tie_word_embeddings': False, 'moe_num_experts': 4},
    'exaone': {'model_type': 'exaone', 'hidden_size': 128, 'num_layers': 4, 'intermediate_size': 256, 'num_attention_heads': 8, 'num_key_value_heads': 2, 'vocab_size': 1000, 'layer_norm_epsilon': 0.0001, 'rope_theta': 10000},
    'exaone4': {'model_type': 'exaone4', 'hidden_size': 128, 'intermediate_size': 128, 'num_attention_heads': 4, 'vocab_size': 1000, 'rms_norm_eps': 1e-05, 'num_hidden_layers': 4, 'max_position_embeddings': 1000, 'rope_theta': 10000, 'layer_norm_epsilon': 1e-05, 'num_key_value_heads': 2, 'head_dim': 32, 'tie_word_embeddings': False, 'rope_scaling': None, 'sliding_window': 8, 'sliding_window_pattern': 'LLGL'},
    'exaone_moe': {'model_type': 'exaone_moe', 'vocab_size': 1000, 'hidden_size': 128, 'intermediate_size': 256, 'moe_intermediate_size': 64, 'num_hidden_layers': 4, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'head_dim': 32, 'num_experts': 4, 'num_experts_per_tok': 2, 'num_shared_experts': 1, 'n_group': 1, 'topk_group': 1, 'routed_scaling_factor': 2.5, 'norm_topk_prob': True, 'sliding_window': 32, 'max_position_embeddings': 1000, 'rms_norm_eps': 1e-05, 'rope_theta': 1000.0, 'layer_types': ['sliding_attention', 'sliding_attention', 'sliding_attention', 'full_attention'], 'is_moe_layer': [False, True, True, True], 'tie_word_embeddings': False},
    'falcon_h1': {'model_type': 'falcon_h1', 'num_hidden_layers': 12, 'vocab_size': 10000},
    'gemma': {'model_type': 'gemma', 'hidden_size': 1024, 'num_hidden_layers': 4, 'intermediate_size': 2048, 'num_attention_heads': 4, 'head_dim': 128, 'rms_norm_eps': 1e-05, 'vocab_size': 10000, 'num_key_value_heads': 4},
    'gemma2': {'model_type': 'gemma2', 'hidden_size': 128, 'num_hidden_layers': 4, 'intermediate_size': 256, 'num_attention_heads': 2, 'head_dim': 32, 'rms_norm_eps': 0.0001, 'vocab_size': 1024, 'num_key_value_heads': 2},
    'gemma3_text': {'model_type': 'gemma3_text', 'hidden_size': 128, 'num_hidden_layers': 12, 'intermediate_size': 256, 'num_attention_heads': 4, 'head_dim': 32, 'rms_norm_eps': 0.0001, 'num_key_value_heads': 1, 'sliding_window': 1024, 'sliding_window_pattern': 6},
    'gemma3n': {'model_type': 'gemma3n', 'num_hidden_layers': 4, 'vocab_size': 1000, 'text_config': {'model_type': 'gemma3n', 'hidden_size': 128, 'num_hidden_layers': 4, 'intermediate_size': 128, 'num_attention_heads': 4, 'head_dim': 32, 'rms_norm_eps': 1e-05, 'vocab_size': 1000, 'num_key_value_heads': 2, 'num_kv_shared_layers': 2, 'vocab_size_per_layer_input': 1000, 'sliding_window': 8, 'max_position_embeddings': 1000, 'rope_local_base_freq': 1.0, 'rope_theta': 1000.0, 'final_logit_softcapping': 1.0, 'layer_types': ['sliding_attention', 'full_attention', 'sliding_attention', 'full_attention'], 'activation_sparsity_pattern': [0.5, 0.5, 0.5, 0.5], 'hidden_size_per_layer_input': 256, 'altup_num_inputs': 4, 'altup_coef_clip': 1.0, 'altup_correct_scale': True, 'altup_active_idx': 0, 'laurel_rank': 8}},
    'gemma4': {'model_type': 'gemma4', 'vocab_size': 32, 'text_config': {'model_type': 'gemma4_text', 'hidden_size': 8, 'num_hidden_layers': 1, 'intermediate_size': 16, 'num_attention_heads': 1, 'num_key_value_heads': 1, 'num_global_key_value_heads': 1, 'head_dim': 8, 'global_head_dim': 8, 'sliding_window': 8, 'sliding_window_pattern': 1, 'layer_types': ['full_attention'], 'hidden_size_per_layer_input': 0, 'num_kv_shared_layers': 0, 'tie_word_embeddings': True}},
    'gemma4_text': {'model_type': 'gemma4_text', 'hidden_size': 128, 'num_hidden_layers': 10, 'intermediate_size': 256, 'num_attention_heads': 4, 'head_dim': 32, 'global_head_dim': 64, 'rms_norm_eps': 1e-06, 'vocab_size': 1000, 'vocab_size_per_layer_input': 1000, 'num_key_value_heads': 1, 'num_kv_shared_layers': 4, 'hidden_size_per_layer_input': 32, 'sliding_window': 8, 'sliding_window_pattern': 5, 'final_logit_softcapping': 30.0, 'layer_types': ['sliding_attention', 'sliding_attention', 'sliding_attention', 'sliding_attention', 'full_attention', 'sliding_attention', 'sliding_attention', 'sliding_attention', 'sliding_attention', 'full_attention'], 'rope_parameters': {'full_attention': {'partial_rotary_factor': 0.25, 'rope_theta': 1000000.0}, 'sliding_attention': {'rope_theta': 10000.0}}},
    'glm': {'model_type': 'glm', 'hidden_size': 128, 'num_hidden_layers': 4, 'intermediate_size': 128, 'num_attention_heads': 4, 'rms_norm_eps': 1e-05, 'vocab_size': 1000, 'head_dim': 32, 'num_key_value_heads': 2},
    'glm4': {'model_type': 'glm4', 'hidden_size': 256, 'num_hidden_layers': 4, 'intermediate_size': 128, 'num_attention_heads': 4, 'attention_bias': False, 'head_dim': 64, 'rms_norm_eps': 1e-05, 'vocab_size': 1000, 'num_key_value_heads': 2, 'partial_rotary_factor': 0.5, 'rope_theta': 1000},
    'glm4_moe': {'model_type': 'glm4_moe', 'vocab_size': 1000, 'hidden_size': 128, 'intermediate_size': 128, 'max_position_embeddings': 1000, 'moe_intermediate_size': 128, 'norm_topk_prob': True, 'num_attention_heads': 4, 'n_group': 2, 'head_dim': 32, 'topk_group': 1, 'n_shared_experts': 1, 'n_routed_experts': 4, 'routed_scaling_factor': 1.0, 'num_experts_per_tok': 2, 'first_k_dense_replace': 1, 'num_hidden_layers': 4, 'num_key_value_heads': 2, 'rms_norm_eps': 1e-05, 'rope_theta': 1000, 'rope_scaling': None, 'use_qk_norm': True, 'tie_word_embeddings': False, 'attention_bias': False, 'partial_rotary_factor': 0.5},
    'glm4_moe_lite': {'model_type': 'glm4_moe_lite', 'vocab_size': 1000, 'hidden_size': 64, 'intermediate_size': 128, 'moe_intermediate_size': 32, 'num_hidden_layers': 4, 'num_attention_heads': 4, 'num_key_value_heads': 4, 'n_shared_experts': 1, 'n_routed_experts': 4, 'routed_scaling_factor': 1.0, 'kv_lora_rank': 8, 'q_lora_rank': 8, 'qk_rope_head_dim': 8, 'qk_nope_head_dim': 16, 'v_head_dim': 8, 'topk_method': 'noaux_tc', 'scoring_func': 'sigmoid', 'norm_topk_prob': True, 'n_group': 1, 'topk_group': 1, 'num_experts_per_tok': 2, 'moe_layer_freq': 1, 'first_k_dense_replace': 1, 'max_position_embeddings': 256, 'rms_norm_eps': 1e-05, 'rope_theta': 1000, 'rope_scaling': None, 'attention_bias': False, 'partial_rotary_factor': 1.0, 'tie_word_embeddings': False, 'num_nextn_predict_layers': 1},
    'gpt2': {'model_type': 'gpt2', 'n_ctx': 1024, 'n_embd': 768, 'n_head': 12, 'n_layer': 12, 'n_positions': 1024, 'layer_norm_epsilon': 1e-05, 'vocab_size': 50256},
    'gpt_bigcode': {'model_type': 'gpt_bigcode', 'n_embd': 128, 'n_layer': 128, 'n_inner': 256, 'n_head': 4, 'n_positions': 1000, 'layer_norm_epsilon': 1e-05, 'vocab_size': 1024},
    'gpt_neox': {'model_type': 'gpt_neox', 'max_position_embeddings': 2048, 'hidden_size': 6144, 'num_attention_heads': 64, 'num_hidden_layers': 44, 'layer_norm_eps': 1e-05, 'vocab_size': 50432, 'rotary_emb_base': 10000, 'rotary_pct': 0.25},
    'gpt_oss': {'model_type': 'gpt_oss', 'hidden_size': 1024, 'num_hidden_layers': 4, 'intermediate_size': 2048, 'num_attention_heads': 8, 'num_key_value_heads': 2, 'num_local_experts': 16, 'num_experts_per_tok': 2, 'sliding_window': 128, 'rope_theta': 10000, 'vocab_size': 10000, 'layer_types': ['sliding_attention', 'full_attention', 'sliding_attention', 'full_attention']},
    'granite': {'model_type': 'granite', 'hidden_size': 128, 'num_hidden_layers': 4, 'intermediate_size': 128, 'num_attention_heads': 4, 'rms_norm_eps': 1e-05, 'vocab_size': 1000, 'logits_scaling': 1.0, 'attention_multiplier': 1.0, 'embedding_multiplier': 1.0, 'residual_multiplier': 1.0, 'max_position_embeddings': 1000, 'num_key_value_heads': 2, 'attention_bias': False, 'mlp_bias': False, 'rope_theta': 1000},
    'granitemoe': {'model_type': 'granitemoe', 'hidden_size': 128, 'num_hidden_layers': 4, 'intermediate_size': 128, 'num_attention_heads': 4, 'rms_norm_eps': 1e-05, 'vocab_size': 1000, 'logits_scaling': 1.0, 'attention_multiplier': 1.0, 'embedding_multiplier': 1.0, 'residual_multiplier': 1.0, 'max_position_embeddings': 1000, 'num_key_value_heads': 2, 'attention_bias': False, 'rope_theta': 1000, 'num_local_experts': 4, 'num_experts_per_tok': 2},
    'granitemoehybrid': {'model_type': 'granitemoehybrid', 'vocab_size': 1000, 'hidden_size': 128, 'intermediate_size': 128, 'num_hidden_layers': 4, 'max_position_embeddings': 1000, 'num_attention_heads': 8, 'num_key_value_heads': 4, 'attention_bias': False, 'embedding_multiplier': 1.0, 'attention_multiplier': 1.0, 'logits_scaling': 1.0, 'residual_multiplier': 1.0, 'num_local_experts': 8, 'num_experts_per_tok': 2, 'shared_intermediate_size': 128, 'mamba_n_heads': 8, 'mamba_d_head': 16, 'mamba_proj_bias': False, 'mamba_d_state': 128, 'mamba_d_conv': 4, 'mamba_n_groups': 1, 'mamba_conv_bias': False, 'layer_types': ['mamba', 'attention', 'mamba', 'attention'], 'rms_norm_eps': 1e-05, 'rope_theta': 1000.0},
    'helium': {'hidden_size': 256, 'num_hidden_layers': 4, 'intermediate_size': 256, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'rms_norm_eps': 1e-05, 'vocab_size': 1000, 'attention_bias': False, 'head_dim': 64, 'max_position_embeddings': 1000, 'mlp_bias': False, 'model_type': 'helium', 'rope_theta': 1000, 'tie_word_embeddings': False},
    'hunyuan': {'model_type': 'hunyuan', 'hidden_size': 128, 'attention_bias': False, 'intermediate_size': 256, 'num_attention_heads': 4, 'num_hidden_layers': 4, 'num_key_value_heads': 2, 'rms_norm_eps': 0.0001, 'rope_theta': 1000, 'vocab_size': 1000, 'moe_topk': 2, 'num_experts': 2, 'num_shared_expert': 1, 'use_mixed_mlp_moe': True, 'use_qk_norm': True, 'rope_scaling': {'alpha': 1000.0, 'factor': 1.0, 'type': 'dynamic'}, 'use_cla': True, 'cla_share_factor': 2},
    'hunyuan_v1_dense': {'model_type': 'hunyuan_v1_dense', 'hidden_size': 128, 'attention_bias': False, 'intermediate_size': 256, 'num_attention_heads': 4, 'num_hidden_layers': 4, 'num_key_value_heads': 2, 'rms_norm_eps': 0.0001, 'rope_theta': 1000, 'vocab_size': 1000, 'use_qk_norm': True, 'rope_scaling': {'alpha': 1000.0, 'factor': 1.0, 'type': 'dynamic', 'beta_fast': 32, 'beta_slow': 1, 'mscale': 1.0, 'mscale_all_dim': 0.0, 'original_max_position_embeddings': 8192}, 'max_position_embeddings': 32768},
    'internlm2': {'model_type': 'internlm2', 'hidden_size': 1024, 'num_hidden_layers': 4, 'intermediate_size': 2048, 'num_attention_heads': 4, 'rms_norm_eps': 1e-05, 'vocab_size': 10000},
    'internlm3': {'model_type': 'internlm3', 'hidden_size': 1024, 'num_hidden_layers': 4, 'intermediate_size': 2048, 'num_attention_heads': 4, 'rms_norm_eps': 1e-05, 'vocab_size': 10000},
    'iquestloopcoder': {'model_type': 'iquestloopcoder', 'hidden_size': 256, 'num_hidden_layers': 2, 'intermediate_size': 512, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'rms_norm_eps': 1e-05, 'head_dim': 32, 'vocab_size': 1000, 'rope_theta': 500000.0, 'tie_word_embeddings': False, 'loop_num': 2, 'loop_window_size': 32},
    'jamba': {'model_type': 'jamba', 'hidden_size': 128, 'intermediate_size': 128, 'num_hidden_layers': 8, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'attn_layer_offset': 1, 'attn_layer_period': 2, 'expert_layer_offset': 1, 'expert_layer_period': 2, 'mamba_d_conv': 4, 'mamba_d_state': 128, 'mamba_expand': 128, 'num_experts': 4, 'num_experts_per_tok': 2, 'rms_norm_eps': 1e-05, 'max_position_embeddings': 1000, 'vocab_size': 1000},
    'kimi_linear': {'model_type': 'kimi_linear', 'vocab_size': 1000, 'hidden_size': 128, 'num_hidden_layers': 4, 'num_attention_heads': 8, 'num_key_value_heads': 4, 'intermediate_size': 128, 'head_dim': 32, 'rope_theta': 100.0, 'rms_norm_eps': 1e-06, 'linear_attn_config': {'num_heads': 8, 'head_dim': 32, 'kda_layers': [1]}, 'model_max_length': 1000, 'num_experts': 2, 'moe_intermediate_size': 128, 'kv_lora_rank': 8, 'qk_nope_head_dim': 16, 'qk_rope_head_dim': 16, 'v_head_dim': 16},
    'kimi_vl': {'text_config': {'vocab_size': 1000, 'hidden_size': 128, 'intermediate_size': 128, 'moe_intermediate_size': 128, 'num_hidden_layers': 4, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'n_shared_experts': 1, 'n_routed_experts': 4, 'kv_lora_rank': 32, 'q_lora_rank': 32, 'qk_rope_head_dim': 8, 'v_head_dim': 16, 'qk_nope_head_dim': 16}, 'model_type': 'kimi_vl', 'num_hidden_layers': 4, 'vocab_size': 1000},
    'laguna': {'model_type': 'laguna', 'vocab_size': 10000, 'hidden_size': 128, 'intermediate_size': 256, 'num_hidden_layers': 4, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'head_dim': 32, 'rms_norm_eps': 1e-06, 'sliding_window': 4, 'partial_rotary_factor': 0.5, 'num_experts': 8, 'num_experts_per_tok': 2, 'moe_intermediate_size': 128, 'shared_expert_intermediate_size': 128, 'moe_routed_scaling_factor': 2.5, 'moe_router_score_func': 'sqrtsoftplus', 'layer_types': ['full_attention', 'sliding_attention', 'sliding_attention', 'sliding_attention'], 'mlp_layer_types': ['dense', 'sparse', 'sparse', 'sparse'], 'num_attention_heads_per_layer': [4, 4, 4, 4], 'rope_parameters': {'full_attention': {'rope_type': 'yarn', 'rope_theta': 500000.0, 'factor': 8.0, 'original_max_position_embeddings': 4096, 'beta_slow': 1.0, 'beta_fast': 32.0, 'partial_rotary_factor': 0.5}, 'sliding_attention': {'rope_type': 'default', 'rope_theta': 10000.0, 'partial_rotary_factor': 1.0}}},
    'lfm2': {'model_type': 'lfm2', 'hidden_size': 1024, 'num_hidden_layers': 4, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'norm_eps': 1e-05, 'vocab_size': 10000, 'full_attn_idxs': [0, 1, 2], 'rope_theta': 10000, 'block_dim': 1024, 'block_ffn_dim_multiplier': 1.5, 'block_auto_adjust_ff_dim': True, 'block_ff_dim': 2048, 'block_multiple_of': 256, 'max_position_embeddings': 1000, 'conv_bias': True, 'conv_L_cache': 3},
    'lfm2-vl': {'model_type': 'lfm2-vl', 'vocab_size': 1000, 'num_hidden_layers': 4, 'text_config': {'model_type': 'lfm2', 'vocab_size': 1000, 'hidden_size': 128, 'num_hidden_layers': 4, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'max_position_embeddings': 1000, 'norm_eps': 1e-05, 'conv_bias': False, 'conv_L_cache': 3, 'block_dim': 128, 'block_ff_dim': 128, 'block_multiple_of': 4, 'block_ffn_dim_multiplier': 2, 'block_auto_adjust_ff_dim': True, 'layer_types': ['full_attention', '', 'full_attention', ''], 'rope_theta': 1000}},
    'lfm2_moe': {'model_type': 'lfm2_moe', 'hidden_size': 1024, 'intermediate_size': 7168, 'num_hidden_layers': 4, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'norm_eps': 1e-05, 'vocab_size': 10000, 'full_attn_idxs': [0, 1, 2], 'rope_theta': 10000, 'max_position_embeddings': 1000, 'conv_bias': True, 'conv_L_cache': 3, 'moe_intermediate_size': 1792, 'num_dense_layers': 2, 'num_experts': 4, 'num_experts_per_tok': 2, 'norm_topk_prob': True, 'use_expert_bias': True},
    'lille-130m': {'model_type': 'lille-130m', 'block_size': 128, 'num_hidden_layers': 4, 'n_layer': 4, 'n_head': 4, 'n_kv_heads': 4, 'n_embd': 128, 'vocab_size': 1000, 'rope_theta': 1000, 'layer_norm_eps': 1e-05},
    'llama': {'model_type': 'llama', 'hidden_size': 64, 'num_hidden_layers': 4, 'intermediate_size': 256, 'num_attention_heads': 8, 'num_key_value_heads': 4, 'rms_norm_eps': 1e-05, 'vocab_size': 128, 'sliding_window': 4, 'layer_types': ['full_attention', 'sliding_attention', 'sliding_attention', 'full_attention'], 'tie_word_embeddings': False, 'rope_theta': 10000.0},
    'llama4': {'model_type': 'llama4', 'text_config': {'attention_bias': False, 'attention_chunk_size': 8, 'head_dim': 32, 'hidden_size': 128, 'interleave_moe_layer_step': 2, 'intermediate_size': 128, 'intermediate_size_mlp': 128, 'max_position_embeddings': 1000, 'model_type': 'llama4', 'num_attention_heads': 4, 'num_experts_per_tok': 1, 'num_hidden_layers': 4, 'num_key_value_heads': 2, 'num_local_experts': 2, 'rms_norm_eps': 0.0001, 'rope_scaling': None, 'rope_theta': 1000, 'use_qk_norm': True, 'vocab_size': 1000}, 'num_hidden_layers': 4, 'vocab_size': 1000},
    'llama4_text': {'model_type': 'llama4_text', 'hidden_size': 128, 'num_hidden_layers': 4, 'intermediate_size': 128, 'num_attention_heads': 4, 'rms_norm_eps': 1e-05, 'vocab_size': 1000, 'head_dim': 8, 'num_key_value_heads': 2, 'intermediate_size_mlp': 128, 'rope_theta': 1000.0, 'tie_word_embeddings': False, 'no_rope_layers': [0, 0, 1, 1], 'use_qk_norm': True},
    'longcat_flash': {'model_type': 'longcat_flash', 'attention_method': 'MLA', 'zero_expert_type': 'identity', 'hidden_size': 128, 'ffn_hidden_size': 128, 'moe_topk': 2, 'expert_ffn_hidden_size': 128, 'n_routed_experts': 2, 'zero_expert_num': 2, 'num_layers': 4, 'num_hidden_layers': 4, 'vocab_size': 1000, 'max_position_embeddings': 1000, 'num_attention_heads': 4, 'kv_lora_rank': 16, 'q_lora_rank': 16, 'qk_rope_head_dim': 8, 'qk_nope_head_dim': 8, 'v_head_dim': 8, 'routed_scaling_factor': 1.0, 'rms_norm_eps': 1e-05, 'rope_theta': 1000, 'mla_scale_q_lora': True, 'mla_scale_kv_lora': True, 'attention_bias': False},
    'longcat_flash_ngram': {'model_type': 'longcat_flash_ngram', 'attention_method': 'MLA', 'zero_expert_type': 'identity', 'hidden_size': 128, 'ffn_hidden_size': 128, 'moe_topk': 2, 'expert_ffn_hidden_size': 128, 'n_routed_experts': 2, 'zero_expert_num': 2, 'num_layers': 4, 'num_hidden_layers': 4, 'vocab_size': 1000, 'max_position_embeddings': 1000, 'num_attention_heads': 4, 'kv_lora_rank': 16, 'q_lora_rank': 16, 'qk_rope_head_dim': 8, 'qk_nope_head_dim': 8, 'v_head_dim': 8, 'routed_scaling_factor': 1.0, 'rms_norm_eps': 1e-05, 'rope_theta': 1000, 'mla_scale_q_lora': True, 'mla_scale_kv_lora': True, 'attention_bias': False},
    'mamba': {'model_type': 'mamba', 'vocab_size': 10000, 'use_bias': False, 'use_conv_bias': True, 'conv_kernel': 4, 'hidden_size': 768, 'num_hidden_layers': 24, 'state_size': 16, 'intermediate_size': 1536, 'time_step_rank': 48},
    'mamba2': {'model_type': 'mamba2', 'num_heads': 8, 'head_dim': 16, 'vocab_size': 1000, 'hidden_size': 128, 'intermediate_size': 128, 'state_size': 32, 'num_hidden_layers': 4, 'layer_norm_epsilon': 0.0001, 'conv_kernel': 3, 'n_groups': 4, 'use_bias': False, 'use_conv_bias': False, 'tie_word_embeddings': True, 'time_step_limit': [0.01, 10], 'time_step_rank': 'auto'},
    'mimo': {'model_type': 'mimo', 'hidden_size': 128, 'num_hidden_layers': 4, 'intermediate_size': 128, 'num_attention_heads': 4, 'rms_norm_eps': 1e-05, 'vocab_size': 1000, 'num_key_value_heads': 2},
    'mimo_v2_flash': {'model_type': 'mimo_v2_flash', 'num_experts_per_tok': 2, 'hybrid_layer_pattern': [0, 1, 0, 1], 'moe_layer_freq': [0, 1, 0, 1], 'add_swa_attention_sink_bias': True, 'add_full_attention_sink_bias': False, 'sliding_window_size': 32, 'vocab_size': 1000, 'hidden_size': 512, 'intermediate_size': 512, 'moe_intermediate_size': 128, 'num_hidden_layers': 4, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'n_shared_experts': 1, 'n_routed_experts': 8, 'routed_scaling_factor': None, 'topk_method': 'noaux_tc', 'scoring_func': 'sigmoid', 'norm_topk_prob': True, 'n_group': 2, 'topk_group': 1, 'max_position_embeddings': 1000, 'layernorm_epsilon': 1e-05, 'rope_theta': 1000.0, 'swa_rope_theta': 1000.0, 'swa_num_attention_heads': 4, 'swa_num_key_value_heads': 2, 'head_dim': 128, 'v_head_dim': 64, 'swa_head_dim': 128, 'swa_v_head_dim': 64, 'partial_rotary_factor': 0.5},
    'minicpm': {'model_type': 'minicpm', 'hidden_size': 1024, 'dim_model_base': 1024, 'num_hidden_layers': 4, 'intermediate_size': 2048, 'num_attention_heads': 4, 'rms_norm_eps': 0.0001, 'vocab_size': 10000, 'num_key_value_heads': 2, 'scale_depth': 1.0, 'scale_emb': 1.0},
    'minimax': {'model_type': 'minimax', 'hidden_size': 128, 'intermediate_size': 128, 'num_attention_heads': 8, 'num_key_value_heads': 8, 'max_position_embeddings': 1000, 'num_experts_per_tok': 2, 'num_local_experts': 8, 'shared_intermediate_size': 128, 'num_hidden_layers': 4, 'rms_norm_eps': 0.0001, 'rope_theta': 1000, 'rotary_dim': 16, 'vocab_size': 1000},
    'mixtral': {'model_type': 'mixtral', 'vocab_size': 100, 'hidden_size': 32, 'intermediate_size': 128, 'num_hidden_layers': 2, 'num_attention_heads': 4, 'num_experts_per_tok': 2, 'num_key_value_heads': 2, 'num_local_experts': 4},
    'nanochat': {'model_type': 'nanochat', 'hidden_size': 1280, 'num_hidden_layers': 20, 'vocab_size': 32, 'intermediate_size': 128},
    'nemotron': {'model_type': 'nemotron', 'hidden_size': 128, 'hidden_act': 'gelu', 'num_hidden_layers': 4, 'intermediate_size': 256, 'num_attention_heads': 4, 'norm_eps': 1e-05, 'vocab_size': 1024, 'num_key_value_heads': 2},
    'nemotron_h': {'model_type': 'nemotron_h', 'vocab_size': 1000, 'hidden_size': 128, 'intermediate_size': 128, 'num_hidden_layers': 4, 'max_position_embeddings': 1000, 'num_attention_heads': 8, 'num_key_value_heads': 4, 'attention_bias': False, 'mamba_num_heads': 8, 'mamba_head_dim': 64, 'mamba_proj_bias': False, 'ssm_state_size': 128, 'conv_kernel': 3, 'n_groups': 4, 'time_step_limit': [1.0, 2.0], 'mlp_bias': False, 'layer_norm_epsilon': 0.0001, 'rms_norm_eps': 1e-05, 'use_bias': True, 'use_conv_bias': True, 'residual_in_fp32': True, 'hybrid_override_pattern': ['*', 'M', '*', 'M']},
    'olmo': {'model_type': 'olmo', 'd_model': 1024, 'n_layers': 4, 'mlp_hidden_size': 2048, 'n_heads': 2, 'vocab_size': 10000, 'embedding_size': 10000},
    'olmo2': {'model_type': 'olmo2', 'hidden_size': 128, 'attention_bias': False, 'intermediate_size': 256, 'num_attention_heads': 4, 'num_hidden_layers': 4, 'num_key_value_heads': 2, 'rms_norm_eps': 0.0001, 'rope_theta': 1000, 'vocab_size': 1000},
    'olmo3': {'model_type': 'olmo3', 'num_heads': 8, 'head_dim': 16, 'vocab_size': 1000, 'hidden_size': 128, 'intermediate_size': 128, 'num_attention_heads': 8, 'rope_theta': 1000, 'num_hidden_layers': 8, 'rms_norm_eps': 0.0001, 'sliding_window': 128, 'tie_word_embeddings': True, 'max_position_embeddings': 1000},
    'olmoe': {'model_type': 'olmoe', 'hidden_size': 128, 'num_hidden_layers': 4, 'intermediate_size': 128, 'num_attention_heads': 2, 'rms_norm_eps': 1e-05, 'vocab_size': 1000, 'num_experts': 4, 'num_experts_per_tok': 2},
    'openelm': {'model_type': 'openelm', 'ffn_dim_divisor': 256, 'ffn_multipliers': [0.5, 0.73, 0.97, 1.2, 1.43, 1.67, 1.9, 2.13, 2.37, 2.6, 2.83, 3.07, 3.3, 3.53, 3.77, 4.0], 'head_dim': 64, 'model_dim': 1280, 'normalize_qk_projections': True, 'num_kv_heads': [3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5], 'num_query_heads': [12, 12, 12, 12, 12, 16, 16, 16, 16, 16, 16, 16, 20, 20, 20, 20], 'num_transformer_layers': 16, 'vocab_size': 32000},
    'phi3': {'model_type': 'phi3', 'hidden_size': 3072, 'num_hidden_layers': 32, 'intermediate_size': 8192, 'num_attention_heads': 32, 'rms_norm_eps': 1e-05, 'vocab_size': 32064},
    'phi3small': {'model_type': 'phi3small', 'hidden_size': 128, 'dense_attention_every_n_layers': 2, 'ff_intermediate_size': 256, 'gegelu_limit': 1.0, 'num_hidden_layers': 4, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'layer_norm_epsilon': 0.0001, 'vocab_size': 1000},
    'phimoe': {'model_type': 'phimoe', 'vocab_size': 320, 'hidden_size': 128, 'intermediate_size': 256, 'num_hidden_layers': 4, 'num_attention_heads': 4, 'num_key_value_heads': 4},
    'pixtral': {'model_type': 'pixtral', 'text_config': {'model_type': 'llama', 'hidden_size': 1024, 'num_hidden_layers': 4, 'intermediate_size': 2048, 'num_attention_heads': 4, 'rms_norm_eps': 1e-05, 'vocab_size': 1000}, 'num_hidden_layers': 4, 'vocab_size': 1000},
    'plamo': {'model_type': 'plamo', 'hidden_size': 1024, 'num_hidden_layers': 4, 'intermediate_size': 2048, 'num_attention_heads': 8, 'rms_norm_eps': 1e-05, 'vocab_size': 10000},
    'plamo2': {'model_type': 'plamo2', 'hidden_size': 1024, 'num_hidden_layers': 4, 'intermediate_size': 2048, 'num_attention_heads': 8, 'rms_norm_eps': 1e-05, 'vocab_size': 10000},
    'qwen': {'model_type': 'qwen'},
    'qwen2': {'model_type': 'qwen2', 'hidden_size': 1024, 'num_hidden_layers': 4, 'intermediate_size': 2048, 'num_attention_heads': 4, 'num_key_value_heads': 4, 'rms_norm_eps': 1e-05, 'vocab_size': 10000},
    'qwen2_moe': {'model_type': 'qwen2_moe', 'hidden_size': 1024, 'num_hidden_layers': 4, 'intermediate_size': 2048, 'num_attention_heads': 4, 'rms_norm_eps': 1e-05, 'vocab_size': 10000, 'num_experts_per_tok': 4, 'num_experts': 16, 'moe_intermediate_size': 1024, 'shared_expert_intermediate_size': 2048},
    'qwen3': {'model_type': 'qwen3', 'hidden_size': 1024, 'num_hidden_layers': 4, 'intermediate_size': 2048, 'num_attention_heads': 4, 'num_key_value_heads': 4, 'rms_norm_eps': 1e-05, 'vocab_size': 10000, 'head_dim': 128, 'max_position_embeddings': 4096, 'tie_word_embeddings': False, 'rope_theta': 1000},
    'qwen3_5': {'model_type': 'qwen3_5', 'hidden_size': 128, 'num_hidden_layers': 4, 'intermediate_size': 128, 'num_attention_heads': 8, 'num_key_value_heads': 4, 'vocab_size': 1000, 'linear_num_value_heads': 4, 'linear_num_key_heads': 4, 'linear_key_head_dim': 32, 'linear_value_head_dim': 32, 'linear_conv_kernel_dim': 3, 'rms_norm_eps': 1e-05, 'head_dim': 64, 'rope_theta': 1000.0, 'partial_rotary_factor': 0.5, 'max_position_embeddings': 1000},
    'qwen3_5_moe': {'model_type': 'qwen3_5_moe', 'hidden_size': 128, 'num_hidden_layers': 4, 'num_attention_heads': 8, 'num_key_value_heads': 4, 'vocab_size': 1000, 'linear_num_value_heads': 4, 'linear_num_key_heads': 4, 'linear_key_head_dim': 32, 'linear_value_head_dim': 32, 'linear_conv_kernel_dim': 3, 'num_experts': 4, 'num_experts_per_tok': 2, 'shared_expert_intermediate_size': 128, 'moe_intermediate_size': 128, 'rms_norm_eps': 1e-05, 'head_dim': 64, 'rope_theta': 1000.0, 'partial_rotary_factor': 0.5, 'max_position_embeddings': 1000},
    'qwen3_moe': {'model_type': 'qwen3_moe', 'hidden_size': 1024, 'num_hidden_layers': 4, 'intermediate_size': 2048, 'num_attention_heads': 4, 'num_key_value_heads': 4, 'rms_norm_eps': 1e-05, 'head_dim': 128, 'vocab_size': 10000, 'decoder_sparse_step': 1, 'mlp_only_layers': [], 'num_experts_per_tok': 4, 'num_experts': 16, 'moe_intermediate_size': 1024, 'rope_theta': 1000, 'max_position_embeddings': 4096, 'tie_word_embeddings': False, 'norm_topk_prob': True},
    'qwen3_next': {'model_type': 'qwen3_next', 'hidden_size': 128, 'num_hidden_layers': 4, 'intermediate_size': 128, 'num_attention_heads': 8, 'num_key_value_heads': 4, 'vocab_size': 1000, 'linear_num_value_heads': 4, 'linear_num_key_heads': 4, 'linear_key_head_dim': 32, 'linear_value_head_dim': 32, 'linear_conv_kernel_dim': 3, 'num_experts': 4, 'num_experts_per_tok': 2, 'decoder_sparse_step': 1, 'shared_expert_intermediate_size': 128, 'mlp_only_layers': [0], 'moe_intermediate_size': 128, 'rms_norm_eps': 1e-05, 'head_dim': 64, 'rope_theta': 1000.0, 'partial_rotary_factor': 0.5, 'max_position_embeddings': 1000},
    'qwen3_vl': {'model_type': 'qwen3_vl', 'text_config': {'model_type': 'qwen3', 'hidden_size': 128, 'num_hidden_layers': 4, 'intermediate_size': 256, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'rms_norm_eps': 1e-05, 'vocab_size': 1000, 'head_dim': 32, 'max_position_embeddings': 1000, 'tie_word_embeddings': False, 'rope_theta': 1000}, 'num_hidden_layers': 4, 'vocab_size': 1000},
    'qwen3_vl_moe': {'model_type': 'qwen3_vl_moe', 'text_config': {'model_type': 'qwen3_moe', 'hidden_size': 128, 'num_hidden_layers': 4, 'intermediate_size': 256, 'num_attention_heads': 4, 'num_key_value_heads': 2, 'rms_norm_eps': 1e-05, 'head_dim': 32, 'vocab_size': 1000, 'decoder_sparse_step': 1, 'mlp_only_layers': [], 'num_experts_per_tok': 2, 'num_experts': 4, 'moe_intermediate_size': 128, 'rope_theta': 1000, 'max_position_embeddings': 1000, 'tie_word_embeddings': False, 'norm_topk_prob': True}, 'num_hidden_layers': 4, 'vocab_size': 1000},
    'recurrent_gemma': {'model_type': 'recurrent_gemma', 'hidden_size': 128, 'attention_bias': False, 'conv1d_width': 3, 'intermediate_size': 256, 'logits_soft_cap': 1.0, 'num_attention_heads': 4, 'num_hidden_layers': 4, 'num_key_value_heads': 2, 'rms_norm_eps': 0.0001, 'rope_theta': 1000, 'attention_window_size': 1024, 'vocab_size': 1000, 'block_types': ['recurrent', 'recurrent', 'attention']},
    'rwkv7': {'model_type': 'rwkv7', 'vocab_size': 1000, 'hidden_size': 128, 'intermediate_size': 128, 'norm_eps': 1e-05, 'head_dim': 32, 'num_hidden_layers': 4, 'a_low_rank_dim': 16, 'v_low_rank_dim': 16, 'gate_low_rank_dim': 16, 'decay_low_rank_dim': 16},
    'seed_oss': {'model_type': 'seed_oss', 'hidden_size': 128, 'num_hidden_layers': 4, 'intermediate_size': 128, 'num_attention_heads': 2, 'rms_norm_eps': 1e-05, 'vocab_size': 1000, 'num_key_value_heads': 2, 'head_dim': 64},
    'smollm3': {'model_type': 'smollm3', 'hidden_size': 1024, 'num_hidden_layers': 4, 'intermediate_size': 2048, 'num_attention_heads': 4, 'rms_norm_eps': 1e-05, 'vocab_size': 10000},
    'stablelm': {'model_type': 'stablelm', 'vocab_size': 10000, 'hidden_size': 1024, 'num_attention_heads': 4, 'num_hidden_layers': 4, 'num_key_value_heads': 2, 'partial_rotary_factor': 1.0, 'intermediate_size': 2048, 'layer_norm_eps': 0.01, 'rope_theta': 10000, 'use_qkv_bias': False},
    'starcoder2': {'model_type': 'starcoder2', 'hidden_size': 1024, 'num_hidden_layers': 4, 'intermediate_size': 2048, 'num_attention_heads': 4, 'num_key_value_heads': 4},
    'step3p5': {'model_type': 'step3p5', 'hidden_size': 256, 'num_hidden_layers': 4, 'vocab_size': 1024, 'num_attention_heads': 4, 'num_attention_groups': 2, 'head_dim': 64, 'intermediate_size': 512, 'rms_norm_eps': 1e-05, 'rope_theta': [10000.0, 10000.0, 10000.0, 10000.0], 'sliding_window': 64, 'layer_types': ['full_attention', 'sliding_attention', 'sliding_attention', 'full_attention'], 'partial_rotary_factors': [0.5, 1.0, 1.0, 0.5], 'attention_other_setting': {'num_attention_heads': 8, 'num_attention_groups': 2}, 'use_head_wise_attn_gate': True, 'moe_num_experts': 4, 'moe_top_k': 2, 'moe_intermediate_size': 256, 'share_expert_dim': 256, 'moe_layers_enum': '1,2,3'},
    'telechat3': {'model_type': 'telechat3', 'hidden_size': 64, 'num_hidden_layers': 4, 'intermediate_size': 256, 'num_attention_heads': 8, 'num_key_value_heads': 4, 'rms_norm_eps': 1e-05, 'vocab_size': 128, 'rope_theta': 10000.0, 'max_position_embeddings': 1000},
    'youtu_llm': {'model_type': 'youtu_llm', 'vocab_size': 1000, 'hidden_size': 128, 'intermediate_size': 128, 'num_hidden_layers': 4, 'kv_lora_rank': 128, 'q_lora_rank': 256},
}

_ATT = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 96, "rms_norm_eps": 1e-6, "vocab_size": VOCAB, "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": False}
_MLA = {"kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16}
_MOE = {"moe_intermediate_size": 32, "num_experts_per_tok": 2}
_ROPE = {"rope_type": "default", "rope_theta": 10000.0}

# Types mlx-lm's tests do not instantiate
_HAND: dict[str, dict] = {
    "bailing_hybrid": {**_ATT, **_MLA, **_MOE, "model_type": "bailing_hybrid", "num_hidden_layers": 4,
                       "num_experts": 4, "num_shared_experts": 1, "n_group": 1, "topk_group": 1,
                       "first_k_dense_replace": 1, "layer_group_size": 2, "group_norm_size": 1,
                       "routed_scaling_factor": 1.0},
    "bailing_moe_v3": {**_ATT, **_MLA, **_MOE, "model_type": "bailing_moe_v3", "num_hidden_layers": 4,
                       "moe_shared_expert_intermediate_size": 32, "num_experts": 4, "num_shared_experts": 1,
                       "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "layer_group_size": 2},
    "deepseek_v41": {"model_type": "deepseek_v41", "vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "head_dim": 32, "q_lora_rank": 32, "qk_rope_head_dim": 8,
                     "o_groups": 2, "o_lora_rank": 32, "moe_intermediate_size": 32, "n_routed_experts": 4,
                     "num_experts_per_tok": 2, "sliding_window": WINDOW, "compress_ratios": [0, 0],
                     "index_n_heads": 2, "index_head_dim": 16, "index_topk": 16, "hc_mult": 2},
    "gear": {**_ATT, "model_type": "gear", "num_hidden_layers": 4, "sliding_window": WINDOW,
             "layer_types": ["sliding_attention", "full_attention"] * 2},
    "gemma3": {"model_type": "gemma3", "vocab_size": VOCAB, "text_config": {
        k: v for k, v in family_models.CONFIGS["gemma3_text"].items() if k != "vocab_size"}},
    "glm_moe_dsa": {**_ATT, **_MLA, **_MOE, "model_type": "glm_moe_dsa", "num_hidden_layers": 2,
                    "num_key_value_heads": 4, "index_head_dim": 16, "index_n_heads": 2, "index_topk": 16,
                    "n_shared_experts": 1, "n_routed_experts": 4, "routed_scaling_factor": 1.0,
                    "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True, "n_group": 1,
                    "topk_group": 1, "moe_layer_freq": 1, "first_k_dense_replace": 1,
                    "rope_parameters": _ROPE, "attention_bias": False},
    "gptj": {"model_type": "gptj", "n_embd": 64, "vocab_size": VOCAB, "n_positions": 4096, "n_head": 4,
             "rotary_dim": 8, "n_layer": 2},
    "kimi_k25": {"model_type": "kimi_k25", "text_config": {**family_models.CONFIGS["deepseek_v3"]}},
    "kimi_k3": {"model_type": "kimi_k3", "text_config": {
        **_ATT, **_MLA, "model_type": "kimi_linear", "num_hidden_layers": 4, "num_key_value_heads": 4,
        "linear_attn_config": {"num_heads": 4, "head_dim": 16, "kda_layers": [1, 3], "full_attn_layers": [2, 4],
                               "short_conv_kernel_size": 4},
        "num_experts": 4, "num_experts_per_token": 2, "moe_intermediate_size": 32, "num_shared_experts": 1}},
    "mellum": {**_ATT, **_MOE, "model_type": "mellum", "num_hidden_layers": 4, "num_experts": 4,
               "norm_topk_prob": True, "sliding_window": WINDOW,
               "layer_types": ["sliding_attention", "full_attention"] * 2,
               "rope_parameters": {"sliding_attention": _ROPE, "full_attention": _ROPE}},
    "minicpm3": {**_ATT, "model_type": "minicpm3", "num_hidden_layers": 2, "dim_model_base": 64,
                 "num_key_value_heads": 4, "q_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                 "kv_lora_rank": 32, "scale_depth": 1.4, "scale_emb": 12},
    "minimax_m3_vl": {"model_type": "minimax_m3_vl", "text_config": {
        **_ATT, "model_type": "minimax_m3", "num_hidden_layers": 2, "dense_intermediate_size": 96,
        "shared_intermediate_size": 32, "intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
        "partial_rotary_factor": 0.5}},
    "ministral3": {**_ATT, "model_type": "ministral3", "num_hidden_layers": 2, "rope_parameters": {
        **_ROPE, "llama_4_scaling_beta": 0.1, "original_max_position_embeddings": 4096}},
    "mistral3": {"model_type": "mistral3", "text_config": {**_ATT, "model_type": "ministral3", "num_hidden_layers": 2,
                 "rope_parameters": {**_ROPE, "llama_4_scaling_beta": 0.1, "original_max_position_embeddings": 4096}}},
    "mistral4": {**_ATT, **_MLA, **_MOE, "model_type": "mistral4", "num_hidden_layers": 2, "num_key_value_heads": 4,
                 "n_shared_experts": 1, "n_routed_experts": 4, "routed_scaling_factor": 1.0, "norm_topk_prob": True,
                 "topk_group": 1, "n_group": 1, "first_k_dense_replace": 1,
                 "rope_parameters": {**_ROPE, "llama_4_scaling_beta": 0.1, "original_max_position_embeddings": 4096}},
    "muse_glimmer": {**_ATT, "model_type": "muse_glimmer", "num_hidden_layers": 4, "sliding_window": WINDOW},
    "muse_spark": {"model_type": "muse_spark", "text_config": {
        **_ATT, "num_hidden_layers": 4, "post_norm_eps": 1e-8, "rope_parameters": _ROPE,
        "layer_rope_theta": [10000.0, 10000.0, 10000.0, 0], "sliding_window": WINDOW,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"], "final_logit_softcapping": 20.0,
        "output_multiplier": 0.2, "num_local_experts": 4, "num_experts_per_tok": 2, "moe_hidden_size": 32,
        "moe_intermediate_size": 32}},
    "nanbeige": {**_ATT, "model_type": "nanbeige", "num_hidden_layers": 2, "num_loops": 2},
    "nemotron-nas": {"model_type": "nemotron-nas", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
                     "rms_norm_eps": 1e-5, "vocab_size": VOCAB, "block_configs": [
                         {"attention": {"n_heads_in_group": n, "no_op": noop, "replace_with_linear": False},
                          "ffn": {"ffn_mult": 1.3125, "no_op": False, "replace_with_linear": False}}
                         for n, noop in ((2, False), (4, False), (1, True), (2, False))]},
    "olmo_hybrid": {**_ATT, "model_type": "olmo_hybrid", "num_hidden_layers": 4, "linear_num_key_heads": 2,
                    "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                    "linear_conv_kernel_dim": 4, "linear_allow_neg_eigval": True, "attention_bias": False},
    "phi": {"model_type": "phi", "vocab_size": VOCAB, "hidden_size": 64, "num_attention_heads": 4,
            "num_hidden_layers": 2, "num_key_value_heads": 4, "partial_rotary_factor": 0.5, "intermediate_size": 96},
    "phixtral": {"model_type": "phixtral", "num_vocab": VOCAB, "model_dim": 64, "num_heads": 4, "num_layers": 2,
                 "rotary_dim": 8, "num_experts_per_tok": 2, "num_local_experts": 4},
    "plamo3": {**_ATT, "model_type": "plamo3", "num_hidden_layers": 4, "window_size": WINDOW,
               "sliding_window_pattern": 2},
    "qwen2_vl": {"model_type": "qwen2_vl", "text_config": {**_ATT, "model_type": "qwen2", "num_hidden_layers": 2}},
    "spark2_5": {**_ATT, "model_type": "spark2_5", "num_hidden_layers": 4, "sliding_window": WINDOW,
                 "rope_parameters": {"sliding_attention": _ROPE, "full_attention": _ROPE}},
    "talkie": {"model_type": "talkie", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "head_dim": 16, "intermediate_size": 96, "vocab_size": VOCAB, "max_position_embeddings": 4096},
}

# Types no random-weight folder can stand for, with the reason
SKIPPED: dict[str, str] = {
    "bitnet": "mlx-lm runs its BitLinear layers with a Metal kernel only (mx.fast.metal_kernel): "
              "[metal_kernel] No Metal back-end on this machine",
    "muse_spark": "mlx-lm runs its norms and expert routing with Metal kernels (mlx_lm.kernels, mx.fast.metal_kernel): [metal_kernel] "
                  "No Metal back-end on this machine",
    "olmo": "needs the ai2-olmo package (mlx-lm exits: 'pip install ai2-olmo'), not installed",
    "prism_hadamard_qwen35": "a 2-bit Hadamard-rotated pack (ModelArgs requires its packed module manifest and "
                             "quantization group 128): there is no float model to build at random",
    # reproduced without jumpahead: mlx_lm.load + stream_generate on this tiny model died
    # with "corrupted double-linked list" in 1 of 6 runs (and "double free or corruption")
    "phi3small": "mlx-lm's own forward corrupts the process heap on the CPU now and then (glibc aborts in "
                 "plain mlx_lm.stream_generate, no jumpahead code), so there is no reference to check against",
}

# Per-type changes to the tests' configs: they are sized for a forward pass, not for
# exactness over a few dozen tokens
_SMALL = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96}
_OVERRIDES: dict[str, dict] = {
    "phi3": {"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96},
    "gpt_neox": {"hidden_size": 64, "num_attention_heads": 4, "rotary_pct": 0.5},
    "afm7": {"num_kv_reuse_layers": 2},
    "recurrent_gemma": {"logits_soft_cap": 30.0},  # the tests' 1.0 saturates: many logits tie at exactly 1.0
    "qwen": {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "kv_channels": 16,
             "intermediate_size": 192, "vocab_size": VOCAB},  # the tests use the defaults (2048 wide, 24 layers)
    "jamba": {"mamba_expand": 2, "mamba_d_state": 16},  # the tests' expand 128: a 16384-wide inner state
    "cohere": {**_SMALL, "num_hidden_layers": 2, "vocab_size": VOCAB},  # the tests use the defaults (8192 wide)
    "cohere2": {**_SMALL, "head_dim": 16},
    "gpt2": {"n_embd": 64, "n_head": 4},
    # grouped-query heads, as the released Gemma 2 models have (mlx-lm's test config has none)
    "gemma2": {"num_attention_heads": 4, "num_key_value_heads": 2},
    "nanochat": {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2},
    # transformers validates config.json when the tokenizer is loaded (types as its configs have them)
    "dbrx": {"attn_config": {"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000},
             "ffn_config": {"ffn_hidden_size": 256, "moe_num_experts": 4, "moe_top_k": 2}},
    "dots1": {"max_position_embeddings": 4096},
    "granitemoehybrid": {"mamba_d_head": 32},  # heads x head width = mamba_expand (2) x hidden
    "mamba2": {"time_step_limit": [0.01, 10.0], "head_dim": 32, "intermediate_size": 256},  # 8 x 32 = 2 x 128
    "exaone4": {"layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]},
    "minicpm3": {"rope_scaling": {"original_max_position_embeddings": 4096, "short_factor": 1.0, "long_factor": 1.0}},
}
# the same, inside a nested text_config
_TEXT_OVERRIDES: dict[str, dict] = {
    # the tests' soft cap of 1.0 squeezes every logit to ~1.0: argmax ties everywhere
    "gemma3n": {"final_logit_softcapping": 30.0},
}
_HIDDEN = ("hidden_size", "n_embd", "d_model", "model_dim", "hidden_dim", "dim")
_WIDTHS = (*_HIDDEN, "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "block_dim",
           "block_ff_dim", "mlp_hidden_size", "n_inner", "ff_intermediate_size", "dim_model_base", "block_multiple_of",
           "head_dim", "moe_shared_expert_intermediate_size", "share_expert_dim", "ffn_hidden_size",
           "dense_intermediate_size", "shared_intermediate_size", "expert_ffn_hidden_size", "q_lora_rank")
_LAYERS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
_WINDOWS = ("sliding_window", "attention_window_size", "window_size")


def model_types() -> list[str]:
    """Every module of the installed mlx_lm.models that defines Model and ModelArgs."""
    import mlx_lm.models

    out = []
    for path in sorted(Path(mlx_lm.models.__file__).parent.glob("*.py")):
        if path.stem in HELPERS or path.stem.startswith("_"):
            continue
        classes = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)}
        if {"Model", "ModelArgs"} <= classes:
            out.append(path.stem)
    return out


def _shrink(cfg: dict) -> None:
    """In place: vocabulary, layers, widths and windows of one (text) config."""
    for k in ("vocab_size", "num_vocab", "n_vocab", "embedding_size"):
        if k in cfg:
            cfg[k] = VOCAB
    for k in _LAYERS:
        n = cfg.get(k)
        if isinstance(n, int) and n > MAX_LAYERS:
            for key, v in list(cfg.items()):
                if isinstance(v, list) and len(v) == n:
                    cfg[key] = v[:MAX_LAYERS]
            cfg[k] = MAX_LAYERS
    hidden = next((cfg[k] for k in _HIDDEN if isinstance(cfg.get(k), int)), None)
    if hidden and hidden > MAX_HIDDEN:
        f = hidden // MAX_HIDDEN
        for k in _WIDTHS:
            if isinstance(cfg.get(k), int) and not isinstance(cfg[k], bool):
                cfg[k] = max(8, cfg[k] // f)
    for k in _WINDOWS:
        if isinstance(cfg.get(k), int) and cfg[k] > WINDOW:
            cfg[k] = WINDOW
    if isinstance(cfg.get("attention_chunk_size"), int):
        cfg["attention_chunk_size"] = 2 * WINDOW


def tiny_config(model_type: str) -> dict:
    """`model_type`'s config, shrunk (see the module's docstring); KeyError: no config."""
    if model_type in SKIPPED:
        raise KeyError(f"{model_type}: {SKIPPED[model_type]}")
    if model_type in family_models.CONFIGS:
        return family_models.family_config(model_type)
    src = _HAND.get(model_type) or _FROM_MLX_LM_TESTS.get(model_type)
    if src is None:
        raise KeyError(f"{model_type}: no tiny config (mlx-lm's tests build none and none is written here)")
    cfg = json.loads(json.dumps(src))
    cfg.update(_OVERRIDES.get(model_type, {}))
    if isinstance(cfg.get("text_config"), dict):
        cfg["text_config"].update(_TEXT_OVERRIDES.get(model_type, {}))
    _shrink(cfg)
    if isinstance(cfg.get("text_config"), dict):
        _shrink(cfg["text_config"])
        if "vocab_size" in cfg:
            cfg["text_config"]["vocab_size"] = VOCAB
    return cfg


def instantiate(model_type: str, seed: int = 0):
    """(mlx-lm's Model of the tiny config with scaled random weights, config)."""
    config = tiny_config(model_type)
    return family_models.random_model(config, seed), config


def build(model_type: str, root: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """An mlx-lm folder of `model_type`'s tiny random model under root (cached)."""
    if model_type in family_models.CONFIGS:
        return family_models.build(model_type, root, tokenizer_dir, seed)
    out = Path(root) / model_type
    if (out / "model.safetensors").exists():
        try:
            same = lambda c: json.dumps(c, sort_keys=True)  # noqa: E731  (10 == 10.0, but not in config.json)
            if same(json.loads((out / "config.json").read_text())) == same(tiny_config(model_type)):
                return out
        except (OSError, ValueError):
            pass
        shutil.rmtree(out)  # built from another config: rebuilt
    model, config = instantiate(model_type, seed)
    weights = dict(tree_flatten(model.parameters()))
    mx.eval(weights)
    return _write_folder(out, weights, config, tokenizer_dir)
