"""Mixtral (MixtralForCausalLM) <-> Megatron-Core's GPTModel with a mixture of experts.

Llama's attention; every layer's MLP is `num_local_experts` SwiGLU experts (`w1` gate, `w3` up,
`w2` down, each of `intermediate_size`) behind a linear router (`block_sparse_moe.gate`). The router
takes the softmax over all experts, keeps the top k and renormalises them to sum to one: the same
numbers as a softmax over the top k logits, which is Megatron-Core's default routing
(moe_router_pre_softmax false).
"""

from __future__ import annotations

from typing import Any

from config.schema import ModelConfig
from models.hf import gpt
from models.hf.mapping import Node

ARCHITECTURE = "MixtralForCausalLM"


def to_model(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    if hf.get("sliding_window") is not None:
        raise ValueError(
            f"config.json sliding_window={hf['sliding_window']}: sliding-window attention is not "
            "modelled here (Mixtral-8x7B and 8x22B publish null)"
        )
    fields = gpt.decoder_fields(hf)
    if fields.get("rope_scaling") is not None:
        raise ValueError(
            f"config.json rope scaling {fields['rope_scaling']!r}: Mixtral is modelled with plain "
            "RoPE"
        )
    topk = int(hf.get("num_experts_per_tok", 2))
    if topk == 1:
        # Renormalised top-1 weights are all 1; Megatron-Core refuses that softmax (zero gradient).
        raise ValueError(
            "config.json num_experts_per_tok=1: Megatron-Core's softmax router needs top-k > 1 "
            "without pre-softmax"
        )
    return ModelConfig(
        **fields,
        num_moe_experts=int(hf["num_local_experts"]),
        moe_router_topk=topk,
        moe_ffn_hidden_size=hf["intermediate_size"],
        moe_router_score_function="softmax",
        moe_router_pre_softmax=False,
        moe_aux_loss_coeff=float(hf.get("router_aux_loss_coef", 0.02)),
    )


def to_hf(model: ModelConfig) -> dict[str, Any]:
    return gpt.decoder_to_hf(model, ARCHITECTURE, "mixtral") | {
        "intermediate_size": model.moe_ffn_hidden_size or model.ffn_hidden_size,
        "num_local_experts": model.num_moe_experts,
        "num_experts_per_tok": model.moe_router_topk,
        "router_aux_loss_coef": model.moe_aux_loss_coeff,
        "sliding_window": None,
    }


def matches(model: ModelConfig) -> bool:
    return (
        gpt.softmax_moe(model)
        and not model.qk_layernorm
        and not model.moe_router_pre_softmax
        and not model.moe_first_k_dense_layers
    )


def weights(
    model: ModelConfig,
    padded_vocab: int,
    names: set[str] | None = None,
    meg: str = "",
    hf: str = "model",
) -> dict[str, Node]:
    """`names`: the folder's tensor names (unused: the family has one spelling)."""

    def layer(i: int, m: str, h: str) -> dict[str, Node]:
        moe = f"{h}.block_sparse_moe"
        return gpt.attention(model, m, h) | gpt.moe_mlp(
            model,
            m,
            f"{h}.post_attention_layernorm.weight",
            f"{moe}.gate.weight",
            f"{moe}.experts.{{}}",
            names=("w1", "w3", "w2"),
        )

    return gpt.decoder(model, padded_vocab, meg, hf, layer)
