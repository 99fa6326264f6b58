"""DeepSeek-V3 preset, numbers from deepseek-ai/DeepSeek-V3's config.json and the technical report.

Plain functions returning `ModelConfig` (no torch: these sit on the one-second CLI path).
"""

from __future__ import annotations

from config.schema import ModelConfig


def deepseek_v3(seq_length: int = 4096) -> ModelConfig:
    """DeepSeek-V3 (671B parameters, 37B active; arXiv 2412.19437), trained here at 4K context.

    61 layers: the first 3 dense (ffn 18432), then MoE with 256 routed experts of ffn 2048, top-8
    with sigmoid scores, plus one always-on shared expert of 2048. Routing is node-limited (the 256
    experts in 8 groups, each token's experts from the best 4 groups, a group ranked by its 2 best
    scores), picks experts by score plus a per-expert bias (the aux-loss-free balancing, updated
    from the load) and weighs them by their renormalised scores times 2.5. Attention is
    multi-latent (MLA): 128 heads, queries through a rank-1536 bottleneck, keys and values through
    a rank-512 latent, each with an RMSNorm (q_a_layernorm, kv_a_layernorm: qk_layernorm), head
    dims 128 (no position) + 64 (RoPE) for queries/keys and 128 for values. One multi-token
    prediction (MTP) module predicts the token after next.

    RoPE is YaRN as the published config.json sets it (factor 40 over 4096 original positions,
    beta_fast 32, beta_slow 1, mscale and mscale_all_dim 1): the released weights are those after
    the context extension, and YaRN also changes the frequencies and the softmax scale within 4K,
    so fine-tuning them needs it. (Pretraining from scratch as the report did would use plain
    RoPE: rope_scaling=None.)
    """
    return ModelConfig(
        num_layers=61,  # num_hidden_layers
        hidden_size=7168,
        ffn_hidden_size=18432,  # intermediate_size, the 3 dense layers
        num_attention_heads=128,
        seq_length=seq_length,
        vocab_size=129_280,
        rotary_base=10_000,  # rope_theta
        # rope_scaling: {type yarn, factor 40, original_max_position_embeddings 4096, beta_fast 32,
        # beta_slow 1, mscale 1.0, mscale_all_dim 1.0}
        rope_scaling="yarn",
        rope_scaling_factor=40.0,
        rope_original_max_position_embeddings=4096,
        rope_beta_fast=32.0,
        rope_beta_slow=1.0,
        rope_mscale=1.0,
        rope_mscale_all_dim=1.0,
        layernorm_epsilon=1e-6,  # rms_norm_eps
        init_method_std=0.006,  # initializer_range
        # MLA (q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
        multi_latent_attention=True,
        qk_layernorm=True,  # q_a_layernorm and kv_a_layernorm
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_head_dim=128,
        qk_pos_emb_head_dim=64,
        v_head_dim=128,
        # MoE (n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts x 2048)
        num_moe_experts=256,
        moe_router_topk=8,
        moe_ffn_hidden_size=2048,
        moe_shared_expert_intermediate_size=2048,
        moe_first_k_dense_layers=3,  # first_k_dense_replace
        moe_router_score_function="sigmoid",  # scoring_func
        moe_router_enable_expert_bias=True,  # e_score_correction_bias (topk_method noaux_tc)
        moe_router_num_groups=8,  # n_group
        moe_router_group_topk=4,  # topk_group
        moe_router_topk_scaling_factor=2.5,  # routed_scaling_factor (norm_topk_prob true)
        # The report balances experts with a bias term and keeps only a tiny sequence-wise
        # auxiliary loss, alpha = 0.0001 (section 4.2).
        moe_router_load_balancing_type="seq_aux_loss",
        moe_aux_loss_coeff=1e-4,
        mtp_num_layers=1,  # num_nextn_predict_layers
    )
