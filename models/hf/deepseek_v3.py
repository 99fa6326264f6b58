"""DeepSeek-V3 (DeepseekV3ForCausalLM) <-> Megatron-Core's GPTModel with multi-latent attention.

Attention is MLA: queries through a low-rank bottleneck (`q_a_proj` -> `q_a_layernorm` ->
`q_b_proj`, or one `q_proj` without `q_lora_rank`), keys and values through a shared latent
(`kv_a_proj_with_mqa` gives the latent and the one RoPE key head, `kv_a_layernorm`, `kv_b_proj`
gives each head's no-RoPE key and value). The rows are laid out as Megatron-Core lays them out (per
head [no-RoPE; RoPE] for queries, [key; value] for kv_b_proj, [latent; RoPE key] for the down
projection), so every tensor maps as it is. DeepSeek's RoPE channels are interleaved pairs
(transformers' `rope_interleave`, true by default); Megatron-Core's MLA de-interleaves q_pe and k_pe
the same way, so a folder with rope_interleave false is refused.

MLP: the first `first_k_dense_replace` layers are dense; the others hold `n_routed_experts` experts
and `n_shared_experts` always-on ones (one MLP of n_shared x moe_intermediate_size). The router
(`mlp.gate`) scores experts with a sigmoid, picks the top k groups of experts by the sum of each
group's two best biased scores (`n_group`, `topk_group`), then the top k experts of those by biased
score (`e_score_correction_bias`: Megatron-Core's router expert_bias), weighs them by their unbiased
scores renormalised to sum to one, times `routed_scaling_factor`. Megatron-Core ranks a group by its
best topk / topk_group scores, so the two agree when that is 2 (DeepSeek-V3: 8 / 4); other values
and unrenormalised weights (norm_topk_prob false) are refused.

RoPE: plain, or YaRN (`rope_scaling` type yarn: the published checkpoints, factor 40 over 4096
positions). Multi-token prediction layers (the published `model.layers.61`) are mapped when the
folder holds them: transformers drops them, so a folder it saved has none.
"""

from __future__ import annotations

from typing import Any

from config.schema import ModelConfig
from models.hf import gpt
from models.hf.mapping import Node, tensor

ARCHITECTURE = "DeepseekV3ForCausalLM"


def _mtp_layers(hf: dict[str, Any], names: set[str]) -> int | None:
    """How many MTP layers the folder holds (`model.layers.{L + k}.eh_proj.weight`), None if none."""
    layers, count = hf["num_hidden_layers"], 0
    while f"model.layers.{layers + count}.eh_proj.weight" in names:
        count += 1
    return count or None


def _router(hf: dict[str, Any], topk: int, experts: int) -> dict[str, Any]:
    """The router's fields, refusing what Megatron-Core's sigmoid router computes differently."""
    scoring = hf.get("scoring_func", "sigmoid")
    if scoring != "sigmoid":
        raise ValueError(f"config.json scoring_func={scoring!r}: DeepSeek-V3 routes with sigmoid")
    method = hf.get("topk_method", "noaux_tc")
    if method != "noaux_tc":
        raise ValueError(
            f"config.json topk_method={method!r}: DeepSeek-V3's is noaux_tc (biased group top-k)"
        )
    if topk > 1 and not hf.get("norm_topk_prob", True):
        raise ValueError(
            "config.json norm_topk_prob=false: Megatron-Core's sigmoid router always renormalises "
            "the top-k weights"
        )
    groups, group_topk = int(hf.get("n_group") or 1), int(hf.get("topk_group") or 1)
    out: dict[str, Any] = {"moe_router_num_groups": None, "moe_router_group_topk": None}
    if groups > 1:
        if experts % groups or group_topk > groups:
            raise ValueError(
                f"config.json n_group={groups}, topk_group={group_topk}: n_group must divide "
                f"n_routed_experts={experts} and be at least topk_group"
            )
        if topk // group_topk != 2:
            # transformers ranks a group by its 2 best scores, Megatron-Core by topk // group_topk.
            raise ValueError(
                f"config.json num_experts_per_tok={topk}, topk_group={group_topk}: Megatron-Core "
                "ranks groups by their best num_experts_per_tok // topk_group scores, transformers "
                "by their best 2; these agree only when the quotient is 2"
            )
        out = {"moe_router_num_groups": groups, "moe_router_group_topk": group_topk}
    scale = float(hf.get("routed_scaling_factor", 1.0))
    out["moe_router_topk_scaling_factor"] = None if scale == 1.0 else scale
    return out


def to_model(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    gpt.silu(hf)
    if hf.get("attention_bias"):
        raise ValueError(
            "config.json attention_bias=true: biases on the attention projections only have no "
            "Megatron-Core equivalent"
        )
    if not hf.get("rope_interleave", True):
        raise ValueError(
            "config.json rope_interleave=false: Megatron-Core's MLA applies RoPE to interleaved "
            "channel pairs"
        )
    fields = gpt.rope(hf)
    gpt.yarn(hf, fields, "multi-latent attention")
    if not fields.get("rope_correction_range_round_to_int", True):
        raise ValueError(
            "config.json rope_scaling.truncate=false: Megatron-Core's YaRN in multi-latent "
            "attention rounds the correction range to whole dimensions"
        )
    experts = int(hf.get("n_routed_experts") or hf["num_local_experts"])
    topk = int(hf.get("num_experts_per_tok", 8))
    moe_ffn = hf["moe_intermediate_size"]
    shared = int(hf.get("n_shared_experts") or 0)
    return ModelConfig(
        num_layers=hf["num_hidden_layers"],
        hidden_size=hf["hidden_size"],
        ffn_hidden_size=hf["intermediate_size"],
        num_attention_heads=hf["num_attention_heads"],
        seq_length=min(int(hf.get("max_position_embeddings", 4096)), 4096),
        vocab_size=hf["vocab_size"],
        normalization="RMSNorm",
        layernorm_epsilon=float(hf.get("rms_norm_eps", 1e-6)),
        activation="swiglu",
        share_embeddings_and_output_weights=bool(hf.get("tie_word_embeddings", False)),
        init_method_std=float(hf.get("initializer_range", 0.02)),
        **fields,
        # MLA; q_a_layernorm and kv_a_layernorm are Megatron-Core's q_layernorm and kv_layernorm
        multi_latent_attention=True,
        qk_layernorm=True,
        q_lora_rank=hf.get("q_lora_rank"),
        kv_lora_rank=hf["kv_lora_rank"],
        qk_head_dim=hf["qk_nope_head_dim"],
        qk_pos_emb_head_dim=hf["qk_rope_head_dim"],
        v_head_dim=hf["v_head_dim"],
        # MoE
        num_moe_experts=experts,
        moe_router_topk=topk,
        moe_ffn_hidden_size=moe_ffn,
        moe_shared_expert_intermediate_size=shared * moe_ffn or None,
        moe_first_k_dense_layers=int(hf.get("first_k_dense_replace", 0)),
        moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True,  # e_score_correction_bias
        **_router(hf, topk, experts),
        # Training choices, as models/presets/deepseek.py takes them from the report.
        moe_router_load_balancing_type="seq_aux_loss",
        moe_aux_loss_coeff=1e-4,
        mtp_num_layers=_mtp_layers(hf, names),
    )


def to_hf(model: ModelConfig) -> dict[str, Any]:
    moe_ffn = model.moe_ffn_hidden_size or model.ffn_hidden_size
    shared = model.moe_shared_expert_intermediate_size or 0
    if shared % moe_ffn:
        raise ValueError(
            f"moe_shared_expert_intermediate_size={shared} is not a whole number of experts of "
            f"{moe_ffn} (n_shared_experts)"
        )
    positions = model.seq_length
    if model.rope_scaling == "yarn":
        positions = int(model.rope_original_max_position_embeddings * model.rope_scaling_factor)
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "deepseek_v3",
        "hidden_size": model.hidden_size,
        "intermediate_size": model.ffn_hidden_size,
        "moe_intermediate_size": moe_ffn,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_attention_heads,
        "q_lora_rank": model.q_lora_rank,
        "kv_lora_rank": model.kv_lora_rank,
        "qk_nope_head_dim": model.qk_head_dim,
        "qk_rope_head_dim": model.qk_pos_emb_head_dim,
        "v_head_dim": model.v_head_dim,
        "n_routed_experts": model.num_moe_experts,
        "n_shared_experts": shared // moe_ffn,
        "num_experts_per_tok": model.moe_router_topk,
        "first_k_dense_replace": model.moe_first_k_dense_layers,
        "n_group": model.moe_router_num_groups or 1,
        "topk_group": model.moe_router_group_topk or 1,
        "routed_scaling_factor": model.moe_router_topk_scaling_factor or 1.0,
        "norm_topk_prob": True,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "num_nextn_predict_layers": model.mtp_num_layers or 0,
        "vocab_size": model.vocab_size,
        "max_position_embeddings": positions,
        "rms_norm_eps": model.layernorm_epsilon,
        "hidden_act": "silu",
        "attention_bias": False,
        "rope_interleave": True,
        "tie_word_embeddings": model.share_embeddings_and_output_weights,
        "initializer_range": model.init_method_std,
        **gpt.rope_to_hf(model),
    }


def matches(model: ModelConfig) -> bool:
    return (
        model.arch == "gpt"
        and model.multi_latent_attention
        and bool(model.num_moe_experts)
        and model.moe_router_score_function == "sigmoid"
        and model.moe_router_enable_expert_bias
    )


def mla(model: ModelConfig, meg: str, hf: str) -> dict[str, Node]:
    """Multi-latent attention and its input norm. The latent norms under Transformer Engine's
    names (fused into the up projections); the local spec's q_layernorm / kv_layernorm are their
    aliases."""
    a, s = f"{hf}.self_attn", f"{meg}.self_attention"
    out: dict[str, Node] = {
        f"{meg}.input_layernorm.weight": tensor(f"{hf}.input_layernorm.weight"),
        f"{s}.linear_kv_down_proj.weight": tensor(f"{a}.kv_a_proj_with_mqa.weight"),
        f"{s}.linear_kv_up_proj.layer_norm_weight": tensor(f"{a}.kv_a_layernorm.weight"),
        f"{s}.linear_kv_up_proj.weight": tensor(f"{a}.kv_b_proj.weight"),
        f"{s}.linear_proj.weight": tensor(f"{a}.o_proj.weight"),
    }
    if model.q_lora_rank is None:
        out[f"{s}.linear_q_proj.weight"] = tensor(f"{a}.q_proj.weight")
    else:
        out[f"{s}.linear_q_down_proj.weight"] = tensor(f"{a}.q_a_proj.weight")
        out[f"{s}.linear_q_up_proj.layer_norm_weight"] = tensor(f"{a}.q_a_layernorm.weight")
        out[f"{s}.linear_q_up_proj.weight"] = tensor(f"{a}.q_b_proj.weight")
    return out


def moe(model: ModelConfig, meg: str, hf: str) -> dict[str, Node]:
    """A MoE layer: routed experts, the router's expert bias, the shared experts."""
    out = gpt.moe_mlp(
        model,
        meg,
        f"{hf}.post_attention_layernorm.weight",
        f"{hf}.mlp.gate.weight",
        f"{hf}.mlp.experts.{{}}",
    )
    out[f"{meg}.mlp.router.expert_bias"] = tensor(f"{hf}.mlp.gate.e_score_correction_bias")
    if model.moe_shared_expert_intermediate_size:
        out |= gpt.shared_experts(meg, f"{hf}.mlp.shared_experts")
    return out


def weights(
    model: ModelConfig,
    padded_vocab: int,
    names: set[str] | None = None,
    meg: str = "",
    hf: str = "model",
) -> dict[str, Node]:
    """`names`: the folder's tensor names (unused: the family has one spelling)."""

    def layer(i: int, m: str, h: str) -> dict[str, Node]:
        if i < model.moe_first_k_dense_layers:
            return mla(model, m, h) | gpt.dense_mlp(
                m, f"{h}.mlp", f"{h}.post_attention_layernorm.weight"
            )
        return mla(model, m, h) | moe(model, m, h)

    out = gpt.decoder(model, padded_vocab, meg, hf, layer)
    # Multi-token prediction: layer L + k of the folder. Its copies of the embedding and output
    # layer (embed_tokens, shared_head.head) are the main ones in Megatron-Core.
    for k in range(model.mtp_num_layers or 0):
        m, h = f"{meg}mtp.layers.{k}", f"{hf}.layers.{model.num_layers + k}"
        out |= {
            f"{m}.enorm.weight": tensor(f"{h}.enorm.weight"),
            f"{m}.hnorm.weight": tensor(f"{h}.hnorm.weight"),
            f"{m}.eh_proj.weight": tensor(f"{h}.eh_proj.weight"),
            f"{m}.final_layernorm.weight": tensor(f"{h}.shared_head.norm.weight"),
        }
        out |= mla(model, f"{m}.transformer_layer", h)
        out |= moe(model, f"{m}.transformer_layer", h)
    return out


def skipped(model: ModelConfig, name: str) -> bool:
    """The copies of the embedding and output layer in each MTP layer (`embed_tokens`,
    `shared_head.head`): Megatron-Core's MTP uses the main ones, so they are not read (an import
    keeps them aside for the export)."""
    layers = range(model.num_layers, model.num_layers + (model.mtp_num_layers or 0))
    return any(
        name
        in (f"model.layers.{i}.embed_tokens.weight", f"model.layers.{i}.shared_head.head.weight")
        for i in layers
    )
