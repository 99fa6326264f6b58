"""GPT-OSS architecture presets, numbers from OpenAI's published config.json files.

Plain functions returning `ModelConfig` (no torch: these sit on the one-second CLI path). What the
two sizes share is in `_gpt_oss`; they differ in depth and expert count only.
"""

from __future__ import annotations

from config.schema import ModelConfig


def _gpt_oss(num_layers: int, num_experts: int, seq_length: int) -> ModelConfig:
    """openai/gpt-oss-20b and -120b config.json: hidden 2880, 64 query heads of 64 with 8 KV
    groups, q/k/v/o biases and a learned sink per head (attention_bias; the `sinks` tensors), a
    128-token window on every other layer from the first (sliding_window, layer_types), YaRN
    (rope_scaling: factor 32 over 4,096 positions, beta 32 / 1, truncate false; rope_theta 150000),
    every layer a MoE of experts of ffn 2880 with top-4 routing by the softmax of the top-4
    logits of a biased router, the experts' GLU clamped at 7 (swiglu_limit) with quick GELU
    (x * sigmoid(1.702 x)) and +1 on its linear half; vocabulary 201088, untied embeddings."""
    return ModelConfig(
        num_layers=num_layers,  # num_hidden_layers
        hidden_size=2880,
        ffn_hidden_size=2880,  # intermediate_size (every layer is a MoE: the experts' width)
        num_attention_heads=64,
        num_query_groups=8,  # num_key_value_heads
        kv_channels=64,  # head_dim (64 x 64 = 4096, not hidden_size)
        seq_length=seq_length,
        vocab_size=201088,
        layernorm_epsilon=1e-5,  # rms_norm_eps
        init_method_std=0.02,  # initializer_range
        add_bias_linear=True,  # attention_bias; the experts' and router's biases
        softmax_type="learnable",  # the sinks
        window_size=127,  # sliding_window 128: the token and 127 before it
        window_attn_skip_freq=2,  # layer_types: sliding, full, sliding, full, ...
        rotary_base=150000,  # rope_theta
        rope_scaling="yarn",
        rope_scaling_factor=32.0,
        rope_original_max_position_embeddings=4096,
        rope_beta_fast=32.0,
        rope_beta_slow=1.0,
        rope_correction_range_round_to_int=False,  # truncate false
        activation="quick_geglu",
        activation_func_clamp_value=7.0,  # swiglu_limit
        glu_linear_offset=1.0,  # (up + 1) * glu
        num_moe_experts=num_experts,  # num_local_experts
        moe_router_topk=4,  # num_experts_per_tok
        moe_ffn_hidden_size=2880,
        moe_router_score_function="softmax",
        moe_router_pre_softmax=False,  # softmax over the top-4 logits
        # output_router_logits false: transformers fine-tunes it without a balancing loss.
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
    )


def gpt_oss_20b(seq_length: int = 4096) -> ModelConfig:
    """openai/gpt-oss-20b: 24 layers, 32 experts (20.9B parameters, 3.6B active)."""
    return _gpt_oss(num_layers=24, num_experts=32, seq_length=seq_length)


def gpt_oss_120b(seq_length: int = 4096) -> ModelConfig:
    """openai/gpt-oss-120b: 36 layers, 128 experts (116.8B parameters, 5.1B active)."""
    return _gpt_oss(num_layers=36, num_experts=128, seq_length=seq_length)
