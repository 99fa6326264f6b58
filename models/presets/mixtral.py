"""Mixtral architecture presets, numbers from Mistral AI's published config.json.

Plain functions returning `ModelConfig` (no torch: these sit on the one-second CLI path).
"""

from __future__ import annotations

from config.schema import ModelConfig


def mixtral_8x7b(seq_length: int = 4096) -> ModelConfig:
    """mistralai/Mixtral-8x7B-v0.1 config.json (and the Mixtral of Experts paper, arXiv 2401.04088).

    32 layers, hidden 4096, 32 heads with 8 KV groups, every layer a mixture of 8 SwiGLU experts of
    ffn 14336 with top-2 softmax routing; vocabulary 32000, RoPE base 1e6, untied embeddings.
    """
    return ModelConfig(
        num_layers=32,
        hidden_size=4096,
        ffn_hidden_size=14336,  # intermediate_size
        num_attention_heads=32,
        num_query_groups=8,  # num_key_value_heads
        seq_length=seq_length,
        vocab_size=32000,
        rotary_base=1_000_000,  # rope_theta
        layernorm_epsilon=1e-5,  # rms_norm_eps
        init_method_std=0.02,  # initializer_range
        num_moe_experts=8,  # num_local_experts
        moe_router_topk=2,  # num_experts_per_tok
        moe_ffn_hidden_size=14336,
        moe_router_score_function="softmax",
        moe_aux_loss_coeff=0.02,  # router_aux_loss_coef
    )
