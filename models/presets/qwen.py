"""Qwen2.5 and Qwen3 presets (dense and MoE), numbers from Qwen's published config.json.

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


def _qwen25(
    seq_length: int,
    *,
    layers: int,
    hidden: int,
    ffn: int,
    heads: int,
    groups: int,
    vocab: int,
    tied: bool,
    eps: float,
) -> ModelConfig:
    """What every Qwen2.5 size shares (Qwen2ForCausalLM): RMSNorm, SwiGLU, GQA, RoPE base 1e6, a
    bias on q, k and v only (add_qkv_bias), no QK norm, heads of hidden / heads (128 or 64)."""
    return ModelConfig(
        num_layers=layers,  # num_hidden_layers
        hidden_size=hidden,  # hidden_size
        ffn_hidden_size=ffn,  # intermediate_size
        num_attention_heads=heads,  # num_attention_heads
        num_query_groups=groups,  # num_key_value_heads
        add_qkv_bias=True,  # Qwen2's q_proj/k_proj/v_proj carry a bias; o_proj and the MLP none
        share_embeddings_and_output_weights=tied,  # tie_word_embeddings
        seq_length=seq_length,
        vocab_size=vocab,  # vocab_size
        rotary_base=1_000_000,  # rope_theta
        normalization="RMSNorm",
        layernorm_epsilon=eps,  # rms_norm_eps
        activation="swiglu",  # hidden_act: silu, gated
        init_method_std=0.02,  # initializer_range
    )


# Qwen/Qwen2.5-<size> config.json (the base models; each -Instruct has the same shapes). The
# 14B, 32B and 72B base models publish rms_norm_eps 1e-5, and some -Instruct folders 1e-6
# (Qwen2.5-32B-Instruct): with such a folder, `recipes check` names model.layernorm_epsilon and
# both values (set it, or take model=<folder>).
def qwen25_0p5b(seq_length: int = 4096) -> ModelConfig:
    """Qwen/Qwen2.5-0.5B: 0.49B parameters, 24 layers, 14 heads of 64, tied embeddings."""
    return _qwen25(
        seq_length, layers=24, hidden=896, ffn=4864, heads=14, groups=2, vocab=151_936,
        tied=True, eps=1e-6,
    )  # fmt: skip


def qwen25_1p5b(seq_length: int = 4096) -> ModelConfig:
    """Qwen/Qwen2.5-1.5B: 1.54B parameters, 28 layers, 12 heads of 128, tied embeddings."""
    return _qwen25(
        seq_length, layers=28, hidden=1536, ffn=8960, heads=12, groups=2, vocab=151_936,
        tied=True, eps=1e-6,
    )  # fmt: skip


def qwen25_7b(seq_length: int = 4096) -> ModelConfig:
    """Qwen/Qwen2.5-7B: 7.61B parameters, 28 layers, 28 heads of 128 in 4 KV groups."""
    return _qwen25(
        seq_length, layers=28, hidden=3584, ffn=18944, heads=28, groups=4, vocab=152_064,
        tied=False, eps=1e-6,
    )  # fmt: skip


def qwen25_14b(seq_length: int = 4096) -> ModelConfig:
    """Qwen/Qwen2.5-14B: 14.7B parameters, 48 layers, 40 heads of 128 in 8 KV groups."""
    return _qwen25(
        seq_length, layers=48, hidden=5120, ffn=13824, heads=40, groups=8, vocab=152_064,
        tied=False, eps=1e-5,
    )  # fmt: skip


def qwen25_32b(seq_length: int = 4096) -> ModelConfig:
    """Qwen/Qwen2.5-32B: 32.5B parameters, 64 layers, 40 heads of 128 in 8 KV groups."""
    return _qwen25(
        seq_length, layers=64, hidden=5120, ffn=27648, heads=40, groups=8, vocab=152_064,
        tied=False, eps=1e-5,
    )  # fmt: skip


def qwen25_72b(seq_length: int = 4096) -> ModelConfig:
    """Qwen/Qwen2.5-72B: 72.7B parameters, 80 layers, 64 heads of 128 in 8 KV groups."""
    return _qwen25(
        seq_length, layers=80, hidden=8192, ffn=29568, heads=64, groups=8, vocab=152_064,
        tied=False, eps=1e-5,
    )  # fmt: skip
