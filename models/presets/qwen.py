"""Qwen3 presets (dense and mixture of experts), numbers from Qwen's published config.json.

Plain functions returning `ModelConfig` (no torch: these sit on the one-second CLI path).
"""

from __future__ import annotations

from config.schema import ModelConfig


def qwen3_30b_a3b(seq_length: int = 4096) -> ModelConfig:
    """Qwen/Qwen3-30B-A3B config.json: 30.5B parameters, 3.3B active per token.

    48 layers, all MoE (decoder_sparse_step 1, no mlp_only_layers): 128 experts of ffn 768, top-8
    with normalised softmax weights. Attention has 32 query heads of 128 (wider than hidden 2048 /
    32 = 64, hence kv_channels), 4 KV groups and a per-head RMSNorm on queries and keys.
    """
    return ModelConfig(
        num_layers=48,
        hidden_size=2048,
        # intermediate_size: the dense FFN width; unused because every layer is an MoE layer.
        ffn_hidden_size=6144,
        num_attention_heads=32,
        num_query_groups=4,  # num_key_value_heads
        kv_channels=128,  # head_dim
        qk_layernorm=True,
        seq_length=seq_length,
        vocab_size=151_936,
        rotary_base=1_000_000,  # rope_theta
        layernorm_epsilon=1e-6,  # rms_norm_eps
        init_method_std=0.02,  # initializer_range
        num_moe_experts=128,  # num_experts
        moe_router_topk=8,  # num_experts_per_tok
        moe_ffn_hidden_size=768,  # moe_intermediate_size
        moe_router_score_function="softmax",
        moe_aux_loss_coeff=1e-3,  # router_aux_loss_coef
    )


def qwen3_8b(seq_length: int = 4096) -> ModelConfig:
    """Qwen/Qwen3-8B config.json (Qwen3ForCausalLM): 8.2B parameters, 36 dense layers.

    Each number is the field of that config.json named in its comment; Megatron-LM's
    examples/post_training/modelopt/conf/Qwen/Qwen3-8B.sh sets the same ones (36 layers, hidden
    4096, ffn 12288, 32 heads, 8 query groups, kv_channels 128, qk-layernorm, rotary base 1e6,
    untied embeddings). Heads of 128 times 32 make exactly hidden 4096 here (unlike the 30B-A3B),
    so head_dim adds nothing but is spelled out. max_position_embeddings is 40960; pretraining
    runs at 4096 (the length Megatron-Bridge's Qwen3 recipes use), a training choice. No bias
    (attention_bias false), SiLU (hidden_act), no RoPE scaling (rope_scaling null), no sliding
    window (use_sliding_window false).
    """
    return ModelConfig(
        num_layers=36,  # num_hidden_layers
        hidden_size=4096,  # hidden_size
        ffn_hidden_size=12288,  # intermediate_size
        num_attention_heads=32,  # num_attention_heads
        num_query_groups=8,  # num_key_value_heads
        kv_channels=128,  # head_dim
        qk_layernorm=True,  # Qwen3 normalises each head's queries and keys (q_norm, k_norm)
        share_embeddings_and_output_weights=False,  # tie_word_embeddings: false
        seq_length=seq_length,
        vocab_size=151_936,  # vocab_size
        rotary_base=1_000_000,  # rope_theta
        normalization="RMSNorm",
        layernorm_epsilon=1e-6,  # rms_norm_eps
        activation="swiglu",  # hidden_act: silu, gated (gate_proj, up_proj)
        init_method_std=0.02,  # initializer_range
    )
