"""Qwen3.5 / Qwen3.6 presets (dense and mixture of experts), numbers from Qwen's published
config.json (`text_config` of Qwen3_5ForConditionalGeneration / Qwen3_5MoeForConditionalGeneration:
the language model; the vision tower is not trained here).

Both sizes share the hybrid layout: every fourth layer full attention (full_attention_interval 4)
with 256-channel heads, an output gate and RoPE on the first quarter of each head's channels
(partial_rotary_factor 0.25, rope_theta 1e7), the others Gated DeltaNet (16 query/key heads of
128, value heads of 128, a causal convolution of width 4); every RMSNorm but DeltaNet's gated one
scales by 1 + weight. Qwen3.6-27B and -35B-A3B publish the same numbers as their Qwen3.5 namesakes.
Plain functions returning `ModelConfig` (no torch: these sit on the one-second CLI path).
"""

from __future__ import annotations

from typing import Any

from config.schema import ModelConfig


def _hybrid(seq_length: int) -> dict[str, Any]:
    """What both published sizes set the same way (each config.json field in its comment)."""
    return dict(
        kv_channels=256,  # head_dim
        qk_layernorm=True,  # q_norm, k_norm
        layernorm_zero_centered_gamma=True,  # Qwen3_5RMSNorm: x * (1 + weight)
        attention_output_gate=True,  # attn_output_gate: q_proj holds [query; gate] per head
        experimental_attention_variant="gated_delta_net",
        linear_attention_freq=4,  # full_attention_interval / layer_types
        linear_conv_kernel_dim=4,  # linear_conv_kernel_dim
        linear_key_head_dim=128,  # linear_key_head_dim
        linear_value_head_dim=128,  # linear_value_head_dim
        linear_num_key_heads=16,  # linear_num_key_heads
        share_embeddings_and_output_weights=False,  # tie_word_embeddings: false
        # max_position_embeddings is 262144; training runs at a length a recipe chooses.
        seq_length=seq_length,
        vocab_size=248_320,  # vocab_size
        rotary_base=10_000_000,  # rope_parameters.rope_theta
        rotary_percent=0.25,  # rope_parameters.partial_rotary_factor
        normalization="RMSNorm",
        layernorm_epsilon=1e-6,  # rms_norm_eps
        activation="swiglu",  # hidden_act: silu, gated (gate_proj, up_proj)
        init_method_std=0.02,  # initializer_range
    )


def qwen3_5_27b(seq_length: int = 4096) -> ModelConfig:
    """Qwen/Qwen3.5-27B (and Qwen/Qwen3.6-27B) text_config: 64 layers (48 Gated DeltaNet, 16
    full attention), dense MLPs."""
    return ModelConfig(
        num_layers=64,  # num_hidden_layers
        hidden_size=5120,  # hidden_size
        ffn_hidden_size=17408,  # intermediate_size
        num_attention_heads=24,  # num_attention_heads
        num_query_groups=4,  # num_key_value_heads
        linear_num_value_heads=48,  # linear_num_value_heads
        **_hybrid(seq_length),
    )


def qwen3_5_35b_a3b(seq_length: int = 4096) -> ModelConfig:
    """Qwen/Qwen3.5-35B-A3B (and Qwen/Qwen3.6-35B-A3B) text_config: 40 layers (30 Gated
    DeltaNet, 10 full attention), every MLP MoE: 256 experts of 512, top 8 renormalised, plus one
    shared expert of 512 scaled by a sigmoid gate."""
    return ModelConfig(
        num_layers=40,  # num_hidden_layers
        hidden_size=2048,  # hidden_size
        ffn_hidden_size=512,  # no dense layer: set to the expert width, unused
        num_attention_heads=16,  # num_attention_heads
        num_query_groups=2,  # num_key_value_heads
        linear_num_value_heads=32,  # linear_num_value_heads
        num_moe_experts=256,  # num_experts
        moe_router_topk=8,  # num_experts_per_tok
        moe_ffn_hidden_size=512,  # moe_intermediate_size
        moe_shared_expert_intermediate_size=512,  # shared_expert_intermediate_size
        moe_shared_expert_gate=True,  # shared_expert_gate
        moe_router_score_function="softmax",  # top-k of the softmax, renormalised
        moe_router_pre_softmax=False,
        moe_aux_loss_coeff=1e-3,  # router_aux_loss_coef
        **_hybrid(seq_length),
    )
