"""Qwen3.5 mixture of experts (Qwen3_5MoeForCausalLM, and the language model of
Qwen3_5MoeForConditionalGeneration, the class of the published folders) <-> Megatron-Core's
GPTModel with Gated DeltaNet layers.

Attention, Gated DeltaNet, norms and RoPE as Qwen3.5 dense (models/hf/qwen3_5.py). Every layer's
MLP is MoE: a linear router (`mlp.gate`) whose softmax over all experts keeps the top k and
renormalises them (a softmax over the top-k logits: Megatron-Core's moe_router_pre_softmax
false), experts of `moe_intermediate_size`, and one shared expert (`shared_expert`, of
`shared_expert_intermediate_size`) whose output is scaled by sigmoid(`shared_expert_gate` x)
(Megatron-Core's moe_shared_expert_gate). The experts come per expert
(`mlp.experts.{e}.{gate,up,down}_proj`, what transformers saves) or fused as transformers holds
them in memory (`mlp.experts.gate_up_proj` [experts, 2 x ffn, hidden] as [gate; up],
`mlp.experts.down_proj` [experts, hidden, ffn]); the folder's names say which.
"""

from __future__ import annotations

from typing import Any

from config.schema import ModelConfig
from models.hf import gpt, qwen3_5
from models.hf.mapping import Node, tensor

ARCHITECTURE = "Qwen3_5MoeForCausalLM"


def to_model(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    text = qwen3_5.text_config(hf)
    if text.get("mlp_only_layers") or int(text.get("decoder_sparse_step", 1)) != 1:
        raise ValueError(
            "config.json mlp_only_layers / decoder_sparse_step: Qwen3.5-MoE is mapped with every "
            "layer MoE"
        )
    moe_ffn = int(text["moe_intermediate_size"])
    return ModelConfig(
        **qwen3_5.hybrid_fields(hf),
        ffn_hidden_size=moe_ffn,  # unused: no dense layer
        num_moe_experts=int(text["num_experts"]),
        moe_router_topk=int(text.get("num_experts_per_tok", 8)),
        moe_ffn_hidden_size=moe_ffn,
        moe_shared_expert_intermediate_size=int(text["shared_expert_intermediate_size"]),
        moe_shared_expert_gate=True,
        moe_router_score_function="softmax",
        moe_router_pre_softmax=False,
        moe_aux_loss_coeff=float(text.get("router_aux_loss_coef", 1e-3)),
    )


def to_hf(model: ModelConfig) -> dict[str, Any]:
    out = qwen3_5.hybrid_to_hf(model, ARCHITECTURE, "qwen3_5_moe_text")
    out.pop("intermediate_size")
    return out | {
        "num_experts": model.num_moe_experts,
        "num_experts_per_tok": model.moe_router_topk,
        "moe_intermediate_size": model.moe_ffn_hidden_size or model.ffn_hidden_size,
        "shared_expert_intermediate_size": model.moe_shared_expert_intermediate_size,
        "router_aux_loss_coef": model.moe_aux_loss_coeff,
    }


def matches(model: ModelConfig) -> bool:
    return (
        qwen3_5.hybrid(model)
        and bool(model.num_moe_experts)
        and model.moe_router_score_function == "softmax"
        and not model.moe_router_pre_softmax
        and bool(model.moe_shared_expert_intermediate_size)
        and model.moe_shared_expert_gate
        and not model.moe_first_k_dense_layers
        and not model.moe_router_enable_expert_bias
    )


def moe_layer(model: ModelConfig, names: set[str] | None, m: str, h: str) -> dict[str, Node]:
    """One MoE MLP: router, experts (per expert, or fused when the folder's names say so), the
    shared expert and its gate. Qwen3-Next's are the same (models/hf/qwen3_next.py)."""
    norm, experts = f"{h}.post_attention_layernorm.weight", f"{h}.mlp.experts"
    out = gpt.moe_mlp(model, m, norm, f"{h}.mlp.gate.weight", experts + ".{}")
    if names is not None and f"{experts}.gate_up_proj" in names:
        out[f"{m}.mlp.experts.experts.linear_fc1.weight"] = tensor(f"{experts}.gate_up_proj")
        out[f"{m}.mlp.experts.experts.linear_fc2.weight"] = tensor(f"{experts}.down_proj")
    out |= gpt.shared_experts(m, f"{h}.mlp.shared_expert")
    out[f"{m}.mlp.shared_experts.gate_weight"] = tensor(f"{h}.mlp.shared_expert_gate.weight")
    return out


def weights(
    model: ModelConfig,
    padded_vocab: int,
    names: set[str] | None = None,
    meg: str = "",
    hf: str = "model",
) -> dict[str, Node]:
    """`names`: the folder's tensor names (its prefix, and fused or per-expert experts)."""

    def mlp(i: int, m: str, h: str) -> dict[str, Node]:
        return moe_layer(model, names, m, h)

    return qwen3_5.hybrid_weights(model, padded_vocab, names, meg, mlp)


skipped = qwen3_5.skipped
