"""DeepSeek-V3 preset, numbers from deepseek-ai/DeepSeek-V3's config.json and the technical report.

Plain functions returning `ModelConfig` (no torch: these sit on the one-second CLI path).
"""

from __future__ import annotations

from config.schema import ModelConfig


def deepseek_v3(seq_length: int = 4096) -> ModelConfig:
    """DeepSeek-V3 (671B parameters, 37B active; arXiv 2412.19437), pretrained at 4K context.

    61 layers: the first 3 dense (ffn 18432), then MoE with 256 routed experts of ffn 2048, top-8
    with sigmoid scores, plus one always-on shared expert of 2048. Attention is multi-latent (MLA):
    128 heads, queries through a rank-1536 bottleneck, keys and values through a rank-512 latent,
    head dims 128 (no position) + 64 (RoPE) for queries/keys and 128 for values. One multi-token
    prediction (MTP) module predicts the token after next.

    Not modelled here: node-limited routing (n_group 8, topk_group 4), the aux-loss-free expert
    bias and routed_scaling_factor 2.5 (the engine's concern), and YaRN, which only extends the
    context after pretraining.
    """
    return ModelConfig(
        num_layers=61,  # num_hidden_layers
        hidden_size=7168,
        ffn_hidden_size=18432,  # intermediate_size, the 3 dense layers
        num_attention_heads=128,
        seq_length=seq_length,
        vocab_size=129_280,
        rotary_base=10_000,  # rope_theta
        layernorm_epsilon=1e-6,  # rms_norm_eps
        init_method_std=0.006,  # initializer_range
        # MLA (q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
        multi_latent_attention=True,
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
        # The report balances experts with a bias term and keeps only a tiny sequence-wise
        # auxiliary loss, alpha = 0.0001 (section 4.2).
        moe_router_load_balancing_type="seq_aux_loss",
        moe_aux_loss_coeff=1e-4,
        mtp_num_layers=1,  # num_nextn_predict_layers
    )
